"""Reading a node's Prometheus metrics in tests: :func:`scrape` returns every sample of
``/metrics`` as ``{"name{labels}": value}`` (labels as the exposition format sorts them)."""

from __future__ import annotations

import re
import urllib.request


def scrape(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as reply:
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples
