"""Where everything lives in the store, under the URI's prefix (``/aiobk`` by default)::

    PREFIX/instanceid                    the cluster record (JSON): written when the
                                         cluster is set up, what tells a prefix holding
                                         a cluster from an empty one
    PREFIX/ledgers/0000000000000000042   ledger metadata (JSON); ids zero-padded so that
                                         key order is id order for streaming lists
    PREFIX/idgen                         written once per allocation: the write's store
                                         revision is the new ledger id
    PREFIX/bookies/HOST:PORT             a live bookie's BookieServiceInfo, under its lease
    PREFIX/cookies/HOST:PORT             a bookie's cookie (BP-46)
    PREFIX/logs/NAME                     a log's ordered ledger list
    PREFIX/autorecovery/...              the auditor, under-replication marks, workers'
                                         claims (metadata.autorecovery has the list)
    PREFIX/offload/store                 the cluster's offload store (JSON)
    PREFIX/offload/ledgers/<id>          the offload work list: one empty key per ledger
                                         with an offload record or an attempt at one,
                                         the id zero-padded as in PREFIX/ledgers/

Nothing else in aiobk builds keys.
"""

from __future__ import annotations

import re

_LOG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_ID_DIGITS = 19


class KeyLayout:
    def __init__(self, prefix: str) -> None:
        cleaned = prefix.strip("/")
        self.root = ("/" + cleaned if cleaned else "/aiobk").encode()
        self.cluster = self.root + b"/instanceid"
        self.ledgers = self.root + b"/ledgers/"
        self.idgen = self.root + b"/idgen"
        self.bookies = self.root + b"/bookies/"
        self.cookies = self.root + b"/cookies/"
        self.logs = self.root + b"/logs/"
        recovery = self.autorecovery = self.root + b"/autorecovery/"
        self.auditor = recovery + b"auditor"
        self.autorecovery_status = recovery + b"status"
        self.autorecovery_disabled = recovery + b"disabled"
        self.audit_request = recovery + b"audit"
        self.audit_served = recovery + b"audit-served"
        self.cluster_secret = recovery + b"secret"
        self.underreplicated_prefix = recovery + b"underreplicated/"
        self.claims_prefix = recovery + b"claims/"
        self.attempts_prefix = recovery + b"attempts/"
        self.decommission_prefix = recovery + b"decommission/"
        offload = self.offload = self.root + b"/offload/"
        self.offload_store = offload + b"store"
        self.offloading_prefix = offload + b"ledgers/"

    def ledger(self, ledger_id: int) -> bytes:
        return self.ledgers + _padded(ledger_id)

    def ledger_id(self, key: bytes) -> int:
        return int(key[len(self.ledgers) :])

    def underreplicated(self, ledger_id: int) -> bytes:
        return self.underreplicated_prefix + _padded(ledger_id)

    def claim(self, ledger_id: int) -> bytes:
        return self.claims_prefix + _padded(ledger_id)

    def attempt(self, ledger_id: int) -> bytes:
        return self.attempts_prefix + _padded(ledger_id)

    def offloading(self, ledger_id: int) -> bytes:
        """The ledger's key in the offload work list."""
        return self.offloading_prefix + _padded(ledger_id)

    def decommission(self, bookie_id: str) -> bytes:
        return self.decommission_prefix + _component(bookie_id, "bookie id")

    @staticmethod
    def ledger_id_of(prefix: bytes, key: bytes) -> int:
        """The ledger id at the end of a key under ``prefix`` (a mark, a claim)."""
        return int(key[len(prefix) :])

    def bookie(self, bookie_id: str) -> bytes:
        return self.bookies + _component(bookie_id, "bookie id")

    def cookie(self, bookie_id: str) -> bytes:
        return self.cookies + _component(bookie_id, "bookie id")

    def log(self, name: str) -> bytes:
        if not _LOG_NAME.match(name):
            raise ValueError(
                f"log name {name!r}: use 1-200 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return self.logs + name.encode()

    def log_name(self, key: bytes) -> str:
        return key[len(self.logs) :].decode()


def _padded(ledger_id: int) -> bytes:
    if ledger_id < 0:
        raise ValueError(f"ledger ids are not negative, got {ledger_id}")
    return f"{ledger_id:0{_ID_DIGITS}d}".encode()


def _component(text: str, what: str) -> bytes:
    if not text or "/" in text or len(text) > 255:
        raise ValueError(f"{what} {text!r} must be 1-255 characters without '/'")
    return text.encode()
