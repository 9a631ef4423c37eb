"""What a request handler (``bookie.ops``) may reach, and what it sees of its connection.

Handlers get a ``BookieContext`` -- storage, journal, ledger state, stats, config, flow control,
the writable state, and a few administrative actions -- never the whole ``Bookie``: the server
builds the context once and wires it, so ``ops`` depend on these parts and nothing imports the
server back (no import cycle among ``bookie/`` files).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiobk.bookie.config import BookieConfig
from aiobk.bookie.flow import FlowControl
from aiobk.bookie.gc import GcResult
from aiobk.bookie.journal.journal import Journal
from aiobk.bookie.key_check import KeyCheck
from aiobk.bookie.ledgers import Ledgers
from aiobk.bookie.stats import BookieStats
from aiobk.bookie.storage import LedgerStorage
from aiobk.bookie.write_state import WriteState
from aiobk.metadata import MetadataStore
from aiobk.protocol import Response


class Poll(Protocol):
    """A long poll waiting on a connection (``bookie.ops.read.LongPoll``)."""

    def cancel(self) -> None: ...


class Replier(Protocol):
    """The connection a request came in on (``bookie.connection.ServerConnection``)."""

    @property
    def closed(self) -> bool: ...

    @property
    def roles(self) -> frozenset[str]:
        """The peer's roles (``aiobk.protocol.roles``): from its verified client certificate
        when the bookie has ``tls_client_auth``; empty otherwise (no identity)."""
        ...

    @property
    def origin(self) -> object:
        """The connection itself (an ADD_BATCH's entries answer to the batch, whose origin is
        its connection): what per-connection bounds are keyed by."""
        ...

    def reply(self, response: Response) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    def reading(self) -> AbstractAsyncContextManager[None]: ...

    @property
    def long_polls(self) -> int: ...

    def poll_started(self, poll: Poll) -> None: ...

    def poll_ended(self, poll: Poll) -> None: ...


class BookieAdmin(Protocol):
    """The actions of the bookie as a whole that some requests ask for (the ``Bookie``)."""

    @property
    def bookie_id(self) -> str: ...

    @property
    def checkpoint_error(self) -> str | None: ...

    @property
    def running(self) -> bool: ...

    @property
    def metadata(self) -> MetadataStore | None:
        """The metadata store while the bookie runs (None: it has none, or is not running)."""
        ...

    async def checkpoint(self, release: bool = True) -> None: ...

    async def collect_garbage(self, forced: bool = False) -> GcResult: ...

    async def gc_report(self) -> dict[str, Any]: ...

    async def disk_usage(self) -> tuple[int, int]: ...

    def gauges(self) -> dict[str, int]: ...

    async def cluster_secret(self) -> bytes | None: ...

    def set_read_only(self, read_only: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class BookieContext:
    config: BookieConfig
    stats: BookieStats
    storage: LedgerStorage
    journal: Journal
    ledgers: Ledgers
    flow: FlowControl
    write_state: WriteState
    admin: BookieAdmin
    log_corruption: Callable[[Exception], None]
    # Whether a request may create a ledger's state here (no squatting on ledger ids).
    keys: KeyCheck = field(default_factory=KeyCheck)


# A handler may return how many requests' work it was (an ADD_BATCH: its entries), which the
# connection counts against its turn (``bookie.flow.FRAMES_PER_TURN``); None is one.
Handler = Callable[[BookieContext, Any, Replier], int | None]

__all__ = ["BookieAdmin", "BookieContext", "Handler", "Poll", "Replier"]
