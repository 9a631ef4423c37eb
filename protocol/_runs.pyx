# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A READ_RANGE answer's bodies split and checked in C, in one pass, for a reader that keeps
them as served (a copy of a closed ledger).

``check_run`` stands for ``aiobk.protocol.batch.unpack_range`` followed by the digest check of
each body (``aiobk.client.digest.Digester.check_body``): it returns the bodies when every one of
them passes every check, and None otherwise -- an answer it does not take whole (a damaged
body, a MAC to check, odd arguments) goes to the pure-Python path, which says exactly what is
wrong and where. ``aiobk.client.run_check`` chooses it, and the tests hold the two equal.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uint64_t


cdef extern from "_crc32c.h":
    void aiobk_crc32c_init()
    uint32_t aiobk_crc32c(uint32_t crc, const unsigned char *p, size_t n) nogil


aiobk_crc32c_init()

from aiobk.protocol.batch import MAX_BATCH_ENTRIES as _MAX_BATCH_ENTRIES
from aiobk.protocol.entry import ENTRY_FORMAT_VERSION as _ENTRY_FORMAT_VERSION
from aiobk.protocol.entry import HEADER_SIZE as _HEADER_SIZE
from aiobk.protocol.entry import DigestType as _DigestType
from aiobk.protocol.limits import MAX_ENTRY_ID as _MAX_ENTRY_ID

cdef Py_ssize_t MAX_BATCH_ENTRIES = _MAX_BATCH_ENTRIES
cdef Py_ssize_t HEADER_SIZE = _HEADER_SIZE  # u8 version, u8 digest type, 4 x i64
cdef int ENTRY_FORMAT_VERSION = _ENTRY_FORMAT_VERSION
cdef int DUMMY = _DigestType.DUMMY
cdef int CRC32C = _DigestType.CRC32C
cdef int MAC = _DigestType.MAC
cdef Py_ssize_t MAC_SIZE = _DigestType.MAC.size

cdef object _INT64_MIN = -(2**63)
cdef object _INT64_LIMIT = 2**63


cdef inline uint32_t get32(const unsigned char *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline int64_t get64(const unsigned char *p) noexcept nogil:
    return <int64_t>((<uint64_t>get32(p) << 32) | get32(p + 4))


cdef inline bint _is_int64(object value):
    return type(value) is int and _INT64_MIN <= value < _INT64_LIMIT


def check_run(packed, ledger_id, first, last, kind, check_digest):
    """The bodies of ``packed`` (a READ_RANGE answer for entries ``first``..``last`` of
    ``ledger_id``) when each is entry ``first``, ``first + 1``, ... of the ledger, of digest
    type ``kind`` and (with ``check_digest``) carries the digest of its bytes; else None."""
    if not (
        type(packed) is bytes
        and _is_int64(ledger_id)
        and _is_int64(first)
        and _is_int64(last)
        and 0 <= first
        and last <= _MAX_ENTRY_ID
        and type(kind) is int
        and kind in (DUMMY, CRC32C, MAC)
    ):
        return None
    cdef int digest_kind = kind
    cdef bint digest = bool(check_digest) and digest_kind != DUMMY
    if digest and digest_kind == MAC:
        return None  # keyed by the ledger's password: hashlib's HMAC, on the pure path
    cdef Py_ssize_t digest_size = (
        0 if digest_kind == DUMMY else 4 if digest_kind == CRC32C else MAC_SIZE
    )
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(packed)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(packed), at = 0, count = 0, size
    cdef int64_t ledger = ledger_id, expected = first, stop = last
    cdef const unsigned char *head
    cdef uint32_t crc
    cdef list bodies = []
    while at < end:
        if count == MAX_BATCH_ENTRIES or end - at < 4 or expected > stop:
            return None
        size = get32(p + at)
        at += 4
        if size < HEADER_SIZE + digest_size or size > end - at:
            return None
        head = p + at
        if (
            head[0] != ENTRY_FORMAT_VERSION
            or head[1] != digest_kind
            or get64(head + 2) != ledger
            or get64(head + 10) != expected
        ):
            return None
        if digest and digest_kind == CRC32C:
            # the digest covers the header, then the payload after the digest
            crc = aiobk_crc32c(0, head, <size_t>HEADER_SIZE)
            crc = aiobk_crc32c(crc, head + HEADER_SIZE + 4, <size_t>(size - HEADER_SIZE - 4))
            if crc != get32(head + HEADER_SIZE):
                return None
        bodies.append(PyBytes_FromStringAndSize(<const char *>head, size))
        at += size
        count += 1
        expected += 1
    if count == 0:
        return None
    return bodies
