"""Object storage for offloaded ledgers: the store seam and its backends.

A closed ledger can be copied whole into an object store (a directory, or any S3-compatible
store) and its bookies' copies released; its readers then read the object. This layer sits
above the metadata (an offloaded ledger's metadata names its object) and below the client,
the bookie and the pipeline, which read objects through it.

- ``ObjectStore``: the seam every backend implements (tiered/store.py), and ``Upload``, what an
  interrupted upload leaves behind.
- ``MemoryObjectStore``: the store in memory (tiered/memory.py).
- ``OffloadRef``, ``object_key``, ``write_object``, ``ObjectReader``, ``verify_object``: one
  ledger's object (format in protocol/offload_object.py) written as a stream, its entries read
  back in bounded requests, and the whole object checked (tiered/objects.py).
- ``open_object_store``: the store a URL names, a ``DirectoryStore`` (``file:///DIR``,
  tiered/file.py) or an ``S3ObjectStore`` (``s3://BUCKET/PREFIX?endpoint=URL&region=R``,
  tiered/s3.py); ``redact``, a URL without its secrets; ``StoreCache``, one open store per URL
  (tiered/open.py).
"""

from aiobk.tiered.file import DirectoryStore
from aiobk.tiered.memory import MemoryObjectStore
from aiobk.tiered.objects import (
    DEFAULT_MAX_READ_BYTES,
    ObjectReader,
    OffloadRef,
    object_key,
    verify_object,
    write_object,
)
from aiobk.tiered.open import StoreCache, open_object_store, redact
from aiobk.tiered.s3 import S3ObjectStore
from aiobk.tiered.store import ObjectStore, Upload

__all__ = [
    "MemoryObjectStore",
    "ObjectStore",
    "Upload",
    "DEFAULT_MAX_READ_BYTES",
    "ObjectReader",
    "OffloadRef",
    "object_key",
    "verify_object",
    "write_object",
    "DirectoryStore",
    "S3ObjectStore",
    "StoreCache",
    "open_object_store",
    "redact",
]
