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
    """Base of every aiobk error: ``code`` names the condition (a bookie status, or a negative
    client code after BookKeeper's), ``retriable`` says whether the same call may succeed later.

    Catch it to handle any aiobk failure; ``OSError`` never leaves the client."""

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
    """The ledger does not exist: never created, or deleted (and perhaps garbage-collected
    on the bookies already).

    Not retriable. A writer whose ledger was deleted stops; check the id, or whether another
    party (a log's truncation, an operator) deleted it."""

    code = StatusCode.ENOLEDGER
    default_message = "no such ledger"


class NoSuchEntryError(BKError):
    """The entry is not there: past the last add confirmed of a ``read()``, or on no bookie
    that should hold it.

    Not retriable as asked. Read at or below ``last_add_confirmed`` (or use
    ``read_unconfirmed``); wait for the LAC with ``wait_for_lac`` or ``read_from``."""

    code = StatusCode.ENOENTRY
    default_message = "no such entry"


class BadRequestError(BKError):
    """A bookie refused a malformed request: a field storage cannot hold, or an entry it
    holds already with other bytes.

    Not retriable: a bug in the caller, or an attempt to rewrite an entry."""

    code = StatusCode.EBADREQ
    default_message = "the bookie rejected a malformed request"


class BookieIOError(BKError):
    """A bookie met an I/O error or a damaged copy (a failed checksum) and said so rather
    than guess.

    Retriable: reads move to another copy by themselves; writes replace the bookie. Seen by
    an application only when every copy failed: check the bookies' logs and disks."""

    code = StatusCode.EIO
    retriable = True
    default_message = "I/O or checksum error on the bookie"


class UnauthorizedError(BKError):
    """Wrong password: the ledger's master key does not match the one given.

    Not retriable: open, write or delete the ledger with the password it was created with."""

    code = StatusCode.EUA
    default_message = "wrong password for this ledger"


class PermissionDeniedError(BKError):
    """The bookie refused the request on this connection: it wants TLS (``tls_only``) or a
    handshake first, or the connection's certificate lacks the role the request needs.

    Not retriable as configured: connect with TLS, or use a certificate whose OU holds the
    role the message names."""

    code = StatusCode.EPERM
    default_message = "not permitted on this connection (TLS, handshake or role)"


class ProtocolVersionError(BKError):
    """The bookie does not speak the protocol version asked for.

    Not retriable: upgrade the older side (clients fall back to a bookie's version by
    themselves; this is seen with a bookie older than any version the client speaks)."""

    code = StatusCode.EBADVERSION
    default_message = "protocol version not supported by the bookie"


class LedgerFencedError(BKError):
    """The ledger is fenced: another client opened it with recovery (or closed it), so this
    writer may not add to it any more.

    Not retriable on this handle: the writer has lost the ledger for good. Open it to read what
    recovery kept; a log writer taken over by another gets ``LogFencedError``."""

    code = StatusCode.EFENCED
    default_message = "ledger is fenced: another client is recovering or has closed it"


class LogFencedError(LedgerFencedError):
    """Another writer opened the log: this writer's next append (and every later one) fails.

    Not retriable on this writer: the log has a new writer; stop, or open a writer again to
    take the log back (which fences the other one)."""

    default_message = "log is fenced: another writer has taken it over"


class ReadOnlyBookieError(BKError):
    """The bookie is read-only (a full disk, a failed journal, or an operator) and refused
    an add.

    Retriable: a writer replaces the bookie in its ensemble by itself; free disk space or run
    ``aiobk bookie state --writable`` to bring it back."""

    code = StatusCode.EREADONLY
    retriable = True
    default_message = "bookie is read-only"


class TooManyRequestsError(BKError):
    """The bookie is at a bound a peer may not pass (long polls waiting at once).

    Retriable: back off and try again, or spread the load over fewer long polls."""

    code = StatusCode.ETOOMANYREQUESTS
    retriable = True
    default_message = "bookie is overloaded"


class DataUnknownError(BKError):
    """A bookie in limbo (after possible data loss, BP-46) cannot tell whether it has the
    entry, and says so rather than answer "no such entry".

    Retriable: reads try the other copies first, so this is seen only when none of them had
    the entry either; the bookie repairs itself from its peers meanwhile."""

    code = StatusCode.EUNKNOWN
    retriable = True
    default_message = "bookie cannot tell whether it has the entry (ledger in limbo)"


# --- client-side failures (codes after BookKeeper's BKException) ---------------------


class DigestMismatchError(BKError):
    """An entry's digest (CRC32C or HMAC-SHA256) does not match its bytes: the copy is damaged
    or forged.

    Not retriable for that copy: reads move to another copy by themselves, so an application
    sees it only when no copy verifies. With a ``mac`` ledger, check the password."""

    code = -5
    default_message = "entry digest does not match: the copy is damaged"


class NotEnoughBookiesError(BKError):
    """Too few writable bookies to form or repair an ensemble of the size asked for.

    Retriable: start more bookies, make read-only ones writable, or ask for a smaller
    ensemble. A ledger that met it can still be closed at what was acknowledged."""

    code = -6
    retriable = True
    default_message = "not enough writable bookies"


