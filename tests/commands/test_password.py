"""A wrong or missing password on a command that reads ledgers says which option to use."""

from __future__ import annotations

from aiobk.client import BookKeeper
from tests.support.cli import aiobk
from tests.support.cluster import Cluster


async def test_a_wrong_password_names_the_option(etcd_cluster: Cluster) -> None:
    uri = etcd_cluster.uri
    async with BookKeeper(uri) as bk:
        async with await bk.create_ledger(password=b"secret") as ledger:
            await ledger.append(b"x")
        writer = await bk.open_log_writer("guarded", password=b"secret")
        at = await writer.append(b"y")
        await writer.close()
    for args, ledger_id in (
        (("ledger", "read", str(ledger.ledger_id)), ledger.ledger_id),
        (("ledger", "recover", str(ledger.ledger_id)), ledger.ledger_id),
        (("log", "tail", "guarded"), at.ledger_id),
    ):
        missing = await aiobk(*args, "--metadata", uri)
        assert (missing.returncode, missing.stderr) == (
            1,
            f"aiobk: error: wrong password for ledger {ledger_id}: give the ledger's password "
            "with --password\n",
        ), args
        wrong = await aiobk(*args, "--password", "guess", "--metadata", uri)
        assert (wrong.returncode, wrong.stderr) == (
            1,
            f"aiobk: error: wrong password for ledger {ledger_id}: the --password given is "
            "not the ledger's\n",
        ), args
        right = await aiobk(*args, "--password", "secret", "--metadata", uri)
        assert right.returncode == 0, right.stderr
