"""The operators' commands of this tree beside the release: the garbage collection report asked
of a release bookie (which does not know the request), an explanation made from what the
release's auditor wrote and from its bookies' answers, and the release reading the auditor
status this tree writes (it has grown the auditor's settings)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest

from aiobk import BookKeeper
from aiobk.metadata import LOST_BOOKIE, PLACEMENT, AuditorStatus, open_store
from tests.compat.harness import Release
from tests.support.cli import aiobk_child
from tests.support.procs import BookieProcess

# The release's code, run by ``Release.python``: an auditor of the release elected under a
# lease that outlives the process (60 s), its status published, and a ledger marked.
RELEASE_AUDITOR = """
import asyncio
from aiobk.metadata import LOST_BOOKIE, AuditorStatus, open_store

async def main():
    async with open_store({uri!r}) as store:
        lease, _ttl = await store.kv.grant_lease(60)
        assert await store.autorecovery.elect("release-auditor", lease)
        await store.autorecovery.publish_status(
            AuditorStatus("release-auditor", {{}}, {{}}, 1000, 2000), lease
        )
        await store.autorecovery.mark({ledger_id}, [{bookie!r}], LOST_BOOKIE, 3000)

asyncio.run(main())
"""

RELEASE_READS_STATUS = """
import asyncio, json
from aiobk.metadata import open_store

async def main():
    async with open_store({uri!r}) as store:
        status = await store.autorecovery.read_status()
        print(json.dumps([status.auditor, status.lost_bookies, status.missing_bookies,
                          status.last_check, status.last_bookie_check]))

asyncio.run(main())
"""

RELEASE_READS_MARKS = """
import asyncio, json
from aiobk.metadata import open_store

async def main():
    async with open_store({uri!r}) as store:
        marks = [m async for m in store.autorecovery.marks()]
        print(json.dumps([[m.ledger_id, list(m.missing), list(m.reasons), list(m.lost)]
                          for m in marks]))

asyncio.run(main())
"""


@pytest.mark.timeout(90)
async def test_the_gc_report_of_a_release_bookie_is_one_clear_error(
    release: Release, release_bookies: Callable[..., Awaitable[list[BookieProcess]]]
) -> None:
    """The release answers the request it does not know with EBADREQ and keeps the
    connection; the command says so in one line, and a pass still runs and is reported."""
    (bookie,) = await release_bookies(1)
    host, port = bookie.address
    address = f"{host}:{port}"
    for flags in (("--report",), ("--report", "--json")):
        code, out, err = await aiobk_child("bookie", "gc", address, *flags)
        assert code == 1, err
        assert out == ""
        assert err.strip().splitlines() == [
            f"aiobk: error: {address} does not know the garbage collection report (a bookie "
            f"older than this command): `aiobk bookie gc {address}` without --report runs a "
            "pass"
        ], err
    code, out, err = await aiobk_child("bookie", "gc", address, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["report"] is None
    assert document["ledgers_deleted"] == 0
    code, out, err = await aiobk_child("bookie", "gc", address)
    assert code == 0, err
    assert out.splitlines()[-1] == f"{address}: no report (a bookie older than this command)"


@pytest.mark.timeout(90)
async def test_explain_reads_the_release_auditor_and_asks_the_release_bookies(
    release: Release,
    uri: str,
    release_bookies: Callable[..., Awaitable[list[BookieProcess]]],
    client: BookKeeper,
) -> None:
    """A status without the auditor's settings (the release publishes none) is explained
    with the defaults; the release bookies answer the copy probes (reads)."""
    await release_bookies(3)
    lh = await client.create_ledger(3, 3, 2)
    for i in range(10):
        await lh.append(b"entry %d" % i)
    await lh.close()
    back = lh.metadata.fragments[0].ensemble[0]
    release.python(RELEASE_AUDITOR.format(uri=uri, ledger_id=lh.ledger_id, bookie=back))
    code, out, err = await aiobk_child(
        "autorecovery", "explain", str(lh.ledger_id), "--json", "--metadata", uri
    )
    assert code == 0, err
    document = json.loads(out)
    assert document["status"] == "under-replicated"
    assert document["mark"] == {"missing": [back], "since": 3000, "reasons": ["lost-bookie"],
                                "lost": []}  # fmt: skip
    assert document["copies_checked"]
    assert set(document["fragments"][0]["copies"].values()) == {"held"}
    assert [b["kind"] for b in document["blockers"]] == ["bookie-back"]
    code, out, err = await aiobk_child("autorecovery", "status", "--json", "--metadata", uri)
    assert code == 0, err
    assert json.loads(out)["auditor"] == "release-auditor"


@pytest.mark.timeout(60)
async def test_the_release_reads_the_auditor_status_this_tree_writes(
    release: Release, uri: str
) -> None:
    async with open_store(uri) as store:
        lease, _ttl = await store.kv.grant_lease(60)
        assert await store.autorecovery.elect("head-auditor", lease)
        settings = {"open_ledger_rereplication_grace_period": 30.0}
        status = AuditorStatus("head-auditor", {"b1:1": 5}, {"b2:2": 6}, 7, 8, settings)
        await store.autorecovery.publish_status(status, lease)
        read = json.loads(release.python(RELEASE_READS_STATUS.format(uri=uri)))
        assert read == ["head-auditor", {"b1:1": 5}, {"b2:2": 6}, 7, 8]
        await store.kv.revoke_lease(lease)


@pytest.mark.timeout(60)
async def test_the_release_reads_a_placement_mark_this_tree_writes(
    release: Release, uri: str
) -> None:
    async with open_store(uri) as store:
        await store.autorecovery.mark(41, (), PLACEMENT, 9000)
        await store.autorecovery.mark(42, ["b1:1"], LOST_BOOKIE, 9000)
        await store.autorecovery.mark(42, (), PLACEMENT, 9001)
        read = json.loads(release.python(RELEASE_READS_MARKS.format(uri=uri)))
        assert read == [
            [41, [], [PLACEMENT], []],
            [42, ["b1:1"], [LOST_BOOKIE, PLACEMENT], []],
        ]
