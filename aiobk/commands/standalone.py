"""``aiobk standalone``: etcd plus N bookies on loopback, for trying aiobk out (``make run``).

It never joins a cluster it did not start: the ports it needs must be free (else one line names
the port), and the etcd that answers must be the member it started (``EtcdProcess``). It never
leaves its etcd behind: etcd dies with it, even on ``kill -9`` (Linux), and an etcd an earlier
standalone left in the same data directory is stopped at start (one still owned by a running
standalone is refused).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from aiobk.bookie.config import BookieConfig
from aiobk.bookie.index.engine import IndexCorruptError
from aiobk.bookie.journal.format import JournalCorruptError
from aiobk.bookie.server import Bookie
from aiobk.commands.extras import require_extras
from aiobk.metadata.etcd_process import (
    AUTO_COMPACTION,
    EtcdNotFoundError,
    EtcdProcess,
    port_in_use,
)
from aiobk.protocol.errors import BKError

if TYPE_CHECKING:
    from aiobk.http_admin import HttpAdmin  # the bookie extra's (aiohttp)

HOST = "127.0.0.1"


def _check_bookie_ports(bookies: int, bookie_port: int, option: str = "--bookie-port") -> None:
    if not bookie_port:
        return
    if bookie_port + bookies - 1 > 65535:
        raise click.BadParameter(f"{bookies} bookies from port {bookie_port} pass 65535")
    for port in range(bookie_port, bookie_port + bookies):
        if port_in_use(HOST, port):
            raise click.ClickException(
                f"{'bookie' if option == '--bookie-port' else 'HTTP'} port {HOST}:{port} is in "
                f"use (another standalone or bookie running?); choose others with {option}"
            )


async def _run(
    bookies: int,
    data_dir: str,
    etcd_port: int,
    bookie_port: int,
    make_bookie: Callable[[BookieConfig], Bookie],
    http_port: int | None = None,
) -> None:
    _check_bookie_ports(bookies, bookie_port)
    if http_port is not None:
        _check_bookie_ports(bookies, http_port, "--http-port")
    # The HTTP admin API and /metrics of bookie i on http_port + i (the server's wiring).
    from aiobk.runner import start_http_admin  # noqa: PLC0415

    etcd = EtcdProcess(
        client_port=etcd_port,
        peer_port=etcd_port + 1,
        data_dir=os.path.join(data_dir, "etcd"),
        # History bounded by etcd itself as well as by the bookies' GC passes (README,
        # "etcd's history"): keep the last 100,000 revisions.
        extra_args=AUTO_COMPACTION,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    running: list[Bookie] = []
    admins: list[HttpAdmin] = []
    lost_etcd = False
    try:
        try:
            etcd.launch()  # on this (the main) thread: etcd dies with this process
            if etcd.stopped_leftover is not None:
                click.echo(f"stopped the etcd (pid {etcd.stopped_leftover}) left in {data_dir}")
            await asyncio.to_thread(etcd.wait_ready)
        except (EtcdNotFoundError, RuntimeError) as exc:
            raise click.ClickException(str(exc)) from None
        uri = etcd.uri()
        for index in range(bookies):
            config = BookieConfig(
                data_dir=os.path.join(data_dir, f"bookie-{index}"),
                port=bookie_port + index if bookie_port else 0,
                host=HOST,
                metadata_uri=uri,
                http_port=None if http_port is None else http_port + index,
            )
            bookie = make_bookie(config)
            try:
                await bookie.start()
            except (OSError, ValueError, BKError, JournalCorruptError, IndexCorruptError) as exc:
                raise click.ClickException(f"bookie {index} did not start: {exc}") from None
            running.append(bookie)
            click.echo(f"bookie {bookie.bookie_id} serving on {bookie.address}")
            if http_port is not None:
                try:
                    admin = await start_http_admin(bookie)
                except OSError as exc:
                    raise click.ClickException(
                        f"bookie {index}: cannot serve HTTP on {HOST}:{http_port + index}: "
                        f"{exc.strerror}"
                    ) from None
                if admin is not None:
                    admins.append(admin)
                    click.echo(f"bookie {bookie.bookie_id} admin API and metrics on {admin.url}")
        click.echo(f"metadata: {uri}")
        # What a second terminal needs, as a line it can run as it is.
        click.echo(f"export AIOBK_METADATA={shlex.quote(uri)}")
        click.echo("standalone cluster ready; Ctrl-C stops it")
        etcd_exit = await _until_stopped_or_exited(stop, etcd)
        if etcd_exit is not None:
            pid, status = etcd_exit
            # Said at once, before the bookies' stop: the one line that explains the rest.
            # Their warnings about the store they can no longer reach would only repeat it.
            click.echo(
                f"aiobk: error: etcd (pid {pid}) {_ending(status)}; stopping the bookies "
                f"(etcd's log: {etcd.log_path})",
                err=True,
            )
            logging.getLogger("aiobk").setLevel(logging.ERROR)
            lost_etcd = True
    finally:
        for admin in admins:
            await admin.stop()
        for bookie in running:
            await bookie.stop()
        if etcd.process is not None:
            await asyncio.to_thread(etcd.stop, False)
            click.echo("standalone cluster stopped")
    if lost_etcd:
        raise click.exceptions.Exit(1)


def _ending(status: int) -> str:
    """How a process with exit status ``status`` (negative: killed by that signal) ended."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    return f"was killed by {name}"


async def _until_stopped_or_exited(
    stop: asyncio.Event, etcd: EtcdProcess
) -> tuple[int, int] | None:
    """Wait for ``stop`` (a signal) or for etcd's process to exit; (pid, status) in the latter
    case, known the moment it happens (a thread waits on the process: the bookies are stopped
    before they notice). Stopping etcd afterwards ends that thread."""
    process = etcd.process
    assert process is not None
    exited = asyncio.ensure_future(asyncio.to_thread(process.wait))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait((exited, stopped), return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not exited.done():
        exited.cancel()  # the thread itself ends when etcd is stopped
        return None
    return process.pid, exited.result()


@click.command("standalone", help="Start etcd and N bookies on loopback until interrupted.")
@click.option(
    "--bookies", type=click.IntRange(1, 32), default=3, show_default=True, help="Bookies to run."
)
@click.option(
    "--data-dir", type=click.Path(file_okay=False), default="standalone-data", show_default=True
)
@click.option(
    "--etcd-port",
    type=click.IntRange(1, 65534),
    default=2379,
    show_default=True,
    help="etcd's client port; its peer port is the next one.",
)
@click.option(
    "--bookie-port",
    type=click.IntRange(0, 65535),
    default=3181,
    show_default=True,
    help="The first bookie's port; the others take the next ones (0: any free ports).",
)
@click.option(
    "--http-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve bookie i's HTTP admin API and /metrics on this port + i (default: none).",
)
def standalone_command(
    bookies: int, data_dir: str, etcd_port: int, bookie_port: int, http_port: int | None
) -> None:
    require_extras("aiobk standalone", "bookie")
    # The server's wiring (RocksDB, the exporter, the HTTP admin API): the bookie extra's.
    from aiobk.runner import install_event_loop_policy, make_bookie  # noqa: PLC0415

    install_event_loop_policy()
    asyncio.run(_run(bookies, data_dir, etcd_port, bookie_port, make_bookie, http_port))
