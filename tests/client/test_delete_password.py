"""Deleting takes the password: a ledger, a log's truncation and a whole log, through
the client and through ``aiobk ledger|log``, on real bookies; a refusal changes nothing."""

from __future__ import annotations

import pytest

from aiobk.client import BookKeeper, LogPosition
from aiobk.client.errors import NoSuchLedgerError, NoSuchLogError, UnauthorizedError
from tests.support.cli import aiobk
from tests.support.cluster import Cluster

pytestmark = pytest.mark.timeout(120)


async def exists(bk: BookKeeper, ledger_id: int) -> bool:
    try:
        await bk.store.read_ledger(ledger_id)
    except NoSuchLedgerError:
        return False
    return True


async def test_a_ledger_is_deleted_only_with_its_password(etcd_cluster: Cluster) -> None:
    async with BookKeeper(etcd_cluster.uri) as bk:
        guarded = await bk.create_ledger(3, 3, 2, password=b"pw")
        await guarded.append(b"x")
        await guarded.close()
        lid = guarded.ledger_id
        with pytest.raises(UnauthorizedError, match="has a password"):
            await bk.delete_ledger(lid)
        with pytest.raises(UnauthorizedError, match="wrong password"):
            await bk.delete_ledger(lid, b"not it")
        assert await exists(bk, lid)
        await bk.delete_ledger(lid, b"pw")
        assert not await exists(bk, lid)

        forgotten = await bk.create_ledger(3, 3, 2, password=b"lost")
        await forgotten.close()
        await bk.delete_ledger(forgotten.ledger_id, force=True)  # an operator's delete
        assert not await exists(bk, forgotten.ledger_id)

        # A ledger created without a password needs none; a wrong one is still refused.
        plain = await bk.create_ledger(3, 3, 2)
        await plain.close()
        with pytest.raises(UnauthorizedError):
            await bk.delete_ledger(plain.ledger_id, b"made up")
        await bk.delete_ledger(plain.ledger_id)
        assert not await exists(bk, plain.ledger_id)


async def write_log(bk: BookKeeper, name: str, password: bytes) -> list[LogPosition]:
    """Records in three ledgers, one each (the writer rolls after every record; the log may
    end with an empty fourth)."""
    writer = await bk.open_log_writer(name, password=password, roll_bytes=1)
    positions = [await writer.append(b"%s-%d" % (name.encode(), i)) for i in range(3)]
    await writer.close()
    assert len({p.ledger_id for p in positions}) == 3
    return positions


async def test_truncating_and_deleting_a_log_take_its_password(etcd_cluster: Cluster) -> None:
    async with BookKeeper(etcd_cluster.uri) as bk:
        positions = await write_log(bk, "guarded", b"pw")
        ledgers = list((await bk.store.read_log("guarded")).ledgers)
        cut = positions[-1]  # the two ledgers before its own are wholly below it
        with pytest.raises(UnauthorizedError, match="has a password"):
            await bk.truncate_log("guarded", before=cut)
        with pytest.raises(UnauthorizedError):
            await bk.truncate_log("guarded", before=cut, password=b"wrong")
        # Refused before the log changed: it still names every ledger, all still there.
        assert list((await bk.store.read_log("guarded")).ledgers) == ledgers
        assert all([await exists(bk, lid) for lid in ledgers])
        assert await bk.truncate_log("guarded", before=cut, password=b"pw") == ledgers[:2]
        assert not await exists(bk, ledgers[0])

        with pytest.raises(UnauthorizedError):
            await bk.delete_log("guarded")
        assert list((await bk.store.read_log("guarded")).ledgers) == ledgers[2:]
        assert await bk.delete_log("guarded", b"pw") == ledgers[2:]
        with pytest.raises(NoSuchLogError):
            await bk.store.read_log("guarded")
        assert not await exists(bk, ledgers[2])

        await write_log(bk, "forgotten", b"lost")
        assert len(await bk.delete_log("forgotten", force=True)) >= 3


async def test_the_log_commands_take_the_password(etcd_cluster: Cluster) -> None:
    uri = etcd_cluster.uri
    async with BookKeeper(uri) as bk:
        positions = await write_log(bk, "orders", b"pw")
        ledgers = list((await bk.store.read_log("orders")).ledgers)
    cut = str(positions[-1])
    refused = await aiobk("log", "truncate", "orders", "--before", cut, "--metadata", uri)
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"aiobk: error: ledger {ledgers[0]} has a password")
    assert refused.stderr.count("\n") == 1
    wrong = await aiobk(
        "log", "truncate", "orders", "--before", cut, "--password", "no", "--metadata", uri
    )
    assert wrong.returncode == 1
    assert "wrong password" in wrong.stderr
    done = await aiobk(
        "log", "truncate", "orders", "--before", cut, "--password", "pw", "--metadata", uri
    )
    assert done.returncode == 0, done.stderr
    assert f"deleted ledgers {ledgers[0]}, {ledgers[1]}" in done.stdout
    refused = await aiobk("log", "delete", "orders", "--yes", "--metadata", uri)
    assert refused.returncode == 1
    assert "has a password" in refused.stderr
    operator = await aiobk(
        "log", "delete", "orders", "--yes", "--no-password-check", "--metadata", uri
    )
    assert operator.returncode == 0, operator.stderr
    async with BookKeeper(uri) as bk:
        with pytest.raises(NoSuchLogError):
            await bk.store.read_log("orders")
        assert not await exists(bk, ledgers[2])
