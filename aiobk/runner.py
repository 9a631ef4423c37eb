"""Run a bookie as a process does: the wiring of the bookie layer with the rest.

As BookKeeper's ``EmbeddedServer`` assembles a bookie with its services, this is where the
bookie gets what it must not import itself: the client's repairer for BP-46's boot repair
(``aiobk.client.repair.BookieRepairer``), the metrics exporter and the HTTP admin API
(``aiobk.http_admin``). ``aiobk bookie start`` and
``aiobk standalone`` build bookies here; the benchmarks and tests that start bookies in-process
do too.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import gc
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import click
import uvloop
from prometheus_client import REGISTRY, CollectorRegistry

from aiobk.autorecovery import AutoRecovery
from aiobk.bookie import Bookie, BookieConfig
from aiobk.bookie.companions import CompanionFactory
from aiobk.bookie.config import ConfigError
from aiobk.bookie.tls import BookieTls
from aiobk.client.net import Connector, TlsConnector
from aiobk.client.repair import BookieRepairer
from aiobk.http_admin import HttpAdmin
from aiobk.metadata import MetadataStore
from aiobk.metrics import (
    add_autorecovery_metrics,
    autorecovery_collector,
    bookie_collectors,
    register_build_info,
    register_loop_lag,
    serve_metrics,
)


def install_event_loop_policy() -> None:
    """uvloop (a declared dependency) for every command that runs a loop."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


M_ARENA_MAX = -8  # glibc's mallopt parameters
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MALLOC_ARENAS = 2
# With glibc's sliding thresholds a bookie under load gave memory back to the system
# and faulted it in again -- 1.0-1.4 page faults an append over its three bookies at 512 in
# flight (``bench add``, volatile), each a fresh page the kernel (and on a virtual machine the
# host) must supply. Freed memory up to this much stays in the heap, and blocks under the mmap
# threshold come from it: 0.54-0.60 faults an append, and 1-14% less bookie CPU an append in
# four pairs. Both must be set: either alone turns the sliding off and faults more
# (3.2 with the trim threshold alone, 2.2 with the mmap threshold alone).
MALLOC_TRIM_THRESHOLD = 32 << 20
MALLOC_MMAP_THRESHOLD = 8 << 20


