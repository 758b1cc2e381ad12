"""Ontology sources: where the ontologies to load come from.

A source lists entries (a reference, the checksum of its bytes, and the IRI when the file
parses) and fetches bytes. :class:`DirectorySource` reads OWL/Turtle files from a directory
(change detection by checksum); :class:`OlsSource` reads an OLS-compatible HTTP API
(``/api/ontologies`` and each ontology's ``config.fileLocation``). A source that cannot be read
raises :class:`SourceError` naming the location; a file that does not parse is still listed
(its load task fails with the parser's message).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from runner.errors import OntologyError, SourceError
from runner.ontology.parse import FORMATS, checksum_of, parse_ontology_bytes

if TYPE_CHECKING:
    pass

log = logging.getLogger("latchwork.ontology")





@dataclass(frozen=True)
class SourceEntry:
    ref: str  # file path or download URL
    checksum: str
    iri: str | None  # None when the bytes do not parse as an ontology
    version: str = ""


class OntologySource(Protocol):
    def entries(self) -> list[SourceEntry]: ...

    def fetch(self, ref: str) -> bytes: ...


class _ParsedCache:
    """IRI and version per checksum, so an unchanged file is parsed once."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[str | None, str]] = {}

    def identify(self, data: bytes, name: str) -> tuple[str, str | None, str]:
        checksum = checksum_of(data)
        if checksum not in self._known:
            try:
                onto = parse_ontology_bytes(data, name)
                self._known[checksum] = (onto.iri, onto.version)
            except OntologyError:
                self._known[checksum] = (None, "")
        iri, version = self._known[checksum]
        return checksum, iri, version


class DirectorySource:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._parsed = _ParsedCache()

    def files(self) -> list[Path]:
        if not self.directory.is_dir():
            raise SourceError(f"ontology directory {self.directory} does not exist")
        return sorted(p for p in self.directory.rglob("*")
                      if p.is_file() and p.suffix.lower() in FORMATS)

    def fingerprint(self) -> dict[str, tuple[int, int]]:
        """Cheap change detection: size and mtime per file."""
        return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in self.files()}

    def entries(self) -> list[SourceEntry]:
        found = []
        for path in self.files():
            checksum, iri, version = self._parsed.identify(path.read_bytes(), path.name)
            found.append(SourceEntry(str(path), checksum, iri, version))
        return found

    def fetch(self, ref: str) -> bytes:
        try:
            return Path(ref).read_bytes()
        except OSError as exc:
            raise SourceError(f"cannot read {ref}: {exc}") from exc


class OlsSource:
    """An OLS-compatible API: ``GET {base}/api/ontologies`` lists ontologies whose
    ``config.fileLocation`` is downloaded (and hashed) to detect changes."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._parsed = _ParsedCache()

    def _get(self, url: str) -> bytes:
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                return bytes(response.read())
        except (urllib.error.URLError, OSError) as exc:
            raise SourceError(f"GET {url}: {exc}") from exc

    def entries(self) -> list[SourceEntry]:
        found = []
        url: str | None = f"{self.base_url}/api/ontologies?page=0&size=500"
        while url:
            try:
                page = json.loads(self._get(url))
                ontologies = page.get("_embedded", {}).get("ontologies", [])
            except (ValueError, AttributeError) as exc:
                raise SourceError(f"{url}: not an OLS ontology listing: {exc}") from exc
            for item in ontologies:
                location = (item.get("config") or {}).get("fileLocation")
                if not location:
                    log.warning("OLS ontology %s has no fileLocation; skipped",
                                item.get("ontologyId"))
                    continue
                checksum, iri, version = self._parsed.identify(self._get(location), location)
                found.append(SourceEntry(location, checksum, iri, version))
            url = (page.get("_links", {}).get("next") or {}).get("href")
        return found

    def fetch(self, ref: str) -> bytes:
        return self._get(ref)


def open_source(location: str) -> OntologySource:
    if location.startswith(("http://", "https://")):
        return OlsSource(location)
    return DirectorySource(location)


