"""The short version of `make chaos` that runs in `make test`: a few seconds of real faults on
real processes, with the journal and without, and the checker's verdict. Its first fault wipes
a bookie for good (autorecovery repairs what it held; I15 judges the copies at the end)."""

from __future__ import annotations

import pytest

from tests.chaos.run import run_chaos


@pytest.mark.timeout(300)
@pytest.mark.parametrize("journal_less", [False, True], ids=["journal", "journal-less"])
async def test_short_chaos_run_holds_every_invariant(journal_less: bool) -> None:
    # Six faults in 8 s: a (re)started bookie comes up beside the next faults (a start that took
    # the rest of a 6 s run on a loaded machine once left a run with one fault).
    result = await run_chaos(8.0, 6, journal_less=journal_less, seed=1, wipes=1)
    assert not result.violations, result.summary() + "\n" + "\n".join(result.log)
    assert result.acknowledged > 100
    assert sum(result.faults.values()) >= 2
    assert len(result.wiped) == 1
    assert result.restored_copies > 0
