# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The bookie's per-entry work on a batch in C: the journal's ADD records and the entry log's
records of a batch, with CRC32C computed here (SSE4.2 where the CPU has it), and the checked
unpacking of an ADD_BATCH's bodies.

Each function stands for a pure-Python one (``aiobk.bookie.journal.format.encode_adds``,
``aiobk.bookie.entrylog.format.pack_records``, ``aiobk.protocol.batch.unpack_bodies``), byte
for byte: arguments of the shapes the bookie passes (exact ints in range, ``bytes`` bodies, a
list or tuple of ``(int, bytes)`` pairs, a well-formed batch) are handled here, records in one
allocation; anything else goes to the pure function, so that odd input behaves, and fails,
exactly as there. ``aiobk.bookie.record_codecs`` chooses
between the two implementations, and the tests hold them equal.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef extern from "_bigendian.h":
    void put16 "aiobk_put16"(unsigned char *p, uint16_t v) noexcept nogil
    void put32 "aiobk_put32"(unsigned char *p, uint32_t v) noexcept nogil
    void put64 "aiobk_put64"(unsigned char *p, uint64_t v) noexcept nogil
    uint32_t get32 "aiobk_get32"(const unsigned char *p) noexcept nogil
    int64_t get64 "aiobk_get64"(const unsigned char *p) noexcept nogil


cdef extern from "_crc32c.h":
    void aiobk_crc32c_init()
    uint32_t aiobk_crc32c(uint32_t crc, const unsigned char *p, size_t n) nogil
    uint32_t aiobk_crc32c_portable(uint32_t crc, const unsigned char *p, size_t n) nogil


aiobk_crc32c_init()

cdef enum:
    ADD_HEAD = 35  # journal: u16 magic, u8 type, u32 length, u64 LSN, u32 crc, i64 ledger, i64 entry
    LOG_HEAD = 24  # entry log: u32 length, u32 crc, i64 ledger, i64 entry
    IDS = 16  # the two ids
    RECORD_MAGIC = 0xB00C
    ADD_TYPE = 1
    LOG_MAGIC_SIZE = 12

from aiobk.protocol.batch import MAX_BATCH_ENTRIES as _MAX_BATCH_ENTRIES
from aiobk.protocol.entry import ENTRY_FORMAT_VERSION as _ENTRY_FORMAT_VERSION
from aiobk.protocol.entry import HEADER_SIZE as _HEADER_SIZE
from aiobk.protocol.entry import DigestType as _DigestType
from aiobk.protocol.limits import MAX_ENTRY_ID as _MAX_ENTRY_ID
from aiobk.bookie.entrylog.format import MAX_RECORD as _MAX_RECORD
from aiobk.bookie.entrylog.format import OFFSET_BITS as _OFFSET_BITS

cdef Py_ssize_t MAX_BATCH_ENTRIES = _MAX_BATCH_ENTRIES
cdef Py_ssize_t HEADER_SIZE = _HEADER_SIZE  # u8 version, u8 digest type, 4 x i64
cdef int ENTRY_FORMAT_VERSION = _ENTRY_FORMAT_VERSION
cdef int64_t MAX_ENTRY_ID = _MAX_ENTRY_ID
cdef Py_ssize_t DIGEST_SIZE[256]  # by digest type; -1: not a digest type
for _kind in range(256):
    DIGEST_SIZE[_kind] = -1
for _digest in _DigestType:
    DIGEST_SIZE[int(_digest)] = _digest.size

cdef int OFFSET_BITS = _OFFSET_BITS  # a location: the log's id above the record's offset
cdef uint64_t OFFSET_MASK = (<uint64_t>1 << OFFSET_BITS) - 1
cdef int64_t MAX_RECORD = _MAX_RECORD
cdef object _INT64_MIN = -(2**63)
cdef object _INT64_LIMIT = 2**63
cdef Py_ssize_t _MAX_BODY = 0xFFFFFFFF - IDS


cdef inline bint _is_int64(object value):
    return type(value) is int and _INT64_MIN <= value < _INT64_LIMIT


cdef inline bint _is_pair(object item):
    """``(entry id, body)`` as the bookie passes it: a tuple of an int64 and bytes."""
    return (
        type(item) is tuple
        and len(<tuple>item) == 2
        and _is_int64((<tuple>item)[0])
        and type((<tuple>item)[1]) is bytes
        and PyBytes_GET_SIZE((<tuple>item)[1]) <= _MAX_BODY
    )


def _pure_encode_adds(first_lsn, ledger_id, entries):
    from aiobk.bookie.journal.format import encode_adds  # at call time: no cycle at import

    return encode_adds(first_lsn, ledger_id, entries)


def _pure_pack_records(data, start, max_size, location_base, ledger_id, entries, first, locations):
    from aiobk.bookie.entrylog.format import pack_records  # at call time: no cycle at import

    return pack_records(data, start, max_size, location_base, ledger_id, entries, first, locations)


