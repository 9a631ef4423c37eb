"""What a bookie's boot-time repair (BP-46 phase two) needs from a client, loaded by the bookie at
run time (``bookie`` never imports ``client``): recover a ledger knowing only its master key, and
fetch an entry's stored bytes from the other bookies of its write set.
"""

from __future__ import annotations

import random

from aiobk.client.config import ClientConfig
from aiobk.client.context import ClientContext
from aiobk.client.digest import Digester
from aiobk.client.entry_read import ask, verified
from aiobk.client.net import Connector
from aiobk.client.pool import BookiePool
from aiobk.client.quorum import write_set
from aiobk.client.recovery import LedgerRecovery
from aiobk.metadata import LedgerMetadata, MetadataStore
from aiobk.protocol import (
    DigestType,
    StatusCode,
)
from aiobk.protocol.errors import BKError, DigestMismatchError, UnauthorizedError


class BookieRepairer:
    def __init__(
        self,
        store: MetadataStore,
        bookie_id: str,
        config: ClientConfig | None = None,
        *,
        connector: Connector | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._store = store
        self._bookie_id = bookie_id
        self._config = config = config or ClientConfig()
        self._pool = BookiePool(store, config, connector)
        self._ctx = ClientContext.build(store, self._pool, config, rng or random.Random())

    @staticmethod
    def can_recover(metadata: LedgerMetadata) -> bool:
        """Recovery re-signs write-backs: impossible for a MAC digest without the password."""
        return metadata.digest_type is not DigestType.MAC

    async def recover(self, ledger_id: int, master_key: bytes) -> LedgerMetadata:
        metadata = await self._store.read_ledger(ledger_id)
        if metadata.is_closed:
            return metadata
        if not self.can_recover(metadata):
            raise UnauthorizedError(f"ledger {ledger_id} uses a MAC digest: needs its password")
        recovery = LedgerRecovery(
            self._ctx,
            ledger_id=ledger_id,
            master_key=master_key,
            digest=Digester(metadata.digest_type),
        )
        return await recovery.run(metadata)

    async def fetch(self, metadata: LedgerMetadata, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry's body from another bookie of its write set (checked when the digest allows
        it without a password), or None when none of them has a good copy."""
        fragment = metadata.fragment_for(entry_id)
        digest = Digester(metadata.digest_type)
        for slot in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum):
            bookie = fragment.ensemble[slot]
            if bookie == self._bookie_id:
                continue
            try:
                response = await ask(
                    self._pool, bookie, ledger_id, entry_id, self._config.read_timeout
                )
            except BKError:
                continue
            body = response.body
            if response.status is not StatusCode.EOK or body is None:
                continue
            if self.can_recover(metadata):
                try:
                    verified(body, digest, ledger_id, entry_id, bookie)
                except DigestMismatchError:
                    continue
            return body
        return None

    async def close(self) -> None:
        await self._pool.close()
