"""``bookie.key_check`` -- who may create a ledger's state on a bookie -- against a
fake metadata store whose answers the test holds and releases: verdicts, arrival order, one
lookup per ledger, the bounds, the cache, a store that fails or hangs, trusted peers, the
replication worker's stand-in key. Real bookies and etcd: tests/hostile/test_key_attacks.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from aiobk.bookie.context import BookieContext
from aiobk.bookie.key_check import KeyCheck
from aiobk.bookie.ops.add import same_entry
from aiobk.bookie.stats import BookieStats
from aiobk.client import Digester
from aiobk.metadata import Fragment, LedgerMetadata
from aiobk.protocol import DigestType, StatusCode
from aiobk.protocol.errors import MetadataStoreError, NoSuchLedgerError
from aiobk.protocol.keys import (
    key_digest,
    legacy_password_digest,
    master_key,
    stand_in_key,
)
from aiobk.protocol.roles import BOOKIE, CLIENT
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(30)

SALT = b"s" * 16
KEY = master_key(b"pw")
JUNK = master_key(b"junk")
SECRET = b"cluster secret"
SALTED, LEGACY, ABSENT = 1, 2, 3


def _metadata(salt: bytes, digest: bytes) -> LedgerMetadata:
    return LedgerMetadata(
        1, 1, 1, (Fragment(0, ("b",)),), password_digest=digest, password_salt=salt
    )


class FakeStore:
    def __init__(self) -> None:
        self.ledgers = {
            SALTED: _metadata(SALT, key_digest(SALT, KEY)),
            LEGACY: _metadata(b"", legacy_password_digest(b"pw")),
        }
        self.gate: asyncio.Event | None = None
        self.failure: Exception | None = None
        self.reads: list[int] = []

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        self.reads.append(ledger_id)
        if self.gate is not None:
            await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        try:
            return self.ledgers[ledger_id]
        except KeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None


@dataclass
class FakeAdmin:
    metadata: FakeStore | None = field(default_factory=FakeStore)
    running: bool = True
    secret: bytes | None = SECRET
    secret_reads: int = 0

    async def cluster_secret(self) -> bytes | None:
        self.secret_reads += 1
        return self.secret


@dataclass
class FakeContext:
    admin: FakeAdmin = field(default_factory=FakeAdmin)
    stats: BookieStats = field(default_factory=BookieStats)


class Answers:
    """What each admitted request was told, in the order told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, StatusCode]] = []

    def then(self, name: str) -> Any:
        return lambda status: self.told.append((name, status))


def _ctx(fake: FakeContext) -> BookieContext:
    return cast(BookieContext, fake)


async def _settle(check: KeyCheck) -> None:
    for _ in range(50):
        if not check.lookups_pending:
            return
        await asyncio.sleep(0)
    raise AssertionError("lookups still in flight")


async def test_verdicts() -> None:
    fake = FakeContext()
    check = KeyCheck()
    answers = Answers()
    peer = object()
    for name, ledger, key in [
        ("right", SALTED, KEY),
        ("wrong", SALTED, JUNK),
        ("legacy", LEGACY, JUNK),  # a key cannot be checked against the legacy digest
        ("absent", ABSENT, KEY),
    ]:
        check.admit(_ctx(fake), ledger, key, peer, frozenset(), answers.then(name))
        await _settle(check)
    assert answers.told == [
        ("right", StatusCode.EOK),
        ("wrong", StatusCode.EUA),
        ("legacy", StatusCode.EOK),
        ("absent", StatusCode.ENOLEDGER),
    ]
    assert fake.stats.auth_failures == 1
    assert (check.stats.refused_key, check.stats.refused_absent) == (1, 1)


async def test_requests_of_one_ledger_wait_for_one_lookup_and_keep_their_order() -> None:
    fake = FakeContext()
    store = fake.admin.metadata
    assert store is not None
    store.gate = asyncio.Event()
    check = KeyCheck()
    answers = Answers()
    peer = object()
    for index in range(5):
        key = JUNK if index == 2 else KEY
        check.admit(_ctx(fake), SALTED, key, peer, frozenset(), answers.then(f"add{index}"))
    # A trusted peer's request, arriving meanwhile, waits its turn behind them too.
    check.admit(_ctx(fake), SALTED, JUNK, object(), frozenset({BOOKIE}), answers.then("bookie"))
    check.admit(_ctx(fake), SALTED, KEY, peer, frozenset(), answers.then("fence"), fence=True)
    await asyncio.sleep(0)
    assert answers.told == []
    assert store.reads == [SALTED]
    assert check.waiting == 7
    store.gate.set()
    await _settle(check)
    assert answers.told == [
        ("add0", StatusCode.EOK),
        ("add1", StatusCode.EOK),
        ("add2", StatusCode.EUA),
        ("add3", StatusCode.EOK),
        ("add4", StatusCode.EOK),
        ("bookie", StatusCode.EOK),
        ("fence", StatusCode.EOK),
    ]
    assert store.reads == [SALTED]
    assert check.waiting == 0


