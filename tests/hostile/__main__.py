"""The hostile probes at their full scale, against a bookie from any source tree.

    python -m tests.hostile --src DIR [--probe NAME ...] [--cap-seconds 60] [--cap-rss-mib 3072]

Each probe starts a bookie process from tree DIR (PYTHONPATH=DIR, ``python -m aiobk.bookie start``;
the probing side is this tree's raw client), attacks it, and prints one JSON line of figures:
peak RSS growth, the honest client's latency meanwhile, lateness, statuses, exit codes, index
bytes. The code before the fix can take long or blow up, so each attack is capped: past
``--cap-rss-mib`` of RSS growth the bookie is killed, past ``--cap-seconds`` the probe stops
waiting; either is reported (``"capped"``). The pytest suite beside this module runs the same
attacks at a smaller scale with assertions. The client's own probes (appends queued at once,
big reads) are ``bench.client_backpressure``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import struct
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from aiobk.client import BookKeeper
from aiobk.metadata import EtcdProcess, open_store
from aiobk.protocol import GcRequest, GcResponse, ReadFlag, ReadRequest, ReadResponse, StatusCode
from aiobk.protocol.errors import BKError
from tests.hostile.harness import BookieUnderTest, MiB, summary
from tests.hostile.honest import HonestClient, add_request
from tests.hostile.rawclient import RawConnection
from tests.hostile.small_disk import small_disk
from tests.support.wait import wait_until

INT64_MAX = 2**63 - 1
Figures = dict[str, Any]


@dataclass(frozen=True)
class Caps:
    seconds: float
    rss: int


def _mib(size: int) -> float:
    return round(size / MiB, 1)


_STARTED: list[BookieUnderTest] = []  # stopped after each probe, whatever happened


async def _started(root: Path, src: str, name: str, **settings: Any) -> BookieUnderTest:
    bookie = BookieUnderTest(root, settings, name=name, src=src)
    _STARTED.append(bookie)
    await bookie.start()
    return bookie


async def _stats(bookie: BookieUnderTest) -> dict[str, int]:
    try:
        return await bookie.stats(5.0)
    except (OSError, TimeoutError) as exc:
        return {"unreachable": 1, "error": str(exc)}  # type: ignore[dict-item]


def _stop(bookie: BookieUnderTest) -> int | str:
    """SIGTERM's exit code, or what happened instead."""
    if not bookie.alive:
        return f"already dead ({bookie.proc.process.returncode if bookie.proc.process else '?'})"
    try:
        return bookie.terminate()
    except Exception as exc:
        bookie.stop()
        return f"no exit: {exc!r}"


def _last_error(bookie: BookieUnderTest) -> str:
    lines = [line for line in bookie.log_text().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or [""])[-1][-300:]


# ---------------------------------------------------------------------- 1: poison requests


async def _restarted(bookie: BookieUnderTest, caps: Caps) -> str | None:
    """Start ``bookie`` again: None once it serves, else why not (and it is stopped)."""
    try:
        async with asyncio.timeout(caps.seconds):
            await bookie.start()
    except (RuntimeError, TimeoutError) as exc:
        bookie.stop()
        return f"failed: {_last_error(bookie) or exc!r}"
    return None


