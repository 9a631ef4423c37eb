"""What the client's operations share: one value instead of the same five arguments to every
constructor (``BookKeeper`` builds it once; ``BookieRepairer`` builds its own)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from aiobk.client.backpressure import AddBudget
from aiobk.client.config import ClientConfig
from aiobk.client.pool import BookiePool
from aiobk.client.stats import ClientStats
from aiobk.metadata import MetadataStore


@dataclass(frozen=True, slots=True)
class ClientContext:
    store: MetadataStore
    pool: BookiePool
    config: ClientConfig
    rng: random.Random  # placement's choices (seeded by the simulator)
    budget: AddBudget  # unfinished appends of every ledger this client writes (backpressure.py)
    stats: ClientStats  # the client's figures (client/stats.py)

    @classmethod
    def build(
        cls, store: MetadataStore, pool: BookiePool, config: ClientConfig, rng: random.Random
    ) -> ClientContext:
        budget = AddBudget(config.max_outstanding_adds, config.max_outstanding_bytes)
        return cls(store, pool, config, rng, budget, ClientStats())


__all__ = ["ClientContext"]
