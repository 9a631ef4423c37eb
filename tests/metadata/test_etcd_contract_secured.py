"""The store's whole contract (``test_contract.py``, ``test_autorecovery_store.py``) on the
secured etcd: TLS with a client certificate, and a user whose role grants readwrite
on ``/secure/`` only, so every operation the store makes -- ledger ids, ledgers, logs, cookies,
bookie registrations under leases, watches, compaction, autorecovery's marks and claims -- is
shown to need nothing outside its prefix. Tokens idle out after 2 s, so the contract also runs
through token renewals (a test pausing for a lease to expire renews on its next call)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from aiobk.metadata import MetadataStore, open_store
from tests.metadata import test_autorecovery_store as autorecovery_contract
from tests.metadata import test_contract as contract
from tests.metadata.conftest import SecuredEtcd

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def store(secured_etcd: SecuredEtcd) -> AsyncIterator[MetadataStore]:
    """A fresh store under ``/secure/...``, as the role-limited app user (overrides the
    memory/etcd pair of ``tests/conftest.py`` for this module)."""
    opened = open_store(secured_etcd.uri())
    yield opened
    await opened.close()


# Collected here again, with the store above.
for _module in (contract, autorecovery_contract):
    for _name in dir(_module):
        if _name.startswith("test_"):
            globals()[_name] = getattr(_module, _name)
