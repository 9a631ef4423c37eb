"""Request handlers, one module per operation, and the table the connection dispatches on."""

from __future__ import annotations

from aiobk.bookie.context import Handler
from aiobk.bookie.ops.add import handle_add
from aiobk.bookie.ops.add_batch import handle_add_batch
from aiobk.bookie.ops.admin import (
    handle_bookie_info,
    handle_bookie_state,
    handle_force,
    handle_gc,
    handle_gc_report,
    handle_handshake,
)
from aiobk.bookie.ops.lac import handle_read_lac, handle_write_lac
from aiobk.bookie.ops.ledger_key import handle_ledger_key
from aiobk.bookie.ops.read import handle_read
from aiobk.bookie.ops.read_range import handle_read_range
from aiobk.protocol import OpCode

HANDLERS: dict[OpCode, Handler] = {
    OpCode.HANDSHAKE: handle_handshake,
    OpCode.ADD: handle_add,
    OpCode.ADD_BATCH: handle_add_batch,
    OpCode.READ: handle_read,
    OpCode.READ_RANGE: handle_read_range,
    OpCode.READ_LAC: handle_read_lac,
    OpCode.WRITE_LAC: handle_write_lac,
    OpCode.FORCE: handle_force,
    OpCode.GET_BOOKIE_INFO: handle_bookie_info,
    OpCode.GC: handle_gc,
    OpCode.GC_REPORT: handle_gc_report,
    OpCode.BOOKIE_STATE: handle_bookie_state,
    OpCode.LEDGER_KEY: handle_ledger_key,
}

__all__ = ["HANDLERS", "Handler"]
