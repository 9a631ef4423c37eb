"""A cluster of real bookies on loopback for client tests (in process, or as processes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiobk.bookie import Bookie, BookieConfig
from aiobk.metadata import MemoryKV, MetadataStore, open_store
from aiobk.runner import make_bookie
from tests.support.names import unique_name
from tests.support.procs import HOST_DISK_SETTINGS


@dataclass
class Cluster:
    root: Path
    uri: str
    bookies: list[Bookie] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def store(self) -> MetadataStore:
        return open_store(self.uri)

    async def add_bookie(self, **settings: Any) -> Bookie:
        index = len(self.bookies)
        while (self.root / f"bookie{index}").exists():  # a bookie removed from the list
            index += 1
        config = BookieConfig.from_mapping(  # autorecovery's settings given flat, as flags are
            {},
            data_dir=str(self.root / f"bookie{index}"),
            port=settings.pop("port", 0),
            metadata_uri=self.uri,
            **{**HOST_DISK_SETTINGS, **self.settings, **settings},
        )
        bookie = make_bookie(config)  # as the wiring builds it: with the repairer
        await bookie.start()
        self.bookies.append(bookie)
        return bookie

    def by_id(self, bookie_id: str) -> Bookie:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    async def restart(self, bookie: Bookie) -> Bookie:
        """Start a stopped or crashed bookie again on the same port and directories."""
        config = bookie.config.with_changes(port=bookie.address.port)
        fresh = make_bookie(config)
        await fresh.start()
        self.bookies[self.bookies.index(bookie)] = fresh
        return fresh

    async def stop(self) -> None:
        await stop_all(self.bookies)


async def stop_all(bookies: list[Bookie]) -> None:
    """Stop every bookie, although one fails to; raise the first failure after the last stop
    (a bookie left serving would outlive its test)."""
    failures: list[Exception] = []
    for bookie in bookies:
        try:
            await bookie.stop()
        except Exception as exc:
            failures.append(exc)
    if failures:
        raise failures[0]


async def start_cluster(
    root: Path, count: int = 3, uri: str | None = None, **settings: Any
) -> Cluster:
    cluster = Cluster(root, uri or f"memory://{unique_name('cluster')}", settings=settings)
    for _ in range(count):
        await cluster.add_bookie()
    return cluster


def forget(cluster: Cluster) -> None:
    if cluster.uri.startswith("memory://"):
        MemoryKV.forget(cluster.uri[len("memory://") :])
