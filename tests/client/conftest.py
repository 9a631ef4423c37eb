"""Fixtures for client component tests: fake bookies, a memory store, clients wired to both."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aiobk.client import BookKeeper, ClientConfig, ProtocolSwitches
from aiobk.metadata import (
    BookieServiceInfo,
    MemoryKV,
    MetadataStore,
    Registration,
    open_store,
)
from tests.client.fakes import FakeBookie, FakeNetwork
from tests.support.cluster import Cluster, forget, start_cluster
from tests.support.names import unique_name


@dataclass
class FakeWorld:
    network: FakeNetwork
    store: MetadataStore
    name: str
    clients: list[BookKeeper] = field(default_factory=list)
    registrations: list[Registration] = field(default_factory=list)

    async def bookie(self, bookie_id: str) -> FakeBookie:
        fake = self.network.add(bookie_id)
        info = BookieServiceInfo(bookie_id, bookie_id)
        self.registrations.append(await self.store.register_bookie(info, ttl=3600))
        return fake

    async def bookies(self, count: int, first_port: int = 9001) -> list[FakeBookie]:
        return [await self.bookie(f"127.0.0.1:{first_port + i}") for i in range(count)]

    async def client(self, seed: int = 1, **settings: Any) -> BookKeeper:
        switches = settings.pop("switches", ProtocolSwitches())
        config = ClientConfig(
            add_timeout=settings.pop("add_timeout", 30.0),
            read_timeout=settings.pop("read_timeout", 30.0),
            switches=switches,
            **settings,
        )
        bk = await BookKeeper.connect(
            self.store, config, rng=random.Random(seed), connector=self.network
        )
        self.clients.append(bk)
        return bk


@pytest.fixture
async def world() -> AsyncIterator[FakeWorld]:
    name = unique_name("fake")
    world = FakeWorld(FakeNetwork(), open_store(f"memory://{name}"), name)
    yield world
    for bk in world.clients:
        await bk.close()
    for registration in world.registrations:
        await registration.close()
    await world.store.close()
    MemoryKV.forget(name)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Three real bookies in process on loopback, with a memory:// metadata store."""
    cluster = await start_cluster(tmp_path, 3)
    yield cluster
    await cluster.stop()
    forget(cluster)
