"""Choosing bookies for an ensemble or a replacement, pure given the candidates and a seeded
random source (no global random: the simulator replays placement exactly)."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from aiobk.protocol.errors import NotEnoughBookiesError


def choose_ensemble(
    candidates: Sequence[str], size: int, exclude: Collection[str], rng: random.Random
) -> list[str]:
    """``size`` distinct bookies from ``candidates`` not in ``exclude``, in random order."""
    usable = sorted(set(candidates) - set(exclude))
    if len(usable) < size:
        raise NotEnoughBookiesError(
            f"need {size} writable bookies, have {len(usable)}"
            + (f" (excluding {len(set(exclude))} known bad or in use)" if exclude else "")
        )
    return rng.sample(usable, size)


def choose_replacement(
    candidates: Sequence[str], ensemble: Sequence[str], exclude: Collection[str], rng: random.Random
) -> str:
    """One bookie to take a failed one's slot: not in the ensemble, not known bad."""
    return choose_ensemble(candidates, 1, set(ensemble) | set(exclude), rng)[0]