async def probe_poison(root: Path, src: str, caps: Caps) -> Figures:
    """An add at entry 2**44 and at 2**63-1, an add and a fencing read of unused ledgers with
    a 300-byte key; then checkpoints, SIGTERM, a restart and a read of entry 2**44."""
    bookie = await _started(root, src, "poison", flush_interval=1.0)
    long_key = b"k" * 300
    conn = await RawConnection.open(bookie.host, bookie.port)
    requests = {
        "add_entry_2^44": add_request(conn.next_txn_id(), 104, 2**44, b"far"),
        "add_entry_2^63-1": add_request(conn.next_txn_id(), 101, INT64_MAX, b"x"),
        "add_300_byte_key": add_request(conn.next_txn_id(), 9000, 0, b"x", key=long_key),
        "fence_300_byte_key": ReadRequest(conn.next_txn_id(), 9001, -1, ReadFlag.FENCE, long_key),
    }
    answers = await conn.wait_for(conn.send_many(requests.values()), 10)
    statuses = {name: answers[r.txn_id].status.name for name, r in requests.items()}
    before = await conn.stats()
    conn.close()
    stats = before

    async def checkpointed() -> bool:
        nonlocal stats
        stats = await _stats(bookie)
        return stats["checkpoints"] > before["checkpoints"] + 1

    # A probe reports what it finds: no second checkpoint in time is a figure, not a failure.
    with contextlib.suppress(AssertionError):
        await wait_until(
            checkpointed, every=0.2, timeout=min(caps.seconds, 5.0), what="checkpoints"
        )
    figures: Figures = {
        "statuses": statuses,
        "checkpoints_in_5s": stats.get("checkpoints", 0) - before["checkpoints"],
        "checkpoint_failures": stats.get("checkpoint_failures", "not counted"),
        "sigterm_exit": _stop(bookie),
    }
    failed = await _restarted(bookie, caps)
    if failed is not None:
        figures["restart"] = failed
        return figures
    conn = await RawConnection.open(bookie.host, bookie.port)
    read = await conn.call(ReadRequest(conn.next_txn_id(), 104, 2**44), 10)
    conn.close()
    figures["restart"] = "ok"
    figures["read_entry_2^44_after_restart"] = read.status.name
    figures["second_sigterm_exit"] = _stop(bookie)
    return figures


# ---------------------------------------------------------------------- 2: unread reads


async def probe_reads(root: Path, src: str, caps: Caps) -> Figures:
    """One 1 MiB entry; one connection pipelines 1,000 reads of it and reads no answer, held
    10 s; an honest client adds and reads the entry on another connection meanwhile."""
    bookie = await _started(root, src, "reads")
    conn = await RawConnection.open(bookie.host, bookie.port)
    added = await conn.call(add_request(conn.next_txn_id(), 50, 0, b"e" * MiB), 30)
    conn.close()
    assert added.status is StatusCode.EOK, added
    honest = HonestClient(bookie.host, bookie.port, read_ledger=50, read_entry=0)
    figures: Figures = {}
    async with honest.running():
        await asyncio.sleep(1.0)
        honest.latencies.clear()
        with bookie.sampler(caps.rss, bookie.kill_now) as rss:
            hostile = await RawConnection.open(bookie.host, bookie.port)
            hostile.send_many(ReadRequest(hostile.next_txn_id(), 50, 0) for _ in range(1000))
            deadline = time.monotonic() + min(10.0, caps.seconds)
            while time.monotonic() < deadline and bookie.alive:  # the attack lasts its time
                await asyncio.sleep(0.05)
            stats = await _stats(bookie)
            hostile.abort()
        figures.update(
            rss_baseline_mib=_mib(rss.baseline),
            rss_growth_mib=_mib(rss.growth),
            capped=f"killed past {_mib(caps.rss)} MiB" if rss.limit_hit else False,
            honest=summary(honest.latencies),
            honest_requests=len(honest.latencies),
            honest_failures=len(honest.failures),
            connections_shed=stats.get("connections_shed", "not counted"),
            connection_bytes_held=stats.get("connection_bytes_held", "not counted"),
        )
    figures["sigterm_exit"] = _stop(bookie)
    return figures


# ---------------------------------------------------------------------- 3: long-poll floods