def _mallopt() -> Callable[[int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        mallopt: Callable[[int, int], int] = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    return mallopt


def tune_malloc(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (what ``MALLOC_ARENA_MAX`` does), before threads start, and
    keep freed memory for reuse (``MALLOC_TRIM_THRESHOLD``, ``MALLOC_MMAP_THRESHOLD``).

    The bookie's disk and index work runs on worker threads, and glibc gives each thread its
    own arena that keeps what it freed: measured on a bookie taking 20,000 ledgers, the RSS
    grew 770-850 B a ledger with the default arenas and 440 B with two. What the
    environment sets (``MALLOC_ARENA_MAX``, ``MALLOC_TRIM_THRESHOLD_`` and
    ``MALLOC_MMAP_THRESHOLD_``, glibc's own names) wins; on other C libraries this does
    nothing. True if the arena cap was set."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    if not {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"} & os.environ.keys():
        mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)
        mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(mallopt(M_ARENA_MAX, arenas))


# A bookie in flight allocates a few objects per add (the request, its reply, the
# journal's and the storage's records), and with CPython's default threshold (700) its young
# generation was collected every few dozen adds, each pass walking every young object. A larger
# young generation is collected a tenth as often for the same work per object; objects alive
# after boot (the index's caches, the ledger states loaded, imported modules) are frozen so the
# full collections that still come never walk them again.
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Collection thresholds for a long-running server process (see GC_YOUNG_THRESHOLD)."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def autorecovery_companion(
    config: BookieConfig, connector: Connector | None = None
) -> CompanionFactory:
    """Autorecovery beside a bookie: its worker, and a candidate for auditor;
    ``connector`` its bookie connections (the bookie's TLS, when it has TLS)."""

    def make(bookie_id: str, store: MetadataStore) -> AutoRecovery:
        return AutoRecovery(
            store,
            config.autorecovery,
            bookie_id,
            connector=connector,
            wall_clock=time.time,
            secret_bytes=os.urandom,
        )

    return make


def make_bookie(config: BookieConfig, **seams: Any) -> Bookie:
    """A bookie wired as a running one is: with the client's repairer and, unless
    ``autorecovery_enabled`` is off, autorecovery beside it (``seams``: the I/O seams of
    ``Bookie``, and ``companions`` to replace the wiring's, for tests and the simulator)."""
    if config.http_port is not None and not 0 <= config.http_port <= 65535:
        raise ConfigError(f"http_port {config.http_port} is not in 0..65535")
    connector: Connector | None = None
    if config.tls_enabled:
        # The bookie's own connections to its peers (BP-46 repair, re-replication) use TLS
        # with its certificate as their identity, following its reloads.
        tls = seams["tls"] = BookieTls(config)
        connector = TlsConnector(lambda: tls.client)
    if "companions" not in seams and config.autorecovery_enabled:
        seams["companions"] = [autorecovery_companion(config, connector)]
    repairer = functools.partial(BookieRepairer, connector=connector)
    return Bookie(config, repairer=repairer, **seams)


def start_metrics(bookie: Bookie) -> None:
    """The Prometheus exporter, when the bookie's config asks for one (``metrics_port``): the
    bookie's figures and those of the autorecovery running beside it (``aiobk_autorecovery_*``:
    under-replicated and lost ledgers, bytes and entries re-replicated, elections)."""
    if bookie.config.metrics_port is not None:
        serve_metrics(
            bookie.stats,
            bookie.bookie_id,
            bookie.config.host,
            bookie.config.metrics_port,
            bookie.gauges,
            lambda: bookie.metadata,
        )
        for companion in bookie.companions:
            if isinstance(companion, AutoRecovery):
                add_autorecovery_metrics(companion.stats, bookie.bookie_id)


async def start_http_admin(bookie: Bookie, **options: Any) -> HttpAdmin | None:
    """The HTTP admin API of a started bookie, when its config asks for one (``http_port``,
    on ``http_host`` or else the bookie's host); stop it before the bookie. ``/metrics``
    exposes the process's registry, which holds the bookie's figures when ``metrics_port``
    put them there; otherwise a registry of this bookie's own comes first. ``options``: the
    ``HttpAdmin`` keywords (timeouts, for tests)."""
    config = bookie.config
    if config.http_port is None:
        return None
    register_build_info()  # REGISTRY's, served here as by the exporter
    register_loop_lag()
    registries: list[CollectorRegistry] = [REGISTRY]
    if config.metrics_port is None:
        own = CollectorRegistry(auto_describe=False)  # nothing collected before a scrape
        collectors = bookie_collectors(
            bookie.stats, bookie.bookie_id, bookie.gauges, lambda: bookie.metadata
        )
        for collector in collectors:
            own.register(collector)
        for companion in bookie.companions:
            if isinstance(companion, AutoRecovery):
                own.register(autorecovery_collector(companion.stats, bookie.bookie_id))
        registries.insert(0, own)
    http = HttpAdmin(
        bookie, config.http_host or config.host, config.http_port, registries=registries, **options
    )
    await http.start()
    return http


def run_until_signalled(bookie: Bookie) -> None:
    """Start ``bookie``, print its address, serve until SIGTERM/SIGINT, then stop cleanly."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await bookie.start()
        tune_gc()
        try:
            start_metrics(bookie)
            http = await start_http_admin(bookie)
        except BaseException:
            await bookie.stop()
            raise
        click.echo(f"bookie {bookie.bookie_id} serving on {bookie.address}", nl=True)
        sys.stdout.flush()
        await stop.wait()
        click.echo("stopping", err=True)
        if http is not None:
            await http.stop()
        await bookie.stop()

    tune_malloc()
    install_event_loop_policy()
    asyncio.run(main())


__all__ = [
    "install_event_loop_policy",
    "tune_malloc",
    "make_bookie",
    "run_until_signalled",
    "start_http_admin",
    "start_metrics",
    "tune_gc",
]
