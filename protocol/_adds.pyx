# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A writer's per-entry work in C: an entry's body encoded with its CRC32C, and the bodies of an
ADD_BATCH packed, each in one allocation.

``encode_entry`` stands for ``aiobk.protocol.add_codecs.encode_entry`` (the entry's header, its
digest and its payload, ``aiobk.protocol.entry``), ``pack_bodies`` for
``aiobk.protocol.batch.pack_bodies``, byte for byte: arguments of the shapes the writer passes
(exact ints in range, a ``DigestType`` member, ``bytes`` payloads and bodies in a list or tuple)
are handled here; anything else goes to the pure function, so that odd input behaves, and
fails, exactly as there. ``aiobk.protocol.add_codecs`` chooses between the two
implementations, and the tests hold them equal.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef extern from "_bigendian.h":
    void put32 "aiobk_put32"(unsigned char *p, uint32_t v) noexcept nogil
    void put64 "aiobk_put64"(unsigned char *p, uint64_t v) noexcept nogil


cdef extern from "_crc32c.h":
    void aiobk_crc32c_init()
    uint32_t aiobk_crc32c(uint32_t crc, const unsigned char *p, size_t n) nogil


aiobk_crc32c_init()

from aiobk.protocol.entry import ENTRY_FORMAT_VERSION as _ENTRY_FORMAT_VERSION
from aiobk.protocol.entry import HEADER_SIZE as _HEADER_SIZE
from aiobk.protocol.entry import DigestType as _DigestType

cdef Py_ssize_t HEADER_SIZE = _HEADER_SIZE  # u8 version, u8 digest type, 4 x i64
cdef unsigned char ENTRY_FORMAT_VERSION = _ENTRY_FORMAT_VERSION
cdef object DUMMY = _DigestType.DUMMY
cdef object CRC32C = _DigestType.CRC32C
cdef unsigned char DUMMY_CODE = int(_DigestType.DUMMY)
cdef unsigned char CRC32C_CODE = int(_DigestType.CRC32C)


cdef inline bint _int64(object value, int64_t *out):
    """Whether ``value`` is an exact int that fits in an i64 (then stored in ``out``)."""
    cdef int overflow = 0
    if type(value) is not int:
        return False
    out[0] = PyLong_AsLongLongAndOverflow(value, &overflow)
    return overflow == 0


def _pure_encode_entry(ledger_id, entry_id, lac, length, kind, payload):
    from aiobk.protocol.add_codecs import pure_encode_entry  # at call time: no cycle at import

    return pure_encode_entry(ledger_id, entry_id, lac, length, kind, payload)


def encode_entry(ledger_id, entry_id, lac, length, kind, payload):
    """The body of an entry of digest type ``kind`` (``CRC32C`` or ``DUMMY``), or None for a
    digest this cannot compute (a ``MAC``, keyed by the ledger's password)."""
    cdef int64_t ids[4]
    if not (
        type(payload) is bytes
        and (kind is CRC32C or kind is DUMMY)
        and _int64(ledger_id, &ids[0])
        and _int64(entry_id, &ids[1])
        and _int64(lac, &ids[2])
        and _int64(length, &ids[3])
    ):
        return _pure_encode_entry(ledger_id, entry_id, lac, length, kind, payload)
    cdef bint crc = kind is CRC32C
    cdef Py_ssize_t size = PyBytes_GET_SIZE(payload), start = HEADER_SIZE + (4 if crc else 0)
    body = PyBytes_FromStringAndSize(NULL, start + size)
    cdef unsigned char *out = <unsigned char *>PyBytes_AS_STRING(body)
    cdef const unsigned char *data = <const unsigned char *>PyBytes_AS_STRING(payload)
    out[0] = ENTRY_FORMAT_VERSION
    out[1] = CRC32C_CODE if crc else DUMMY_CODE
    put64(out + 2, <uint64_t>ids[0])
    put64(out + 10, <uint64_t>ids[1])
    put64(out + 18, <uint64_t>ids[2])
    put64(out + 26, <uint64_t>ids[3])
    memcpy(out + start, data, size)
    if crc:  # the digest covers the header, then the payload
        put32(out + HEADER_SIZE, aiobk_crc32c(aiobk_crc32c(0, out, HEADER_SIZE), data, size))
    return body


def _pure_pack_bodies(bodies):
    from aiobk.protocol.batch import pack_bodies  # at call time, as the other

    return pack_bodies(bodies)


def pack_bodies(bodies):
    """``aiobk.protocol.batch.pack_bodies``: each body after its length, 4 bytes big-endian."""
    if type(bodies) is not list and type(bodies) is not tuple:
        return _pure_pack_bodies(bodies)
    cdef Py_ssize_t count = len(bodies), i, total = 0, size
    cdef object body
    for i in range(count):
        body = bodies[i]
        if type(body) is not bytes or PyBytes_GET_SIZE(body) > 0xFFFFFFFF:
            return _pure_pack_bodies(bodies)
        total += 4 + PyBytes_GET_SIZE(body)
    packed = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *out = <unsigned char *>PyBytes_AS_STRING(packed)
    for i in range(count):
        body = bodies[i]
        size = PyBytes_GET_SIZE(body)
        put32(out, <uint32_t>size)
        memcpy(out + 4, PyBytes_AS_STRING(body), size)
        out += 4 + size
    return packed