def _pure_unpack_bodies(packed, ledger_id):
    from aiobk.protocol.batch import unpack_bodies  # at call time, as the others

    return unpack_bodies(packed, ledger_id)


def unpack_bodies(packed, ledger_id):
    """``aiobk.protocol.batch.unpack_bodies``: a batch that passes every check is unpacked
    here; any other goes to the pure function, which raises its ``BatchError``."""
    if type(packed) is not bytes or not _is_int64(ledger_id):
        return _pure_unpack_bodies(packed, ledger_id)
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(packed)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(packed), at = 0, count = 0, size, digest
    cdef int64_t ledger = ledger_id, last = -1, entry_id
    cdef const unsigned char *head
    cdef list entries = []
    while at < end:
        if count == MAX_BATCH_ENTRIES or end - at < 4:
            return _pure_unpack_bodies(packed, ledger_id)
        size = get32(p + at)
        at += 4
        if size < HEADER_SIZE or size > end - at:
            return _pure_unpack_bodies(packed, ledger_id)
        head = p + at
        digest = DIGEST_SIZE[head[1]]
        if head[0] != ENTRY_FORMAT_VERSION or digest < 0 or size < HEADER_SIZE + digest:
            return _pure_unpack_bodies(packed, ledger_id)
        entry_id = get64(head + 10)
        if get64(head + 2) != ledger or entry_id <= last or entry_id > MAX_ENTRY_ID:
            return _pure_unpack_bodies(packed, ledger_id)
        last = entry_id
        entries.append(
            (entry_id, get64(head + 18), PyBytes_FromStringAndSize(<const char *>head, size))
        )
        at += size
        count += 1
    if count == 0:
        return _pure_unpack_bodies(packed, ledger_id)
    return entries


def encode_adds(first_lsn, ledger_id, entries):
    """``aiobk.bookie.journal.format.encode_adds``, in one allocation."""
    if type(entries) is not list and type(entries) is not tuple:
        return _pure_encode_adds(first_lsn, ledger_id, entries)
    cdef Py_ssize_t count = len(entries), i, total = 0, size
    if not (
        _is_int64(ledger_id)
        and _is_int64(first_lsn)
        and first_lsn >= 0
        and first_lsn + count < _INT64_LIMIT
    ):
        return _pure_encode_adds(first_lsn, ledger_id, entries)
    for i in range(count):
        item = entries[i]
        if not _is_pair(item):
            return _pure_encode_adds(first_lsn, ledger_id, entries)
        total += ADD_HEAD + PyBytes_GET_SIZE((<tuple>item)[1])
    cdef int64_t ledger = ledger_id, lsn = first_lsn
    cdef uint32_t crc
    cdef tuple pair
    cdef object body
    result = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *out = <unsigned char *>PyBytes_AS_STRING(result)
    for i in range(count):
        pair = <tuple>entries[i]
        body = pair[1]
        size = PyBytes_GET_SIZE(body)
        put16(out, RECORD_MAGIC)
        out[2] = ADD_TYPE
        put32(out + 3, <uint32_t>(IDS + size))
        put64(out + 7, <uint64_t>(lsn + i))
        put64(out + 19, <uint64_t>ledger)
        put64(out + 27, <uint64_t><int64_t>pair[0])
        memcpy(out + ADD_HEAD, PyBytes_AS_STRING(body), size)
        # the CRC covers type, length and LSN, then the payload: the ids and the body
        crc = aiobk_crc32c(0, out + 2, 13)
        crc = aiobk_crc32c(crc, out + 19, <size_t>(IDS + size))
        put32(out + 15, crc)
        out += ADD_HEAD + size
    return result


def pack_records(data, start, max_size, location_base, ledger_id, entries, first, locations):
    """``aiobk.bookie.entrylog.format.pack_records``, with one resize of ``data``."""
    if not (
        type(data) is bytearray
        and type(locations) is list
        and (type(entries) is list or type(entries) is tuple)
        and _is_int64(start)
        and _is_int64(max_size)
        and _is_int64(ledger_id)
        and _is_int64(location_base)
        and location_base >= 0
        and type(first) is int
        and 0 <= first <= len(entries)
        and start >= 0
        and start + len(data) < 2**40
    ):
        return _pure_pack_records(
            data, start, max_size, location_base, ledger_id, entries, first, locations
        )
    cdef Py_ssize_t count = len(entries), i, stop, begin = first, total = 0, size
    for i in range(begin, count):
        if not _is_pair(entries[i]):
            return _pure_pack_records(
                data, start, max_size, location_base, ledger_id, entries, first, locations
            )
    cdef Py_ssize_t used = PyByteArray_GET_SIZE(data)
    cdef int64_t limit = max_size, offset = <int64_t>start + used, ledger = ledger_id
    cdef uint64_t base = location_base
    cdef uint32_t crc
    cdef tuple pair
    cdef object body
    # how many fit: a record never takes the log past ``max_size``, but a log's first always fits
    stop = begin
    while stop < count:
        size = LOG_HEAD + PyBytes_GET_SIZE((<tuple>entries[stop])[1])
        if offset + size > limit and offset > LOG_MAGIC_SIZE:
            break
        offset += size
        total += size
        stop += 1
    if total == 0:
        return stop
    PyByteArray_Resize(data, used + total)
    cdef unsigned char *out = <unsigned char *>PyByteArray_AS_STRING(data) + used
    offset = <int64_t>start + used
    for i in range(begin, stop):
        pair = <tuple>entries[i]
        body = pair[1]
        size = PyBytes_GET_SIZE(body)
        put32(out, <uint32_t>(IDS + size))
        put64(out + 8, <uint64_t>ledger)
        put64(out + 16, <uint64_t><int64_t>pair[0])
        memcpy(out + LOG_HEAD, PyBytes_AS_STRING(body), size)
        crc = aiobk_crc32c(0, out + 8, <size_t>(IDS + size))
        put32(out + 4, crc)
        locations.append(base | <uint64_t>offset)
        offset += LOG_HEAD + size
        out += LOG_HEAD + size
    return stop


