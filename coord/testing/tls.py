"""A throwaway certificate authority for TLS tests: CA, server and client certificates in PEM.

:meth:`Pki.create` writes, under one directory of the caller's, a CA (``ca.pem``), a server
certificate for 127.0.0.1 and localhost (``server.crt``, ``server.key`` and ``server.pem``,
key and chain in one file, as ZooKeeper's PEM key store wants it) and a client certificate
(``client.crt``, ``client.key``), all signed by that CA (trustme, through the cryptography
package: nothing is shelled out). ``stranger_*`` is a client certificate from another CA, which
a server that checks its clients must refuse. :class:`ServerTls` is what a server harness
(ZooKeeper, RabbitMQ) needs of them. Nothing here is meant for production.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    server_pem: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path

    @classmethod
    def create(cls, directory: Path, client_name: str = "latchwork-node") -> Pki:
        import trustme

        directory.mkdir(parents=True, exist_ok=True)
        # RSA keys: ZooKeeper's PEM reader knows RSA and DSA keys, not EC ones
        rsa = trustme.KeyType.RSA
        ca, other = trustme.CA(key_type=rsa), trustme.CA(key_type=rsa)
        server = ca.issue_cert("127.0.0.1", "localhost", key_type=rsa)
        client = ca.issue_cert(client_name, key_type=rsa)
        stranger = other.issue_cert(client_name, key_type=rsa)
        pki = cls(*(directory / name for name in (
            "ca.pem", "server.crt", "server.key", "server.pem", "client.crt", "client.key",
            "stranger.crt", "stranger.key")))
        ca.cert_pem.write_to_path(str(pki.ca))
        for issued, cert, key in ((server, pki.server_cert, pki.server_key),
                                  (client, pki.client_cert, pki.client_key),
                                  (stranger, pki.stranger_cert, pki.stranger_key)):
            key.write_bytes(_pkcs8(issued.private_key_pem.bytes()))
            cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
        pki.server_pem.write_bytes(pki.server_key.read_bytes() + pki.server_cert.read_bytes())
        for path in (pki.server_key, pki.server_pem, pki.client_key, pki.stranger_key):
            path.chmod(0o600)
        return pki


@dataclass(frozen=True)
class ServerTls:
    """A TLS client port: the server's key and chain (one PEM, and apart), the CA its clients'
    certificates must chain to, and the client certificate the readiness probe presents."""

    server_pem: Path
    server_cert: Path
    server_key: Path
    ca: Path
    probe_cert: Path
    probe_key: Path

    @classmethod
    def of(cls, pki: Pki) -> ServerTls:
        return cls(pki.server_pem, pki.server_cert, pki.server_key, pki.ca, pki.client_cert,
                   pki.client_key)

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.probe_cert), str(self.probe_key))
        return context


def _pkcs8(pem: bytes) -> bytes:
    """A PEM private key as PKCS#8 ("BEGIN PRIVATE KEY"), which ZooKeeper's PEM reader wants."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pem, password=None)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
