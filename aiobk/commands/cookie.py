"""``aiobk cookie show|fix``: a bookie's cookies (BP-46). ``aiobk bookie cookie`` is the same
group under a second name, kept working for scripts but deprecated and not listed
(``cookie_alias``)."""

from __future__ import annotations

import json
import os

import click

from aiobk.bookie.config import BookieConfig
from aiobk.bookie.cookies import COOKIE_FILE, directories, fix_cookies, marker_present
from aiobk.bookie.disk import OsDisk
from aiobk.commands.common import metadata_option, run_loop
from aiobk.metadata import MetadataURIError, open_store
from aiobk.protocol.errors import BKError


@click.group(name="cookie", help="Inspect or fix a bookie's cookies (BP-46).")
def cookie_group() -> None:
    pass


def _cookie_config(data_dir: str, journal_dir: str | None) -> BookieConfig:
    return BookieConfig(data_dir=data_dir, journal_dir=journal_dir)


@cookie_group.command("show", help="Print the cookies in the directories and in the store.")
@click.option("--data-dir", type=click.Path(file_okay=False), required=True)
@click.option("--journal-dir", type=click.Path(file_okay=False), default=None)
@click.option("--bookie-id", default=None, help="Also show the store's cookie for this id.")
@metadata_option
def cookie_show(
    data_dir: str, journal_dir: str | None, bookie_id: str | None, metadata: str | None
) -> None:
    config = _cookie_config(data_dir, journal_dir)
    if not os.path.isdir(data_dir):
        raise click.ClickException(f"no bookie data directory at {data_dir}")

    async def collect() -> dict[str, object]:
        disk = OsDisk()
        out: dict[str, object] = {}
        try:
            journal_dirs, data_dirs = directories(config)
            for directory in dict.fromkeys([*journal_dirs, *data_dirs]):
                path = os.path.join(directory, COOKIE_FILE)
                found = await disk.read_file(path) if await disk.exists(path) else None
                out[directory] = json.loads(found) if found is not None else None
            if bookie_id and metadata:
                store = open_store(metadata)
                try:
                    remote = await store.read_cookie(bookie_id)
                finally:
                    await store.close()
                out["metadata"] = json.loads(remote.to_json()) if remote is not None else None
            out["unclean_shutdown_marker"] = await marker_present(disk, config)
        finally:
            await disk.close()
        return out

    try:
        found = run_loop(collect())
    except (MetadataURIError, BKError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot read the cookies: {exc}") from None
    cookies = [v for k, v in found.items() if k != "unclean_shutdown_marker" and v is not None]
    if not cookies:
        where = ", ".join(k for k in found if k != "unclean_shutdown_marker")
        raise click.ClickException(
            f"no cookie in {where}: no bookie has started on these directories"
        )
    click.echo(json.dumps(found, indent=2))


@cookie_group.command("fix", help="Rewrite the cookies after a disk was lost or replaced.")
@click.option("--data-dir", type=click.Path(file_okay=False), required=True)
@click.option("--journal-dir", type=click.Path(file_okay=False), default=None)
@click.option("--bookie-id", required=True, help="The bookie's id (its host:port by default).")
@metadata_option
def cookie_fix(
    data_dir: str, journal_dir: str | None, bookie_id: str, metadata: str | None
) -> None:
    """Writes new cookies everywhere and sets the unclean-shutdown marker, so that the next start
    fences this bookie's ledgers and puts the open ones in limbo (BP-46): a fixed cookie alone
    would let a bookie that lost data answer as if it had not."""
    if not metadata:
        raise click.UsageError("--metadata (or AIOBK_METADATA) is required")
    config = _cookie_config(data_dir, journal_dir)

    async def fix() -> str:
        disk = OsDisk()
        store = open_store(metadata)
        try:
            cookie = await fix_cookies(
                disk, config, store, bookie_id, bookie_id, os.urandom(16).hex()
            )
            return cookie.instance_id
        finally:
            await store.close()
            await disk.close()

    try:
        instance = run_loop(fix())
    except (MetadataURIError, BKError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"cookies of {bookie_id} rewritten (instance {instance}); the next start fences")


def cookie_alias() -> click.Group:
    """``cookie_group`` under another parent, hidden from its help: one way to name a command
    is shown, an older one keeps working."""
    return click.Group(
        cookie_group.name,
        commands=cookie_group.commands,
        help=cookie_group.help,
        hidden=True,
        deprecated="Use `aiobk cookie`.",
    )
