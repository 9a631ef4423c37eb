"""The error registry: one exception class per status or client-side failure.

Every class has a ``code`` (the bookie ``StatusCode`` it stands for, or a negative client code
after BookKeeper's BKException codes) and a ``retriable`` flag. ``error_for_status`` maps a
status from the wire to its class. Codes are unique: a duplicate fails at import. Lives in the
pure ``protocol`` package so that ``metadata`` and ``client`` raise the same classes;
``client.errors`` is the public name.
"""

from __future__ import annotations

import builtins
from typing import ClassVar

from aiobk.protocol.status import StatusCode

_REGISTRY: dict[int, type[BKError]] = {}


class BKError(Exception):
    code: ClassVar[int] = -1
    retriable: ClassVar[bool] = False
    default_message: ClassVar[str] = "bookkeeper error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.default_message)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__name__ in vars(builtins):
            raise TypeError(f"{cls.__name__} shadows a built-in name")
        if "code" in vars(cls):
            if cls.code in _REGISTRY:
                raise TypeError(f"error code {cls.code} is taken by {_REGISTRY[cls.code].__name__}")
            _REGISTRY[cls.code] = cls


# --- bookie statuses ---------------------------------------------------------------


class NoSuchLedgerError(BKError):
    code = StatusCode.ENOLEDGER
    default_message = "no such ledger"


class NoSuchEntryError(BKError):
    code = StatusCode.ENOENTRY
    default_message = "no such entry"


class BadRequestError(BKError):
    code = StatusCode.EBADREQ
    default_message = "the bookie rejected a malformed request"


class BookieIOError(BKError):
    code = StatusCode.EIO
    retriable = True
    default_message = "I/O or checksum error on the bookie"


class UnauthorizedError(BKError):
    code = StatusCode.EUA
    default_message = "wrong password for this ledger"


class PermissionDeniedError(BKError):
    """The bookie refused the request on this connection: it wants TLS (``tls_only``) or a
    handshake first, or the connection's certificate lacks the role the request needs."""

    code = StatusCode.EPERM
    default_message = "not permitted on this connection (TLS, handshake or role)"


class ProtocolVersionError(BKError):
    code = StatusCode.EBADVERSION
    default_message = "protocol version not supported by the bookie"


class LedgerFencedError(BKError):
    code = StatusCode.EFENCED
    default_message = "ledger is fenced: another client is recovering or has closed it"


class LogFencedError(LedgerFencedError):
    """Another writer opened the log: this writer's next append (and every later one) fails."""

    default_message = "log is fenced: another writer has taken it over"


class ReadOnlyBookieError(BKError):
    code = StatusCode.EREADONLY
    retriable = True
    default_message = "bookie is read-only"


class TooManyRequestsError(BKError):
    code = StatusCode.ETOOMANYREQUESTS
    retriable = True
    default_message = "bookie is overloaded"


class DataUnknownError(BKError):
    code = StatusCode.EUNKNOWN
    retriable = True
    default_message = "bookie cannot tell whether it has the entry (ledger in limbo)"


# --- client-side failures (codes after BookKeeper's BKException) ---------------------


class DigestMismatchError(BKError):
    code = -5
    default_message = "entry digest does not match: the copy is damaged"


class NotEnoughBookiesError(BKError):
    code = -6
    retriable = True
    default_message = "not enough writable bookies"


class BookieUnavailableError(BKError):
    code = -8
    retriable = True
    default_message = "bookie unavailable"


class MetadataStoreError(BKError):
    code = -9
    retriable = True
    default_message = "metadata store unavailable"


class LedgerRecoveryError(BKError):
    code = -10
    retriable = True
    default_message = "ledger recovery could not decide the last entry; try again"


class LedgerClosedError(BKError):
    code = -11
    default_message = "ledger is closed"


class LedgerExistsError(BKError):
    code = -20
    default_message = "a ledger with this id already exists"


class NoSuchLogError(BKError):
    code = -40
    default_message = "no such log"


class LogExistsError(BKError):
    code = -41
    default_message = "a log with this name already exists"


class BookieAlreadyRegisteredError(BKError):
    code = -42
    default_message = "a live bookie is already registered under this id"


class CookieError(BKError):
    code = -43
    default_message = "bookie cookie missing or different"


class EntryTooLargeError(BKError):
    """An append whose add request would not fit in one frame: refused before it takes an
    entry id (a bookie would drop the connection, and every replacement would too)."""

    code = -44
    default_message = "entry too large for one add request frame"


class ReadTooLargeError(BKError):
    """A ``read()`` whose entries pass ``ClientConfig.max_read_bytes``: stream the range with
    ``ReadHandle.read_iter`` instead of holding it all."""

    code = -45
    default_message = "read range larger than max_read_bytes; stream it with read_iter()"


class NoSuchClusterError(BKError):
    """The metadata service URI names a prefix where no aiobk cluster was ever set up: no
    cluster record, and none of the keys a cluster writes (a mistyped prefix, most likely)."""

    code = -46
    default_message = "no aiobk cluster under this metadata prefix"


class MetadataVersionError(BKError):
    code = -17
    retriable = True
    default_message = "metadata changed concurrently (compare-and-set lost)"


class OperationTimeoutError(BKError, builtins.TimeoutError):
    code = -23
    retriable = True
    default_message = "operation timed out"


def error_for_status(status: int, message: str | None = None) -> BKError:
    """The exception for a non-OK status from a bookie."""
    cls = _REGISTRY.get(int(status))
    if cls is None or status == StatusCode.EOK:
        return BKError(message or f"unexpected status {status}")
    return cls(message)


def registered() -> dict[int, type[BKError]]:
    return dict(_REGISTRY)