async def test_answers_for_ledgers_that_exist_are_cached_absent_ones_never() -> None:
    fake = FakeContext()
    store = fake.admin.metadata
    assert store is not None
    check = KeyCheck(cache_ttl=10.0, cache_size=2)
    answers = Answers()
    peer = object()
    check.admit(_ctx(fake), SALTED, KEY, peer, frozenset(), answers.then("first"))
    await _settle(check)
    check.admit(_ctx(fake), SALTED, JUNK, peer, frozenset(), answers.then("cached"))
    assert answers.told[-1] == ("cached", StatusCode.EUA)  # at once, from the cache
    assert store.reads == [SALTED]
    assert check.stats.cache_hits == 1
    for _ in range(2):
        check.admit(_ctx(fake), ABSENT, KEY, peer, frozenset(), answers.then("absent"))
        await _settle(check)
    assert store.reads == [SALTED, ABSENT, ABSENT]  # created any moment: asked every time
    # Bounded: an LRU of cache_size.
    for ledger in range(100, 110):
        store.ledgers[ledger] = _metadata(SALT, key_digest(SALT, KEY))
        check.admit(_ctx(fake), ledger, KEY, peer, frozenset(), answers.then("many"))
        await _settle(check)
    assert check.cached == 2


async def test_cached_answers_expire() -> None:
    fake = FakeContext()
    store = fake.admin.metadata
    assert store is not None
    check = KeyCheck(cache_ttl=0.05)
    answers = Answers()
    check.admit(_ctx(fake), SALTED, KEY, object(), frozenset(), answers.then("a"))
    await _settle(check)
    await asyncio.sleep(0.1)  # the cache's TTL must pass: time is what expires an answer
    check.admit(_ctx(fake), SALTED, KEY, object(), frozenset(), answers.then("b"))
    await _settle(check)
    assert store.reads == [SALTED, SALTED]


async def test_a_flood_of_unknown_ids_meets_the_bounds_and_honest_peers_get_turns() -> None:
    fake = FakeContext()
    store = fake.admin.metadata
    assert store is not None
    store.gate = asyncio.Event()
    check = KeyCheck(max_lookups=8, max_per_peer=6, max_waiting_per_peer=8, max_pending=30)
    answers = Answers()
    attackers = [object(), object(), object()]
    for index in range(300):
        peer = attackers[index % 3]
        check.admit(_ctx(fake), 1000 + index, JUNK, peer, frozenset(), answers.then("flood"))
    assert check.lookups_running == 8
    assert check.lookups_pending == 18  # 6 a connection: the rest refused at once
    assert answers.told == [("flood", StatusCode.ETOOMANYREQUESTS)] * 282
    # Requests queued behind a lookup are bounded per connection too.
    for _ in range(5):
        check.admit(_ctx(fake), 1000, JUNK, attackers[0], frozenset(), answers.then("queued"))
    assert check.waiting == 18 + 2  # attacker 0 had 6 waiting: room for 2 more
    # An honest connection arriving now is not refused, and gets a turn before the flood's
    # waiting lookups have all run: one lookup per connection, round robin.
    check.admit(_ctx(fake), SALTED, KEY, object(), frozenset({CLIENT}), answers.then("honest"))
    assert check.lookups_pending == 19
    store.gate.set()
    await _settle(check)
    assert check.lookups_pending == 0
    assert check.waiting == 0
    assert ("honest", StatusCode.EOK) in answers.told
    started_after_first_round = store.reads[8:]
    assert started_after_first_round.index(SALTED) < len(attackers) + 1
    assert answers.told.count(("flood", StatusCode.ENOLEDGER)) == 18
    assert answers.told.count(("queued", StatusCode.ENOLEDGER)) == 2
    # Everything charged to the connections is gone with their lookups.
    assert not check._peers  # the bookkeeping must not outlive a flood


async def test_one_peer_cannot_take_every_lookup() -> None:
    fake = FakeContext()
    store = fake.admin.metadata
    assert store is not None
    store.gate = asyncio.Event()
    check = KeyCheck(max_lookups=8, max_per_peer=4)
    answers = Answers()
    attacker = object()
    for index in range(20):
        check.admit(_ctx(fake), 1000 + index, JUNK, attacker, frozenset(), answers.then("x"))
    assert check.lookups_running == 4
    assert len(answers.told) == 16
    check.admit(_ctx(fake), SALTED, KEY, object(), frozenset(), answers.then("honest"))
    assert check.lookups_running == 5  # another connection still gets one at once
    store.gate.set()
    await _settle(check)
    assert answers.told[-1] == ("honest", StatusCode.EOK)


