"""``aiobk standalone``: etcd plus N bookies on loopback, for trying aiobk out (``make run``)."""

from __future__ import annotations

import asyncio
import os
import signal

import click

from bookie.cli import install_event_loop_policy
from bookie.config import BookieConfig
from bookie.server import Bookie
from metadata.etcd_process import EtcdNotFoundError, EtcdProcess


async def _run(bookies: int, data_dir: str, etcd_port: int, bookie_port: int) -> None:
    etcd = EtcdProcess(
        client_port=etcd_port,
        peer_port=etcd_port + 1,
        data_dir=os.path.join(data_dir, "etcd"),
    )
    os.makedirs(etcd.data_dir or data_dir, exist_ok=True)
    try:
        await asyncio.to_thread(etcd.start)
    except (EtcdNotFoundError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    uri = etcd.uri()
    running: list[Bookie] = []
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        for index in range(bookies):
            config = BookieConfig(
                data_dir=os.path.join(data_dir, f"bookie-{index}"),
                port=bookie_port + index if bookie_port else 0,
                metadata_uri=uri,
            )
            bookie = Bookie(config)
            await bookie.start()
            running.append(bookie)
            click.echo(f"bookie {bookie.bookie_id} serving on {bookie.address}")
        click.echo(f"metadata: {uri}")
        click.echo("standalone cluster ready; Ctrl-C stops it")
        await stop.wait()
    finally:
        for bookie in running:
            await bookie.stop()
        await asyncio.to_thread(etcd.stop, False)
        click.echo("standalone cluster stopped")


@click.command("standalone", help="Start etcd and N bookies on loopback until interrupted.")
@click.option("--bookies", type=click.IntRange(1, 32), default=3, show_default=True)
@click.option(
    "--data-dir", type=click.Path(file_okay=False), default="standalone-data", show_default=True
)
@click.option("--etcd-port", type=click.IntRange(1, 65534), default=2379, show_default=True)
@click.option("--bookie-port", type=click.IntRange(0, 65535), default=3181, show_default=True)
def standalone_command(bookies: int, data_dir: str, etcd_port: int, bookie_port: int) -> None:
    install_event_loop_policy()
    asyncio.run(_run(bookies, data_dir, etcd_port, bookie_port))
