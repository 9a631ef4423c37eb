"""Status codes carried by every response, after BookKeeper's BookieProtocol codes.

BookKeeper's "BP-46: Running without the journal" ("A note on Response Codes") sorts them in
three kinds that recovery treats differently:
positive (EOK), explicit negative (ENOLEDGER, ENOENTRY) and unknown (everything else).
"""

from __future__ import annotations

from enum import IntEnum


class StatusCode(IntEnum):
    EOK = 0
    ENOLEDGER = 1  # the bookie has never seen the ledger
    ENOENTRY = 2  # the bookie has the ledger but not the entry
    EBADREQ = 100  # malformed or invalid request
    EIO = 101  # I/O or checksum error on the bookie
    EUA = 102  # unauthorized: master key (password) mismatch
    EBADVERSION = 103  # protocol version not supported
    EFENCED = 104  # ledger fenced: normal adds refused
    EREADONLY = 105  # bookie is read-only
    ETOOMANYREQUESTS = 106  # bookie is shedding load
    EUNKNOWN = 107  # BP-46: a limbo ledger cannot say "no such entry"
    EPERM = 108  # not on this connection: TLS or a handshake first, or a role it lacks

    @property
    def is_explicit_negative(self) -> bool:
        """BP-46 "A note on Response Codes": only these may count toward a negative quorum."""
        return self in (StatusCode.ENOLEDGER, StatusCode.ENOENTRY)
