"""What the log modules need of a client, as a structural type (``BookKeeper`` has it).

``append``, ``writer`` and ``reader`` type against this instead of importing
``BookKeeper``, which imports them: no import cycle, and each can be driven by anything that
opens, creates and deletes ledgers over a metadata store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from aiobk.client.config import ClientConfig
from aiobk.metadata import MetadataStore, OffloadRecord
from aiobk.protocol import Durability
from aiobk.protocol.entry import DigestType

if TYPE_CHECKING:
    from aiobk.client.ledger_handle import LedgerHandle
    from aiobk.client.read_handle import ReadHandle


class LedgerClient(Protocol):
    @property
    def store(self) -> MetadataStore: ...

    @property
    def config(self) -> ClientConfig: ...

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        *,
        password: bytes = b"",
        durability: Durability = Durability.PERSISTENT,
        custom_metadata: Mapping[str, bytes] | None = None,
        digest_type: DigestType | None = None,
    ) -> LedgerHandle: ...

    async def open_ledger(
        self, ledger_id: int, password: bytes = b"", recovery: bool = True
    ) -> ReadHandle: ...

    async def delete_ledger(
        self, ledger_id: int, password: bytes | None = None, *, force: bool = False
    ) -> None: ...

    async def forget_offload(self, ledger_id: int, record: OffloadRecord) -> None: ...


__all__ = ["LedgerClient"]
