"""What the autorecovery tests check again and again: copies on every bookie a write set names,
and which ledgers still name a bookie; and the settings that make a real cluster notice a lost
bookie and replicate its copies within a test's seconds."""

from __future__ import annotations

from aiobk.autorecovery.fragments import bookies_named
from aiobk.client import BookKeeper
from aiobk.client.entry_read import ask
from aiobk.metadata import MetadataStore, write_set
from aiobk.protocol import StatusCode

FAST = {
    "registration_ttl": 1.0,
    "lost_bookie_recovery_delay": 0.5,
    "autorecovery_lease_ttl": 2.0,
    "autorecovery_poll_interval": 0.2,
    "rereplication_retry_delay": 0.2,
    "open_ledger_rereplication_grace_period": 1.0,
}


async def assert_copies(bk: BookKeeper, ledger_id: int, *, read_back: bool = True) -> None:
    """Every entry of the closed ledger is on every bookie its fragment's write set names (a
    plain READ to each), and the ledger reads back through the client."""
    metadata = await bk.store.read_ledger(ledger_id)
    last = metadata.last_entry_id
    assert last is not None
    for entry_id in range(last + 1):
        fragment = metadata.fragment_for(entry_id)
        for slot in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum):
            response = await ask(bk.pool, fragment.ensemble[slot], ledger_id, entry_id, 5.0)
            assert response.status is StatusCode.EOK, (ledger_id, entry_id, fragment.ensemble)
    if read_back:
        rh = await bk.open_ledger(ledger_id, recovery=False)
        assert len(await rh.read(0, last)) == last + 1


async def ledgers_naming(store: MetadataStore, bookie_id: str) -> list[int]:
    """The ledgers whose ensembles still name ``bookie_id``."""
    return [
        ledger_id
        async for ledger_id, metadata in store.scan_ledgers()
        if metadata is not None and bookie_id in bookies_named(metadata)
    ]
