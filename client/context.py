"""What the client's operations share: one value instead of the same five arguments to every
constructor (``BookKeeper`` builds it once; ``BookieRepairer`` builds its own)."""

from __future__ import annotations

import logging
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from aiobk.client.backpressure import AddBudget
from aiobk.client.config import ClientConfig
from aiobk.client.placement import Spread, choose_replacement, shortfall
from aiobk.client.pool import BookiePool
from aiobk.client.stats import ClientStats
from aiobk.metadata import MetadataStore

log = logging.getLogger(__name__)


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

    def replacement(
        self,
        candidates: Sequence[str],
        ensemble: Sequence[str],
        exclude: Collection[str],
        slot: int,
        write_quorum: int,
        what: str,
    ) -> str:
        """The bookie to take ``slot`` of ``ensemble`` (an ensemble change, a recovery's, a
        re-replicated copy), spread over racks as the client's settings ask."""
        spread = self.pool.spread()
        chosen = choose_replacement(
            candidates,
            ensemble,
            exclude,
            self.rng,
            slot=slot,
            write_quorum=write_quorum,
            spread=spread,
        )
        placed = [*ensemble[:slot], chosen, *ensemble[slot + 1 :]]
        self.check_spread(placed, write_quorum, spread, what)
        return chosen

    def check_spread(
        self, ensemble: Sequence[str], write_quorum: int, spread: Spread | None, what: str
    ) -> None:
        """Count and log a placement short of the racks it should span (made anyway: the
        client does not enforce ``min_racks_per_write_quorum``, or the cluster lacks racks)."""
        if spread is None:
            return
        reason = shortfall(ensemble, write_quorum, spread)
        if reason is not None:
            self.stats.placement_short_of_racks += 1
            log.warning("%s: placed on too few racks: %s", what, reason)


__all__ = ["ClientContext"]