async def probe_long_polls(
    root: Path, src: str, caps: Caps, polls: int, connections: int = 1
) -> Figures:
    """``polls`` long polls of 8 s sent at once, over ``connections`` connections; a plain
    read every 100 ms on another."""
    timeout = 8.0
    bookie = await _started(root, src, f"polls{polls}")
    plain_conn = await RawConnection.open(bookie.host, bookie.port)
    added = await plain_conn.call(add_request(plain_conn.next_txn_id(), 60, 0, b"x"))
    assert added.status is StatusCode.EOK, added
    loop = asyncio.get_running_loop()
    plain: list[float] = []

    async def plain_reads() -> None:
        while True:
            start = time.monotonic()
            await plain_conn.call(ReadRequest(plain_conn.next_txn_id(), 60, 0), caps.seconds)
            plain.append(time.monotonic() - start)
            await asyncio.sleep(0.1)  # pacing: a read every 100 ms

    async def collect(peer: RawConnection, count: int) -> None:
        while len(peer.received) < count:
            await peer.read_some(caps.seconds)

    share = polls // connections
    wait_ms = int(timeout * 1000)
    with bookie.sampler(caps.rss, bookie.kill_now) as rss:
        peers = [await RawConnection.open(bookie.host, bookie.port) for _ in range(connections)]
        batches = [
            [
                ReadRequest(peer.next_txn_id(), 60, 1, ReadFlag.LONG_POLL, b"", 0, wait_ms)
                for _ in range(share)
            ]
            for peer in peers
        ]
        reader = loop.create_task(plain_reads())
        sent = loop.time()
        for peer, batch in zip(peers, batches, strict=True):
            peer.send_many(batch)
        capped: str | bool = False
        try:
            async with asyncio.timeout(caps.seconds):
                await asyncio.gather(*(collect(peer, share) for peer in peers))
        except TimeoutError:
            capped = f"stopped waiting after {caps.seconds:g} s"
        except ConnectionError:
            capped = f"connection lost ({'killed past the RSS cap' if rss.limit_hit else 'closed'})"
        elapsed = loop.time() - sent
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError, TimeoutError):
            await reader
    answers = [answer for peer in peers for answer in peer.received.values()]
    statuses: dict[str, int] = {}
    for _at, response in answers:
        statuses[response.status.name] = statuses.get(response.status.name, 0) + 1
    late = [at - sent - timeout for at, r in answers if r.status is StatusCode.EOK]
    refused = [at - sent for at, r in answers if r.status is StatusCode.ETOOMANYREQUESTS]
    stats = await _stats(bookie)
    for peer in [*peers, plain_conn]:
        peer.abort()
    return {
        "polls": polls,
        "connections": connections,
        "answered": len(answers),
        "statuses": statuses,
        "lateness_of_waited": summary(late),
        "latency_of_refused": summary(refused),
        "plain_read": summary(plain),
        "plain_reads": len(plain),
        "rss_growth_mib": _mib(rss.growth),
        "seconds": round(elapsed, 1),
        "capped": capped,
        "long_polls_refused": stats.get("long_polls_refused", "not counted"),
        "sigterm_exit": _stop(bookie),
    }


# ---------------------------------------------------------------------- 6: slow frames


async def probe_slow_frames(root: Path, src: str, caps: Caps) -> Figures:
    """100 connections each send 5 MiB - 1 bytes of a 5 MiB frame, then idle; an honest client
    meanwhile. Held until every one is closed or frame_timeout (30 s) + 5 s."""
    frame = 5 * MiB
    bookie = await _started(root, src, "slow")
    honest = HonestClient(bookie.host, bookie.port)
    closed_at: list[float] = []
    async with honest.running():
        await asyncio.sleep(0.5)  # warm-up: the honest client's first requests stay out
        honest.latencies.clear()
        with bookie.sampler(caps.rss, bookie.kill_now) as rss:
            start = time.monotonic()
            peers = []
            head = struct.pack(">I", frame - 4) + bytes(frame - 5)
            for _ in range(100):
                if not bookie.alive:
                    break
                peer = await RawConnection.open(bookie.host, bookie.port)
                peer.send_bytes(head)
                with contextlib.suppress(ConnectionError):
                    await peer.drain(30)
                peers.append(peer)
            sent = time.monotonic() - start
            window = min(caps.seconds, 35.0)

            async def watch(peer: RawConnection) -> None:
                if await peer.closed_by_peer(window - (time.monotonic() - start)):
                    closed_at.append(time.monotonic() - start)

            await asyncio.gather(*(watch(peer) for peer in peers))
            stats = await _stats(bookie)
            for peer in peers:
                peer.abort()
        figures: Figures = {
            "sent_seconds": round(sent, 1),
            "rss_growth_mib": _mib(rss.growth),
            "capped": f"killed past {_mib(caps.rss)} MiB" if rss.limit_hit else False,
            "closed_within_5s": sum(1 for at in closed_at if at < 5),
            "closed_within_35s": len(closed_at),
            "last_close_s": round(max(closed_at, default=0.0), 1),
            "honest": summary(honest.latencies),
            "honest_failures": len(honest.failures),
            "connections_shed": stats.get("connections_shed", "not counted"),
            "connections_timed_out": stats.get("connections_timed_out", "not counted"),
        }
    figures["sigterm_exit"] = _stop(bookie)
    return figures


