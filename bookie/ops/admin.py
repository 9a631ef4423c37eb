"""HANDSHAKE, FORCE, GET_BOOKIE_INFO, GC, GC_REPORT and BOOKIE_STATE."""

from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING

from aiobk.bookie.config import ConfigError
from aiobk.bookie.errors import BookieStateError
from aiobk.protocol import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    BookieStateRequest,
    BookieStateResponse,
    ForceRequest,
    ForceResponse,
    GcReportRequest,
    GcReportResponse,
    GcRequest,
    GcResponse,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    HandshakeRequest,
    HandshakeResponse,
    StateChange,
    StatusCode,
)

if TYPE_CHECKING:
    from aiobk.bookie.context import BookieContext, Replier


def handle_handshake(ctx: BookieContext, request: HandshakeRequest, conn: Replier) -> None:
    """Every version from MIN_PROTOCOL_VERSION up is spoken: the answer names the one asked
    for; refused (EBADVERSION), it names the newest, for the client to ask again."""
    version = request.protocol_version
    if MIN_PROTOCOL_VERSION <= version <= PROTOCOL_VERSION:
        status = StatusCode.EOK
    else:
        status, version = StatusCode.EBADVERSION, PROTOCOL_VERSION
    conn.reply(HandshakeResponse(request.txn_id, status, version, ctx.admin.bookie_id))


def handle_force(ctx: BookieContext, request: ForceRequest, conn: Replier) -> None:
    """BP-14 sync: answer once everything this bookie holds for the ledger is durable. The
    ledger's master key is required, as on an add (an empty key was once let through);
    a ledger held without its key (BP-46) cannot be checked, so it is refused too.

    A ledger's first adds wait for ``KeyCheck`` to find the ledger in the metadata before this
    bookie holds it; a FORCE sent right behind them waits there too, in arrival order, and so
    covers what they stored (answered at once, it would find no ledger: ENOLEDGER)."""
    ledger_id = request.ledger_id
    if ctx.ledgers.get(ledger_id) is None and ctx.keys.looking_up(ledger_id):

        def admitted(status: StatusCode) -> None:
            if status is StatusCode.EOK:
                _force(ctx, request, conn)
            else:
                conn.reply(ForceResponse(request.txn_id, status, ledger_id))

        ctx.keys.admit(ctx, ledger_id, request.master_key, conn.origin, conn.roles, admitted)
        return
    _force(ctx, request, conn)


def _force(ctx: BookieContext, request: ForceRequest, conn: Replier) -> None:
    txn_id, ledger_id = request.txn_id, request.ledger_id
    state = ctx.ledgers.get(ledger_id)
    if state is None:
        conn.reply(ForceResponse(txn_id, StatusCode.ENOLEDGER, ledger_id))
        return
    if not state.master_key or not hmac.compare_digest(request.master_key, state.master_key):
        ctx.stats.auth_failures += 1
        conn.reply(ForceResponse(txn_id, StatusCode.EUA, ledger_id))
        return

    def done(error: BaseException | None) -> None:
        status = StatusCode.EIO if error is not None else StatusCode.EOK
        conn.reply(ForceResponse(txn_id, status, ledger_id, state.last_add_synced))

    if ctx.config.journal_write_data:
        ctx.journal.barrier(done)
        return

    async def sync_storage() -> None:
        # Journal-less (BP-46): the adds live in ledger storage, so that is what gets synced.
        try:
            await ctx.admin.checkpoint()
        except OSError as exc:
            done(exc)
            return
        entry = state.sync.last_add_synced + 1
        while state.location(entry) >= 0:
            state.sync.synced(entry)
            entry += 1
        done(None)

    conn.spawn(sync_storage())


def handle_bookie_info(ctx: BookieContext, request: GetBookieInfoRequest, conn: Replier) -> None:
    async def answer() -> None:
        free, total = await ctx.admin.disk_usage()
        figures = {**ctx.stats.as_dict(), **ctx.keys.stats.as_dict(), **ctx.admin.gauges()}
        conn.reply(GetBookieInfoResponse(request.txn_id, StatusCode.EOK, free, total, figures))

    conn.spawn(answer())


def handle_gc(ctx: BookieContext, request: GcRequest, conn: Replier) -> None:
    """Run a garbage collection pass now (``aiobk bookie gc``); answer with what it did."""

    async def run() -> None:
        try:
            result = await ctx.admin.collect_garbage()
        except (ConfigError, BookieStateError) as exc:
            conn.reply(GcResponse(request.txn_id, StatusCode.EBADREQ, detail=str(exc)))
            return
        except OSError as exc:
            conn.reply(GcResponse(request.txn_id, StatusCode.EIO, detail=str(exc)))
            return
        conn.reply(
            GcResponse(
                request.txn_id,
                StatusCode.EOK,
                len(result.ledgers_deleted),
                len(result.logs_removed),
                result.entries_moved,
                result.bytes_freed,
                result.skipped,
            )
        )

    conn.spawn(run())


def handle_gc_report(ctx: BookieContext, request: GcReportRequest, conn: Replier) -> None:
    """Each entry log's live and total bytes, and why garbage collection keeps it
    (``aiobk bookie gc --report``); no pass is run."""

    async def answer() -> None:
        try:
            report = await ctx.admin.gc_report()
        except OSError as exc:
            conn.reply(GcReportResponse(request.txn_id, StatusCode.EIO, str(exc)))
            return
        conn.reply(GcReportResponse(request.txn_id, StatusCode.EOK, json.dumps(report)))

    conn.spawn(answer())


def handle_bookie_state(ctx: BookieContext, request: BookieStateRequest, conn: Replier) -> None:
    """Report writable / read-only, or force read-only and lift it (``aiobk bookie state``).
    Lifting only clears the operator's reason: a full disk or a failed journal still holds."""
    state = ctx.write_state
    if request.change is not StateChange.QUERY:
        ctx.admin.set_read_only(request.change is StateChange.READ_ONLY)
    conn.reply(
        BookieStateResponse(
            request.txn_id,
            StatusCode.EOK,
            int(state.writable),
            "; ".join(state.reasons),
            int(state.high_priority),
            ctx.admin.checkpoint_error or "",
        )
    )
