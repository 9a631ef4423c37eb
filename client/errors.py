"""Client errors: one class per status, all under ``BKError`` with ``.code`` (API.md).

The classes live in ``protocol.errors`` so the metadata layer raises the same ones.
"""

from protocol.errors import (
    BadRequestError,
    BKError,
    BookieIOError,
    BookieUnavailableError,
    DataUnknownError,
    DigestMismatchError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    OperationTimeoutError,
    ProtocolVersionError,
    ReadOnlyBookieError,
    TooManyRequestsError,
    UnauthorizedError,
    error_for_status,
)

__all__ = [
    "BKError",
    "BadRequestError",
    "BookieIOError",
    "BookieUnavailableError",
    "DataUnknownError",
    "DigestMismatchError",
    "LedgerClosedError",
    "LedgerFencedError",
    "MetadataStoreError",
    "MetadataVersionError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "OperationTimeoutError",
    "ProtocolVersionError",
    "ReadOnlyBookieError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "error_for_status",
]