def _pure_check_records(block, start, ledger_id, run):
    from aiobk.bookie.entrylog.format import check_records  # at call time, as the others

    return check_records(block, start, ledger_id, run)


def _pure_run_end(wanted, at, limit):
    from aiobk.bookie.entrylog.format import run_end  # at call time, as the others

    return run_end(wanted, at, limit)


cdef inline bint _is_location(object item):
    """``(entry id, location)`` as the index gives it: a tuple of an int64 and a non-negative
    int64."""
    return (
        type(item) is tuple
        and len(<tuple>item) == 2
        and _is_int64((<tuple>item)[0])
        and _is_int64((<tuple>item)[1])
        and (<tuple>item)[1] >= 0
    )


def check_records(block, start, ledger_id, run):
    """``aiobk.bookie.entrylog.format.check_records``: a range read's run of records checked
    and their bodies taken out in one pass, or None."""
    if not (
        type(block) is bytes
        and type(run) is list
        and _is_int64(start)
        and start >= 0
        and _is_int64(ledger_id)
    ):
        return _pure_check_records(block, start, ledger_id, run)
    cdef Py_ssize_t count = len(run), i
    for i in range(count):
        if not _is_location(run[i]):
            return _pure_check_records(block, start, ledger_id, run)
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(block)
    cdef int64_t size = PyBytes_GET_SIZE(block), origin = start, ledger = ledger_id, at, end
    cdef uint32_t length
    cdef tuple pair
    bodies = []
    for i in range(count):
        pair = <tuple>run[i]
        at = <int64_t>(<uint64_t><int64_t>pair[1] & OFFSET_MASK) - origin
        if at < 0 or at + LOG_HEAD > size:
            return None
        length = get32(p + at)
        end = at + 8 + <int64_t>length
        if length < IDS or end > size or end - at > MAX_RECORD:
            return None
        if aiobk_crc32c(0, p + at + 8, length) != get32(p + at + 4):
            return None
        if get64(p + at + 8) != ledger or get64(p + at + 16) != <int64_t>pair[0]:
            return None
        bodies.append(
            PyBytes_FromStringAndSize(<const char *>p + at + LOG_HEAD, end - at - LOG_HEAD)
        )
    return bodies


def run_end(wanted, at, limit):
    """``aiobk.bookie.entrylog.format.run_end``."""
    if not (
        type(wanted) is list
        and type(at) is int
        and 0 <= at < len(wanted)
        and _is_int64(limit)
        and _is_location(wanted[at])
    ):
        return _pure_run_end(wanted, at, limit)
    cdef Py_ssize_t count = len(wanted), end = at + 1
    cdef uint64_t location = <uint64_t><int64_t>(<tuple>wanted[at])[1]
    cdef uint64_t log_id = location >> OFFSET_BITS, previous = location & OFFSET_MASK
    cdef int64_t bound = limit
    cdef object item
    while end < count:
        item = wanted[end]
        if not _is_location(item):
            return _pure_run_end(wanted, at, limit)
        location = <uint64_t><int64_t>(<tuple>item)[1]
        if location >> OFFSET_BITS != log_id:
            break
        if not (previous < (location & OFFSET_MASK) and <int64_t>(location & OFFSET_MASK) < bound):
            break
        previous = location & OFFSET_MASK
        end += 1
    return end


def crc32c(bytes data, unsigned int value=0, bint portable=False):
    """CRC32C of ``data`` continuing from ``value``, as ``crc32c.crc32c(data, value)``;
    ``portable``: the table's, whatever the CPU."""
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data)
    if portable:
        return aiobk_crc32c_portable(value, p, <size_t>PyBytes_GET_SIZE(data))
    return aiobk_crc32c(value, p, <size_t>PyBytes_GET_SIZE(data))
