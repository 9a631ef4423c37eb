"""Opening a metadata store from its URI (API.md "Metadata service URI").

``etcd://HOST:PORT[,HOST:PORT...]/PREFIX`` -- a real etcd v3 (prefix defaults to ``aiobk``).
``memory://NAME`` -- in process, shared by everything in this process using the same NAME.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from metadata.kv_memory import MemoryKV
from metadata.store import MetadataStore


class MetadataURIError(ValueError):
    """A metadata URI aiobk cannot use."""


DEFAULT_TIMEOUT = 5.0  # seconds per metadata call; a down etcd is reported within this


def parse_etcd_endpoints(netloc: str) -> list[tuple[str, int]]:
    endpoints = []
    for part in netloc.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise MetadataURIError(f"etcd endpoint {part!r} is not HOST:PORT")
        endpoints.append((host, int(port)))
    return endpoints


def open_store(uri: str, *, timeout: float = DEFAULT_TIMEOUT) -> MetadataStore:
    """A store for ``uri``. No I/O happens until the first call (etcd connects lazily)."""
    if uri.startswith("memory://"):
        name = uri[len("memory://") :].strip("/")
        if not name:
            raise MetadataURIError("memory:// needs a name, e.g. memory://test")
        return MetadataStore(MemoryKV.shared(name), "aiobk", uri)
    if uri.startswith("etcd://"):
        from metadata.kv_etcd import EtcdKV  # noqa: PLC0415 - grpc loads only for etcd URIs

        parts = urlsplit(uri)
        if not parts.netloc:
            raise MetadataURIError(f"{uri!r} names no etcd endpoint")
        endpoints = parse_etcd_endpoints(parts.netloc)
        prefix = parts.path.strip("/") or "aiobk"
        return MetadataStore(EtcdKV(endpoints, timeout), prefix, uri)
    raise MetadataURIError(
        f"unsupported metadata URI {uri!r}: use etcd://HOST:PORT/PREFIX or memory://NAME"
    )
