# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A copy's per-entry work in C: a READ_RANGE answer's bodies split and checked in one pass, for
a reader that keeps them as served (a copy of a closed ledger), and those bodies packed into an
offload object's block (``pack_run``, the compiled twin of
``aiobk.protocol.offload_object.pack_run``, which chooses it).

``check_run`` stands for ``aiobk.protocol.batch.unpack_range`` followed by the digest check of
each body (``aiobk.client.digest.Digester.check_body``): it returns the bodies when every one of
them passes every check, and None otherwise -- an answer it does not take whole (a damaged
body, a MAC to check, odd arguments) goes to the pure-Python path, which says exactly what is
wrong and where. ``aiobk.client.run_check`` chooses it, and the tests hold the two equal.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef extern from "_bigendian.h":
    void put32 "aiobk_put32"(unsigned char *p, uint32_t v) noexcept nogil
    void put64 "aiobk_put64"(unsigned char *p, uint64_t v) noexcept nogil
    uint32_t get32 "aiobk_get32"(const unsigned char *p) noexcept nogil
    int64_t get64 "aiobk_get64"(const unsigned char *p) noexcept nogil


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


cdef enum:
    BLOCK_HEADER = 16  # an object block's header (magic, count, first entry)
    RECORD = 16  # an index record: u64 offset, u32 length, u32 CRC32C


def _pure_pack_run(block, block_size, records, offset, bodies, first):
    from aiobk.protocol.offload_object import pack_run  # at call time: no cycle at import

    return pack_run(block, block_size, records, offset, bodies, first)


def pack_run(block, block_size, records, offset, bodies, first):
    """``aiobk.protocol.offload_object.pack_run``, with one resize of ``block`` and of
    ``records``: arguments of the shapes the encoder passes (bytearrays, exact ints in range,
    a list or tuple of ``bytes``); anything else goes to the pure function."""
    if not (
        type(block) is bytearray
        and type(records) is bytearray
        and (type(bodies) is list or type(bodies) is tuple)
        and _is_int64(block_size)
        and _is_int64(offset)
        and type(first) is int
        and 0 <= first <= len(bodies)
        and offset >= 0
        and block_size < 2**40
        and offset < 2**62
        and PyByteArray_GET_SIZE(block) >= BLOCK_HEADER
    ):
        return _pure_pack_run(block, block_size, records, offset, bodies, first)
    cdef Py_ssize_t count = len(bodies), i, stop = first, size
    for i in range(first, count):
        if type(bodies[i]) is not bytes or PyBytes_GET_SIZE(bodies[i]) > 0xFFFFFFFF:
            return _pure_pack_run(block, block_size, records, offset, bodies, first)
    cdef Py_ssize_t used = PyByteArray_GET_SIZE(block), start = used, limit = block_size
    # how many fit: an entry goes in while the block stays within ``block_size``, and a block's
    # first entry always does; the block is full once it reaches ``block_size``
    while stop < count:
        size = PyBytes_GET_SIZE(bodies[stop])
        if used > BLOCK_HEADER and used + 4 + size > limit:
            break
        used += 4 + size
        stop += 1
        if used >= limit:
            break
    if stop == first:
        return stop
    cdef Py_ssize_t had = PyByteArray_GET_SIZE(records)
    PyByteArray_Resize(block, used)
    PyByteArray_Resize(records, had + RECORD * (stop - first))
    cdef unsigned char *out = <unsigned char *>PyByteArray_AS_STRING(block) + start
    cdef unsigned char *index = <unsigned char *>PyByteArray_AS_STRING(records) + had
    cdef uint64_t at = <uint64_t>offset + <uint64_t>start
    cdef object body
    cdef const unsigned char *data
    for i in range(first, stop):
        body = bodies[i]
        size = PyBytes_GET_SIZE(body)
        data = <const unsigned char *>PyBytes_AS_STRING(body)
        put32(out, <uint32_t>size)
        memcpy(out + 4, data, size)
        put64(index, at + 4)
        put32(index + 8, <uint32_t>size)
        put32(index + 12, aiobk_crc32c(0, data, <size_t>size))
        out += 4 + size
        index += RECORD
        at += 4 + size
    return stop


