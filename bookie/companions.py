"""Services a bookie runs beside itself while it serves (autorecovery): each built from the
bookie's id and metadata store once it serves, and stopped, newest first, before the bookie
stops, so that none outlives the bookie it works for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from aiobk.metadata import MetadataStore


class Companion(Protocol):
    """A service running beside a bookie while it serves (autorecovery)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


# Builds a companion from the bookie's id and metadata store.
CompanionFactory = Callable[[str, MetadataStore], Companion]


class Companions:
    """The companions running now (iterating gives them, oldest first)."""

    def __init__(self, factories: Sequence[CompanionFactory]) -> None:
        self._factories = tuple(factories)
        self.running: list[Companion] = []

    def __iter__(self) -> Iterator[Companion]:
        return iter(self.running)

    async def start(self, bookie_id: str, store: MetadataStore) -> None:
        """Build and start each, in the order given."""
        for make in self._factories:
            companion = make(bookie_id, store)
            await companion.start()
            self.running.append(companion)

    async def stop(self) -> None:
        """Stop each, newest first."""
        companions, self.running = self.running, []
        for companion in reversed(companions):
            await companion.stop()


__all__ = ["Companion", "CompanionFactory", "Companions"]