# ---------------------------------------------------------------------- 7: sparse entry ids


async def probe_sparse(root: Path, src: str, caps: Caps) -> Figures:
    """3,000 adds of a 42-byte body at entry ids i * 10**9; a checkpoint; a restart that reads
    them all back."""
    entries = [i * 10**9 for i in range(3000)]
    bookie = await _started(root, src, "sparse", flush_interval=1.0)
    conn = await RawConnection.open(bookie.host, bookie.port)
    warm = await conn.call(add_request(conn.next_txn_id(), 71, 0, b"sparse"))
    assert warm.status is StatusCode.EOK, warm
    await asyncio.sleep(1.5)
    index_before = bookie.dir_bytes("ledgers/index")
    with bookie.sampler(caps.rss, bookie.kill_now) as rss:
        txns = conn.send_many(add_request(conn.next_txn_id(), 70, e, b"sparse") for e in entries)
        answers = await conn.wait_for(txns, caps.seconds)
        before = await conn.stats()
        stats = before

        async def checkpointed() -> bool:
            nonlocal stats
            stats = await conn.stats()
            return stats["checkpoints"] > before["checkpoints"] + 1

        with contextlib.suppress(AssertionError):  # a figure, not a failure (see probe_poison)
            await wait_until(checkpointed, every=0.2, timeout=15, what="checkpoints")
    conn.close()
    figures: Figures = {
        "adds_ok": sum(1 for r in answers.values() if r.status is StatusCode.EOK),
        "rss_growth_mib": _mib(rss.growth),
        "index_bytes": bookie.dir_bytes("ledgers/index") - index_before,
        "checkpoint_failures": stats.get("checkpoint_failures", "not counted"),
        "sigterm_exit": _stop(bookie),
    }
    start = time.monotonic()
    failed = await _restarted(bookie, caps)
    if failed is not None:
        figures["restart"] = failed
        return figures
    figures["restart_seconds"] = round(time.monotonic() - start, 1)
    conn = await RawConnection.open(bookie.host, bookie.port)
    txns = conn.send_many(ReadRequest(conn.next_txn_id(), 70, e) for e in entries)
    reads = await conn.wait_for(txns, caps.seconds)
    conn.close()
    figures["read_back_ok"] = sum(
        1 for r in reads.values() if isinstance(r, ReadResponse) and r.status is StatusCode.EOK
    )
    figures["second_sigterm_exit"] = _stop(bookie)
    return figures


