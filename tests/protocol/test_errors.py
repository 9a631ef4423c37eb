from __future__ import annotations

import builtins

import pytest

from aiobk.protocol import StatusCode
from aiobk.protocol import errors as e


def test_every_bookie_status_but_ok_has_a_class() -> None:
    table = e.registered()
    for status in StatusCode:
        if status is StatusCode.EOK:
            continue
        assert status in table, status
        error = e.error_for_status(status, "boom")
        assert error.code == status
        assert str(error) == "boom"


def test_unknown_and_ok_statuses_give_the_base_class() -> None:
    assert type(e.error_for_status(StatusCode.EOK)) is e.BKError
    assert "unexpected status 9999" in str(e.error_for_status(9999))


def test_timeout_is_a_builtin_timeout() -> None:
    assert isinstance(e.OperationTimeoutError(), builtins.TimeoutError)
    assert e.OperationTimeoutError.retriable
    assert str(e.LedgerFencedError()).startswith("ledger is fenced")


def test_duplicate_codes_and_shadowing_names_are_rejected() -> None:
    with pytest.raises(TypeError, match="taken"):
        type("Dup", (e.BKError,), {"code": StatusCode.EFENCED})
    with pytest.raises(TypeError, match="shadows"):
        type("TimeoutError", (e.BKError,), {})
