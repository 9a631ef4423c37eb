"""The cluster's key-request secret as a bookie knows it (``bookie.ops.ledger_key``): read
from the metadata store once a replication worker has made it, and kept.

While it does not exist the store is asked at most every ``SECRET_RECHECK`` seconds, one read
at a time: a peer sending key requests by the thousand costs etcd nothing more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiobk.metadata import MetadataStore

SECRET_RECHECK = 5.0  # seconds between store reads while the cluster secret does not exist


class ClusterSecret:
    """The secret once read (``value``), and when the store may be asked again."""

    def __init__(self, metadata: Callable[[], MetadataStore | None]) -> None:
        """``metadata``: the bookie's store (None: it has none, or not yet)."""
        self._metadata = metadata
        self.value: bytes | None = None  # the cluster's, once read
        self.recheck_at = 0.0  # loop time the store may be asked again while it is absent
        self._lock = asyncio.Lock()

    async def read(self) -> bytes | None:
        """The secret; None while no replication worker has made it, or without a store."""
        loop = asyncio.get_running_loop()
        async with self._lock:  # one read at a time: the others wait for its answer
            store = self._metadata()
            if self.value is None and store is not None and loop.time() >= self.recheck_at:
                self.value = await store.autorecovery.cluster_secret()
                self.recheck_at = loop.time() + SECRET_RECHECK
        return self.value


__all__ = ["SECRET_RECHECK", "ClusterSecret"]
