"""The ``aiobk`` commands, one module per command group (the wiring layer: the only place that
imports click and rich besides the benchmarks)."""

from aiobk.commands.bookie import bookie_group
from aiobk.commands.bookies import bookies_group
from aiobk.commands.common import QuietPipeGroup, run_group, with_log_level, with_tls_options
from aiobk.commands.cookie import cookie_group
from aiobk.commands.ledger import ledger_group
from aiobk.commands.log import log_group
from aiobk.commands.simpletest import simpletest_command
from aiobk.commands.standalone import standalone_command

__all__ = [
    "QuietPipeGroup",
    "bookie_group",
    "bookies_group",
    "cookie_group",
    "ledger_group",
    "log_group",
    "run_group",
    "simpletest_command",
    "standalone_command",
    "with_log_level",
    "with_tls_options",
]