class BookieUnavailableError(BKError):
    """A bookie could not be reached (refused, reset, or TLS failed) for a request that
    needs that bookie in particular (``force()`` needs every bookie of the ensemble).

    Retriable: writes and reads route around a lost bookie by themselves; retry a ``force()``
    once the bookie is back, or close the ledger."""

    code = -8
    retriable = True
    default_message = "bookie unavailable"


class MetadataStoreError(BKError):
    """The metadata store (etcd) could not be reached or answered an error, past the
    retries and timeouts of ``ClientConfig``.

    Retriable: check etcd's health and the URI; the same call works once etcd is back."""

    code = -9
    retriable = True
    default_message = "metadata store unavailable"


class LedgerRecoveryError(BKError):
    """Recovery could not decide the ledger's last entry: too many bookies of some write
    set could not say whether they hold an entry.

    Retriable: open the ledger again once more of its bookies are reachable. Nothing was
    closed, so no entry was cut off."""

    code = -10
    retriable = True
    default_message = "ledger recovery could not decide the last entry; try again"


class LedgerClosedError(BKError):
    """The ledger (handle) is closed: no more appends.

    Not retriable on this handle: create a new ledger, or let a log writer roll to one."""

    code = -11
    default_message = "ledger is closed"


class LedgerExistsError(BKError):
    """A ledger with this id exists already.

    Not retriable with the same id; ids come from the metadata store, so an application that
    lets the client pick them never sees this."""

    code = -20
    default_message = "a ledger with this id already exists"


class NoSuchLogError(BKError):
    """The log does not exist (never created, or deleted).

    Not retriable: check the name; ``open_log_writer`` creates a log unless ``create=False``."""

    code = -40
    default_message = "no such log"


class LogExistsError(BKError):
    """A log with this name exists already.

    Not retriable: open it instead of creating it."""

    code = -41
    default_message = "a log with this name already exists"


class BookieAlreadyRegisteredError(BKError):
    """A live bookie is registered under this bookie id already.

    Not retriable while that bookie lives: give each bookie its own id (or stop the other)."""

    code = -42
    default_message = "a live bookie is already registered under this id"


class CookieError(BKError):
    """A bookie's cookie is missing or differs from the one in the metadata store (a wiped
    or swapped disk, a changed address), so the bookie refuses to start.

    Not retriable: restore the directory, or run ``aiobk cookie fix`` (the next start then
    fences and repairs, BP-46)."""

    code = -43
    default_message = "bookie cookie missing or different"


class EntryTooLargeError(BKError):
    """An append whose add request would not fit in one frame: refused before it takes an
    entry id (a bookie would drop the connection, and every replacement would too).

    Not retriable: split the payload (the bookies' ``max_frame_size``, 5 MiB by default,
    bounds one entry with its headers)."""

    code = -44
    default_message = "entry too large for one add request frame"


class ReadTooLargeError(BKError):
    """A ``read()`` whose entries pass ``ClientConfig.max_read_bytes``.

    Not retriable as asked: stream the range with ``ReadHandle.read_iter`` instead of holding
    it all, or read a smaller range."""

    code = -45
    default_message = "read range larger than max_read_bytes; stream it with read_iter()"


class NoSuchClusterError(BKError):
    """The metadata service URI names a prefix where no aiobk cluster was ever set up: no
    cluster record, and none of the keys a cluster writes (a mistyped prefix, most likely)."""

    code = -46
    default_message = "no aiobk cluster under this metadata prefix"


class ObjectStoreError(BKError):
    """The object store that holds offloaded ledgers did not answer: unreachable, refusing,
    or slower than its timeout.

    Retriable: the objects are still there; an offload in progress leaves nothing it cannot
    finish or clean up later."""

    code = -47
    retriable = True
    default_message = "object store unavailable"


class NoSuchObjectError(ObjectStoreError):
    """An object the metadata names is not in the store: deleted by hand, or a store that
    is not the one the ledger was offloaded to.

    Not retriable: the copy is gone; the bookies' copies are the only others, if they have
    not been released."""

    code = -48
    retriable = False
    default_message = "no such object in the object store"


class NoOffloadStoreError(BKError):
    """An offload asked of a cluster with no offload store set.

    Not retriable as asked: set the cluster's store first (``aiobk offload store URL``)."""

    code = -50
    default_message = "no offload store is set for this cluster"


class MalformedObjectError(BKError):
    """An offloaded ledger's object is not what the format says: a bad magic word, a version
    this release cannot read, a checksum that does not match, lengths past its end.

    Not retriable: the object is damaged or is not an aiobk object."""

    code = -49
    default_message = "malformed offload object"


class MetadataVersionError(BKError):
    """A compare-and-set on ledger or log metadata lost: someone else changed it since it
    was read.

    Retriable: read the metadata again and redo the change; the client does this itself for
    its own changes, so an application sees it only when retries ran out."""

    code = -17
    retriable = True
    default_message = "metadata changed concurrently (compare-and-set lost)"


class OperationTimeoutError(BKError, builtins.TimeoutError):
    """An operation took longer than its timeout (``ClientConfig``); also a
    ``TimeoutError``.

    Retriable: whether the operation took effect is unknown (an append may have landed)."""

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