def check_entries(data, base, records, start, stop):
    """True when every entry ``start``..``stop - 1`` of ``records`` (the index's entry records:
    big-endian u64 offset, u32 length, u32 CRC32C each) lies in the block ``data``, which starts
    at ``base`` in the object, after a length prefix equal to its length, and has its CRC32C;
    else False, leaving the block to the pure checks
    (``aiobk.protocol.offload_object.check_block``), which say what is wrong."""
    if not (
        type(data) is bytes
        and type(records) is bytes
        and _is_int64(base)
        and type(start) is int
        and type(stop) is int
        and 0 <= start <= stop <= PyBytes_GET_SIZE(records) // RECORD
    ):
        return False
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef const unsigned char *record = <const unsigned char *>PyBytes_AS_STRING(records)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data), i
    cdef uint64_t origin = <uint64_t><int64_t>base, offset
    cdef uint32_t length
    if <int64_t>base < 0:
        return False
    for i in range(start, stop):
        offset = <uint64_t>get64(record + RECORD * i)
        length = get32(record + RECORD * i + 8)
        if offset < origin + 4 or length > end or offset - origin > <uint64_t>(end - length):
            return False
        if get32(p + (offset - origin) - 4) != length:
            return False
        if aiobk_crc32c(0, p + (offset - origin), length) != get32(record + RECORD * i + 12):
            return False
    return True


def check_tiling(entries, blocks, start, end):
    """True when the index's ``blocks`` records (u64 offset, u32 length, u32 first position
    each) and ``entries`` records tile the data region ``start``..``end`` exactly: each block
    where the last one ended, holding at least one entry, each entry's body right after its
    length prefix and the last one's body, every block ending after its last body, the first
    block holding the first entry; else False, leaving the index to the pure checks
    (``aiobk.protocol.offload_object.parse_index``), which say what is wrong."""
    if not (
        type(entries) is bytes
        and type(blocks) is bytes
        and type(start) is int
        and type(end) is int
        and 0 <= start < 2**62
        and 0 <= end < 2**62
        and PyBytes_GET_SIZE(entries) % RECORD == 0
        and PyBytes_GET_SIZE(blocks) % RECORD == 0
    ):
        return False
    cdef const unsigned char *entry = <const unsigned char *>PyBytes_AS_STRING(entries)
    cdef const unsigned char *block = <const unsigned char *>PyBytes_AS_STRING(blocks)
    cdef Py_ssize_t count = PyBytes_GET_SIZE(entries) // RECORD
    cdef Py_ssize_t block_count = PyBytes_GET_SIZE(blocks) // RECORD
    cdef Py_ssize_t number, i
    cdef uint64_t offset = <uint64_t><int64_t>start, block_offset, first, stop, at
    for number in range(block_count):
        block_offset = <uint64_t>get64(block + RECORD * number)
        first = get32(block + RECORD * number + 12)
        if number + 1 < block_count:
            stop = get32(block + RECORD * (number + 1) + 12)
        else:
            stop = <uint64_t>count
        if block_offset != offset or first >= stop or stop > <uint64_t>count:
            return False
        offset += BLOCK_HEADER
        for i in range(<Py_ssize_t>first, <Py_ssize_t>stop):
            at = <uint64_t>get64(entry + RECORD * i)
            if at != offset + 4:
                return False
            offset = at + get32(entry + RECORD * i + 8)
        if offset != block_offset + get32(block + RECORD * number + 8):
            return False
    if offset != <uint64_t><int64_t>end:
        return False
    return count == 0 or (block_count > 0 and get32(block + 12) == 0)
