"""The optional parts of the aiobk distribution, and the one line a command prints when the
part it needs is not installed.

``pip install aiobk`` is the client and the client side of the command line: the wire codec,
the metadata store's etcd client, click, and obstore to read offloaded ledgers. A server
command needs an extra: a bookie, the standalone cluster and a standalone autorecovery process
the ``bookie`` extra (RocksDB, the HTTP admin API, the Prometheus exporter, uvloop, and
aiobotocore for the sweep of incomplete S3 uploads), the benchmarks the ``bench`` extra (which
brings the bookie's too) and the Spark benchmark the ``spark`` extra besides. Such a command
checks before it imports anything of the server's, so that a client install answers with
``aiobk bookie start needs the bookie extra: pip install 'aiobk[bookie]'`` rather than a
traceback.

``EXTRAS`` names the distributions each extra brings, as pyproject.toml's
``optional-dependencies`` do (a test holds the two equal).
"""

from __future__ import annotations

import importlib.metadata
import sys

import click

_BOOKIE = (
    "rocksdict",
    "aiohttp",
    "prometheus-client",
    *(("uvloop",) if sys.platform != "win32" else ()),
    "aiobotocore",
)

EXTRAS: dict[str, tuple[str, ...]] = {
    "bookie": _BOOKIE,
    "spark": ("pyspark", "pyarrow"),
    "bench": (
        *_BOOKIE,
        "hdrhistogram",
        "rich",
        "lmdb",
        "cryptography",
        "nats-py",
        "redis",
        "matplotlib",
    ),
}


def missing(extra: str) -> list[str]:
    """The distributions of ``extra`` that are not installed."""
    absent = []
    for name in EXTRAS[extra]:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            absent.append(name)
    return absent


def extra_message(command: str, extra: str) -> str | None:
    """The one line refusing ``command`` while ``extra`` is not whole; None when it is."""
    absent = missing(extra)
    if not absent:
        return None
    return (
        f"{command} needs the {extra} extra: pip install 'aiobk[{extra}]' "
        f"(not installed: {', '.join(absent)})"
    )


def require_extras(command: str, *extras: str) -> None:
    """Refuse ``command`` with one line (exit status 1) unless every one of ``extras`` is
    installed."""
    for extra in extras:
        message = extra_message(command, extra)
        if message is not None:
            raise click.ClickException(message)


__all__ = ["EXTRAS", "extra_message", "missing", "require_extras"]
