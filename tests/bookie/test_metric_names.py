"""Metric names follow BookKeeper's where one maps: each help text that has a
BookKeeper counterpart names it in brackets, and the names it gives are BookKeeper's own."""

from __future__ import annotations

import re

from aiobk.metrics import AUTORECOVERY_HELP, BOOKIE_HELP, CLIENT_HELP

# Stat names of BookKeeper's BookKeeperServerStats and BookKeeperClientStats that aiobk
# figures stand for (copied by hand; a bracket naming anything else is a typo).
BOOKKEEPER_STATS = frozenset(
    {
        "SERVER_STATUS",
        "ADD_ENTRY_REQUEST",
        "ADD_ENTRY",
        "READ_ENTRY_REQUEST",
        "READ_ENTRY",
        "READ_ENTRY_LONG_POLL_WAIT",
        "JOURNAL_SYNC",
        "JOURNAL_FLUSH_LATENCY",
        "JOURNAL_FORCE_WRITE_BATCH_ENTRIES",
        "JOURNAL_FORCE_WRITE_BATCH_BYTES",
        "JOURNAL_WRITE_BYTES",
        "JOURNAL_QUEUE_SIZE",
        "JOURNAL_FORCE_WRITE_QUEUE_SIZE",
        "JOURNAL_NUM_FORCE_WRITES",
        "NUM_OPEN_LEDGERS",
        "GC_NUM_LEDGERS_DELETED",
        "GC_NUM_ENTRYLOGS_DELETED",
        "GC_NUM_ENTRYLOGS_COMPACTED",
        "NUM_ENSEMBLE_CHANGE",
        "SPECULATIVE_READ_COUNT",
        "NUM_PENDING_ADD",
    }
)
# The figures an operator of BookKeeper looks for first: each must have its aiobk counterpart.
EXPECTED = frozenset(
    {
        "SERVER_STATUS",
        "ADD_ENTRY_REQUEST",
        "READ_ENTRY",
        "READ_ENTRY_LONG_POLL_WAIT",
        "JOURNAL_SYNC",
        "JOURNAL_QUEUE_SIZE",
        "JOURNAL_FORCE_WRITE_BATCH_ENTRIES",
        "JOURNAL_FORCE_WRITE_BATCH_BYTES",
        "NUM_ENSEMBLE_CHANGE",
        "SPECULATIVE_READ_COUNT",
    }
)
TAG = re.compile(r"\[([A-Z][A-Z_]+)\]")


def _tags() -> dict[str, str]:
    found: dict[str, str] = {}
    for helps in (BOOKIE_HELP, AUTORECOVERY_HELP, CLIENT_HELP):
        for name, text in helps.items():
            for tag in TAG.findall(text):
                found[tag] = name
    return found


def test_every_bracketed_name_is_a_bookkeeper_stat() -> None:
    unknown = set(_tags()) - BOOKKEEPER_STATS
    assert not unknown, f"not BookKeeper stat names: {sorted(unknown)}"


def test_bookkeepers_main_figures_have_their_counterparts() -> None:
    missing = EXPECTED - set(_tags())
    assert not missing, f"no aiobk figure names BookKeeper's {sorted(missing)}"


def test_names_are_prometheus_names() -> None:
    for helps in (BOOKIE_HELP, AUTORECOVERY_HELP, CLIENT_HELP):
        for name in helps:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
