"""Cookies and the unclean-shutdown marker (BookKeeper's "BP-46: Running without the journal",
"A note on cookies" and "Detecting Data Loss On Boot").

A cookie records a bookie's identity -- id, address, journal and data directories, instance id --
in every directory it uses and in the metadata store. On boot they must all exist and agree with
each other and with the configuration: a missing one means a directory was lost or replaced (the
data in it may be gone), a different one means the wrong disk or the wrong bookie. Either refuses
the boot with what differs, unless cookie fixing is allowed, in which case the cookies are
rewritten with a new instance id and the boot takes the data-loss path (fence and limbo).

The marker file ``UNCLEAN`` in the data directory is written (and synced) at start and removed
only by a clean stop: finding it at start means the last run ended in a crash.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from aiobk.bookie.config import BookieConfig
from aiobk.bookie.disk import Disk
from aiobk.metadata import Cookie, MetadataFormatError, MetadataStore
from aiobk.protocol.errors import CookieError

COOKIE_FILE = "COOKIE"
MARKER_FILE = "UNCLEAN"
LEGACY_INSTANCE_FILE = "INSTANCE"


def directories(config: BookieConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(journal directories, data directories) as the cookie names them."""
    return (os.path.abspath(config.journal_path),), (os.path.abspath(config.data_dir),)


@dataclass
class CookieCheck:
    cookie: Cookie
    first_boot: bool = False
    fixed: bool = False  # a failure was repaired: the boot must assume lost data
    problems: list[str] = field(default_factory=list)
    replaced_instances: tuple[str, ...] = ()  # instance ids the fix replaced


async def _read(disk: Disk, directory: str) -> Cookie | None:
    path = os.path.join(directory, COOKIE_FILE)
    if not await disk.exists(path):
        return None
    try:
        return Cookie.from_json(await disk.read_file(path))
    except MetadataFormatError as exc:
        raise CookieError(f"cookie in {directory} is unreadable: {exc}") from None


async def _write_everywhere(
    disk: Disk, store: MetadataStore | None, cookie: Cookie, remote: Cookie | None
) -> Cookie:
    for directory in {*cookie.journal_dirs, *cookie.data_dirs}:
        await disk.makedirs(directory)
        await disk.write_file_atomic(os.path.join(directory, COOKIE_FILE), cookie.to_json())
    if store is not None:
        target = Cookie(
            cookie.bookie_id,
            cookie.address,
            cookie.journal_dirs,
            cookie.data_dirs,
            cookie.instance_id,
            remote.version if remote is not None else -1,
        )
        cookie = await store.write_cookie(target)
    return cookie


async def check_cookies(
    disk: Disk,
    config: BookieConfig,
    store: MetadataStore | None,
    bookie_id: str,
    address: str,
    new_instance: str,
) -> CookieCheck:
    """Validate (or on first boot, create) the cookies; CookieError if they disagree."""
    journal_dirs, data_dirs = directories(config)
    expected_dirs = list(dict.fromkeys([*journal_dirs, *data_dirs]))
    local = {d: await _read(disk, d) for d in expected_dirs}
    remote = await store.read_cookie(bookie_id) if store is not None else None
    found = [c for c in local.values() if c is not None]
    if not found and remote is None:
        legacy = os.path.join(config.data_dir, LEGACY_INSTANCE_FILE)
        instance = new_instance
        if await disk.exists(legacy):  # a data directory from before cookies existed
            instance = (await disk.read_file(legacy)).decode().strip() or new_instance
        cookie = Cookie(bookie_id, address, journal_dirs, data_dirs, instance)
        cookie = await _write_everywhere(disk, store, cookie, None)
        return CookieCheck(cookie, first_boot=True)
    wanted: Cookie | None = found[0] if found else remote
    assert wanted is not None
    problems: list[str] = []
    for directory, held in local.items():
        if held is None:
            problems.append(f"{directory} has no cookie (was it wiped or replaced?)")
        elif held != wanted:
            problems.extend(f"{directory}: {d}" for d in held.differences(wanted))
    if store is not None:
        if remote is None:
            problems.append(f"the metadata store has no cookie for bookie {bookie_id}")
        elif remote != wanted:
            problems.extend(f"metadata store: {d}" for d in remote.differences(wanted))
    current = Cookie(bookie_id, address, journal_dirs, data_dirs, wanted.instance_id)
    problems.extend(f"configuration: {d}" for d in wanted.differences(current))
    if not problems:
        return CookieCheck(remote if remote is not None else wanted)
    if not config.allow_cookie_fix:
        raise CookieError(
            "refusing to start, the bookie's cookies disagree: "
            + "; ".join(problems)
            + ". If data may have been lost, run `aiobk cookie fix` (the next start then fences "
            "and recovers this bookie's ledgers) or set allow_cookie_fix"
        )
    fixed = Cookie(bookie_id, address, journal_dirs, data_dirs, new_instance)
    fixed = await _write_everywhere(disk, store, fixed, remote)
    replaced = tuple({c.instance_id for c in [*found, remote] if c is not None})
    return CookieCheck(fixed, fixed=True, problems=problems, replaced_instances=replaced)


async def fix_cookies(
    disk: Disk,
    config: BookieConfig,
    store: MetadataStore | None,
    bookie_id: str,
    address: str,
    new_instance: str,
) -> Cookie:
    """Operator's fix: new cookies everywhere, and the marker so the next boot protects."""
    journal_dirs, data_dirs = directories(config)
    remote = await store.read_cookie(bookie_id) if store is not None else None
    cookie = Cookie(bookie_id, address, journal_dirs, data_dirs, new_instance)
    cookie = await _write_everywhere(disk, store, cookie, remote)
    await set_marker(disk, config)
    return cookie


async def marker_present(disk: Disk, config: BookieConfig) -> bool:
    return await disk.exists(os.path.join(config.data_dir, MARKER_FILE))


async def set_marker(disk: Disk, config: BookieConfig) -> None:
    """Its existence is the mark, so it is empty: creating it needs no data block, and a
    bookie can start on a disk with no byte left (it is already there after a crash)."""
    path = os.path.join(config.data_dir, MARKER_FILE)
    await disk.makedirs(config.data_dir)
    if not await disk.exists(path):
        await disk.write_file_atomic(path, b"")


async def clear_marker(disk: Disk, config: BookieConfig) -> None:
    path = os.path.join(config.data_dir, MARKER_FILE)
    if await disk.exists(path):
        await disk.remove(path)
        await disk.sync_dir(config.data_dir)