async def test_a_store_that_fails_or_hangs_gives_eio() -> None:
    fake = FakeContext()
    store = fake.admin.metadata
    assert store is not None
    check = KeyCheck(timeout=0.1)
    answers = Answers()
    store.failure = MetadataStoreError("etcd is down")
    check.admit(_ctx(fake), SALTED, KEY, object(), frozenset(), answers.then("failed"))
    # Asked again and again until the timeout.
    await wait_until(lambda: len(answers.told) >= 1, every=0.01, timeout=5, what="told EIO")
    store.failure = None
    store.gate = asyncio.Event()  # never set: the store does not answer
    check.admit(_ctx(fake), SALTED, KEY, object(), frozenset(), answers.then("hung"))
    await wait_until(lambda: len(answers.told) >= 2, every=0.01, timeout=5, what="told EIO")
    assert answers.told == [("failed", StatusCode.EIO), ("hung", StatusCode.EIO)]
    assert check.stats.lookup_failures == 2
    assert check.lookups_pending == 0
    assert check.cached == 0


async def test_a_store_that_comes_back_within_the_timeout_answers() -> None:
    """etcd refusing calls for a moment (restarting, the bookie's client reconnecting) is asked
    again: the request is admitted once it answers, not refused with EIO."""
    fake = FakeContext()
    store = fake.admin.metadata
    assert store is not None
    check = KeyCheck(timeout=5.0)
    answers = Answers()
    store.failure = MetadataStoreError("etcd is restarting")
    check.admit(_ctx(fake), SALTED, KEY, object(), frozenset(), answers.then("retried"))
    await wait_until(lambda: len(store.reads) >= 2, every=0.01, timeout=10, what="asked again")
    assert answers.told == []  # still asking
    store.failure = None
    await wait_until(lambda: bool(answers.told), every=0.01, timeout=5, what="admitted")
    assert answers.told == [("retried", StatusCode.EOK)]
    assert check.stats.lookup_failures == 0


async def test_without_a_store() -> None:
    fake = FakeContext(FakeAdmin(metadata=None, running=True))
    check = KeyCheck()
    answers = Answers()
    check.admit(_ctx(fake), SALTED, JUNK, object(), frozenset(), answers.then("alone"))
    fake.admin.running = False  # has one, but not serving yet (or any more)
    check.admit(_ctx(fake), SALTED, KEY, object(), frozenset(), answers.then("booting"))
    assert answers.told == [("alone", StatusCode.EOK), ("booting", StatusCode.EIO)]


async def test_trusted_peers_and_keyless_requests_need_no_lookup() -> None:
    fake = FakeContext()
    store = fake.admin.metadata
    assert store is not None
    check = KeyCheck()
    answers = Answers()
    check.admit(_ctx(fake), ABSENT, JUNK, object(), frozenset({BOOKIE}), answers.then("bookie"))
    check.admit(_ctx(fake), ABSENT, b"", object(), frozenset(), answers.then("no key"))
    assert answers.told == [("bookie", StatusCode.EOK), ("no key", StatusCode.EOK)]
    assert store.reads == []


async def test_the_stand_in_key_passes_on_a_fence_only() -> None:
    fake = FakeContext()
    check = KeyCheck()
    answers = Answers()
    stand_in = stand_in_key(SECRET, SALTED)
    peer = object()
    check.admit(_ctx(fake), SALTED, stand_in, peer, frozenset(), answers.then("add"))
    await _settle(check)
    check.admit(_ctx(fake), SALTED, stand_in, peer, frozenset(), answers.then("f"), fence=True)
    await _settle(check)
    other = stand_in_key(b"guessed", SALTED)
    check.admit(_ctx(fake), SALTED, other, peer, frozenset(), answers.then("g"), fence=True)
    await _settle(check)
    fake.admin.secret = None  # no worker ever made the secret
    check.forget(SALTED)
    check.admit(_ctx(fake), SALTED, stand_in, peer, frozenset(), answers.then("h"), fence=True)
    await _settle(check)
    assert answers.told == [
        ("add", StatusCode.EUA),
        ("f", StatusCode.EOK),
        ("g", StatusCode.EUA),
        ("h", StatusCode.EUA),
    ]


def test_same_entry_ignores_the_piggybacked_lac_only() -> None:
    digest = Digester(DigestType.CRC32C)
    original = digest.encode(5, 0, -1, 3, b"abc")
    assert same_entry(original, original)
    assert same_entry(original, digest.encode(5, 0, 7, 3, b"abc"))  # recovery's frozen LAC
    assert not same_entry(original, digest.encode(5, 0, -1, 3, b"abd"))
    assert not same_entry(original, digest.encode(5, 0, -1, 4, b"abcd"))
    assert not same_entry(original, digest.encode(5, 1, -1, 3, b"abc"))
    assert not same_entry(original, Digester(DigestType.DUMMY).encode(5, 0, -1, 3, b"abc"))
    assert not same_entry(original, b"junk")