async def probe_disk_full(root: Path, src: str, caps: Caps) -> Figures:
    """A bookie on a 64 MiB filesystem (tmpfs as root, else simulated) beside three ordinary
    ones: 128 KiB appends to ledgers placed on it until 128 MiB are written; then every ledger
    deleted and a GC pass on the full bookie; SIGTERM; a restart on its full disk."""
    etcd = EtcdProcess().start()
    figures: Figures = {}
    try:
        uri = etcd.uri("diskfull")
        with small_disk(root / "x", 64 * MiB) as small:
            figures["disk"] = small.how
            args = ("--metadata", uri)
            x = BookieUnderTest(root, {"gc_interval": 0.0}, name="x", src=src, args=args)
            x.proc.env.update(small.env())
            _STARTED.append(x)
            await x.start()
            for index in range(3):
                await _started(root, src, f"o{index}", metadata_uri=uri, gc_interval=0.0)
            x_id = f"127.0.0.1:{x.port}"
            store = open_store(uri)
            states: set[str] = set()
            errors: dict[str, int] = {}
            written = 0
            bk = await BookKeeper.connect(uri)
            deadline = time.monotonic() + caps.seconds
            misses = 0
            with x.sampler(caps.rss, x.kill_now) as rss:
                while written < 1024 and time.monotonic() < deadline and x.alive:
                    handle = await bk.create_ledger(3, 3, 2, password=b"p")
                    if x_id not in handle.metadata.ensemble:
                        await handle.close()
                        misses += 1
                        if misses >= 20:  # placed elsewhere every time: it is read-only
                            break
                        continue
                    misses = 0
                    for _ in range(16):
                        results = await asyncio.gather(
                            *(handle.append(b"e" * (128 * 1024)) for _ in range(8)),
                            return_exceptions=True,
                        )
                        for result in results:
                            if isinstance(result, BaseException):
                                name = type(result).__name__
                                errors[name] = errors.get(name, 0) + 1
                            else:
                                written += 1
                        info = {b.bookie_id: b.state for b in await store.list_bookies()}
                        states.add(info.get(x_id, "gone"))
                        if isinstance(results[-1], BaseException):
                            break
                    with contextlib.suppress(BKError):
                        await handle.close()
            figures.update(
                appends_ok=written,
                append_errors=errors,
                registered_states_seen=sorted(states),
                rss_growth_mib=_mib(rss.growth),
                disk_free_mib=_mib(small.free()),
            )
            async for ledger_id in bk.list_ledgers():
                await bk.delete_ledger(ledger_id, b"p")
            await bk.close()
            await store.close()
            conn = await RawConnection.open(x.host, x.port)
            gc = await conn.call(GcRequest(conn.next_txn_id()), caps.seconds)
            conn.close()
            assert isinstance(gc, GcResponse), gc
            figures["gc"] = {"bytes_freed": gc.bytes_freed, "detail": gc.detail}
            figures["disk_free_after_gc_mib"] = _mib(small.free())
            small.fill(leave=0)
            figures["sigterm_exit_on_full_disk"] = _stop(x)
            failed = await _restarted(x, caps)
            figures["restart_on_full_disk"] = failed or "started"
            if failed is None:
                figures["sigterm_exit_after_restart"] = _stop(x)
    finally:
        etcd.stop()
    return figures


Probe = Callable[[Path, str, Caps], Awaitable[Figures]]


def _polls(polls: int, connections: int) -> Probe:
    async def probe(root: Path, src: str, caps: Caps) -> Figures:
        return await probe_long_polls(root, src, caps, polls, connections)

    return probe


PROBES: dict[str, Probe] = {
    "1-poison": probe_poison,
    "2-reads": probe_reads,
    # One connection, as the first probe found it (its lateness came from that connection not
    # being read while 10,000 polls waited); then spread so that no cap refuses any.
    "3-long-polls-50k": _polls(50_000, 1),
    "3-long-polls-100k": _polls(100_000, 1),
    "3-long-polls-50k-over-10": _polls(50_000, 10),
    "3-long-polls-100k-over-20": _polls(100_000, 20),
    "5-disk-full": probe_disk_full,
    "6-slow-frames": probe_slow_frames,
    "7-sparse": probe_sparse,
}


async def _run(name: str, src: str, caps: Caps) -> Figures:
    with tempfile.TemporaryDirectory(prefix=f"hostile-{name}-") as tmp:
        start = time.monotonic()
        try:
            async with asyncio.timeout(4 * caps.seconds):  # the whole probe, restarts included
                figures = await PROBES[name](Path(tmp), src, caps)
        except Exception as exc:
            figures = {"error": repr(exc)[:500]}
        finally:
            for bookie in _STARTED:
                bookie.stop()
            _STARTED.clear()
        seconds = round(time.monotonic() - start, 1)
        return {"probe": name, "src": src, **figures, "probe_seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.hostile", description=__doc__)
    parser.add_argument("--src", required=True, help="source tree the bookie runs from")
    parser.add_argument("--probe", action="append", choices=sorted(PROBES), default=None)
    parser.add_argument("--cap-seconds", type=float, default=60.0)
    parser.add_argument("--cap-rss-mib", type=int, default=3072)
    args = parser.parse_args(argv)
    caps = Caps(args.cap_seconds, args.cap_rss_mib * MiB)
    src = str(Path(args.src).resolve())
    for name in args.probe or list(PROBES):
        figures = uvloop.run(_run(name, src, caps))
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
