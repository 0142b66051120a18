"""Spark SQL's Murmur3 hash, reproduced bit for bit in Python and numpy.

Spark places a row of ``df.repartition(n, col)`` on partition ``pmod(hash(col), n)``, where
``hash`` is ``Murmur3_x86_32`` with seed 42. For ``int`` and ``long`` columns this equals the
reference Murmur3 of the value's 4 or 8 little-endian bytes. For strings and binary it does **not**:
Spark's ``hashUnsafeBytes`` mixes every trailing byte (the ``len % 4`` bytes after the last full
4-byte block) as its own sign-extended block, where reference Murmur3 packs them into one. This
module ports Spark's exact rule, so :class:`~trilink_spark.HashPartitioner` agrees with Spark.

Two entry points per type: scalar (pure Python, for ``partition(key)``) and vectorised (numpy,
for ``assign(keys)``). Strings are hashed from Arrow's offset and data buffers with numpy, one
pass per 4-byte block position over all keys together. The full 4-byte blocks of a key
longer than :data:`LONG_BLOCKS` blocks (and of every scalar key) are mixed by the ``mmh3``
library's C code instead, one call per such key: reference Murmur3 mixes the blocks exactly as
Spark does, and its finish is undone (:func:`_unfmix`) before Spark's own tail and finish are
applied. So the numpy passes are at most :data:`LONG_BLOCKS`, whatever the longest key.

Runtime complexity: O(total key bytes) for the vectorised functions (at most
:data:`LONG_BLOCKS` numpy passes, plus one C call per longer key), O(len(key)) in C for the
scalar ones.

Examples
--------
>>> from trilink_spark.partitioners.core.spark_hash import hash_long, hash_string
>>> hash_long(2**40)
-1596767687
>>> hash_string("abc")
1322437556
"""

from __future__ import annotations

import mmh3
import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = [
    "SPARK_SEED",
    "hash_int",
    "hash_long",
    "hash_bytes",
    "hash_string",
    "hash_int_array",
    "hash_long_array",
    "hash_binary_array",
    "pmod",
    "LONG_BLOCKS",
]

SPARK_SEED = 42
_M32 = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
#: Murmur3's finishing multipliers and their inverses modulo 2**32 (to undo a finish).
_F1, _F2 = 0x85EBCA6B, 0xC2B2AE35
_F1_INV, _F2_INV = pow(_F1, -1, 1 << 32), pow(_F2, -1, 1 << 32)
#: Keys of more than this many full 4-byte blocks are hashed by one C call each (their blocks)
#: rather than in the numpy passes, which are one per block position of the longest key.
LONG_BLOCKS = 64


def _to_signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _M32
    k1 = ((k1 << 15) | (k1 >> 17)) & _M32
    return (k1 * _C2) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = ((h1 << 13) | (h1 >> 19)) & _M32
    return (h1 * 5 + 0xE6546B64) & _M32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * _F1) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * _F2) & _M32
    h1 ^= h1 >> 16
    return _to_signed(h1)


def _unfmix(h: int) -> int:
    """The inverse of Murmur3's finishing avalanche (``_fmix`` before the length is mixed
    in): each xor-shift and odd multiplication is a bijection of 32-bit words."""
    h ^= h >> 16
    h = (h * _F2_INV) & _M32
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * _F1_INV) & _M32
    return h ^ (h >> 16)


def _body_state(blocks: memoryview, nbytes: int, seed: int) -> int:
    """Murmur3's running state after mixing ``blocks`` (a bytes-like of ``nbytes`` bytes, a
    multiple of 4): reference Murmur3 of them, finish undone. Spark mixes full blocks as the
    reference does (it parts ways only on the trailing bytes). O(nbytes) in C."""
    return _unfmix(mmh3.hash_from_buffer(blocks, seed & _M32, signed=False)) ^ nbytes


def hash_int(value: int, seed: int = SPARK_SEED) -> int:
    """Spark's ``hash()`` of an ``int`` (also ``short``/``byte``) value, as a signed 32-bit int.

    Examples
    --------
    >>> hash_int(1)
    -559580957
    """
    h1 = _mix_h1(seed & _M32, _mix_k1(value & _M32))
    return _fmix(h1, 4)


def hash_long(value: int, seed: int = SPARK_SEED) -> int:
    """Spark's ``hash()`` of a ``long`` (``bigint``) value, as a signed 32-bit int."""
    v = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(seed & _M32, _mix_k1(v & _M32))
    h1 = _mix_h1(h1, _mix_k1(v >> 32))
    return _fmix(h1, 8)


def hash_bytes(data: bytes, seed: int = SPARK_SEED) -> int:
    """Spark's ``hash()`` of a ``binary`` value (and of a string's UTF-8 bytes).

    Examples
    --------
    >>> hash_bytes(b"")
    142593372
    """
    n = len(data)
    aligned = n - n % 4
    h1 = _body_state(memoryview(data)[:aligned], aligned, seed)
    for byte in data[aligned:]:
        # Spark reads each trailing byte as a signed Java byte, widened to int.
        h1 = _mix_h1(h1, _mix_k1((byte - 256 if byte > 127 else byte) & _M32))
    return _fmix(h1, n)


def hash_string(value: str, seed: int = SPARK_SEED) -> int:
    """Spark's ``hash()`` of a ``string`` (UTF8_BINARY collation) value."""
    return hash_bytes(value.encode("utf-8"), seed)


# --------------------------------------------------------------------------- vectorised

_U32 = np.uint32


def _v_rotl(x: npt.NDArray[np.uint32], r: int) -> npt.NDArray[np.uint32]:
    return (x << _U32(r)) | (x >> _U32(32 - r))


def _v_mix_k1(k1: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    k1 = k1 * _U32(_C1)
    k1 = _v_rotl(k1, 15)
    return k1 * _U32(_C2)


def _v_mix_h1(h1: npt.NDArray[np.uint32], k1: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    h1 = h1 ^ k1
    h1 = _v_rotl(h1, 13)
    return h1 * _U32(5) + _U32(0xE6546B64)


def _v_fmix(h1: npt.NDArray[np.uint32], length: npt.NDArray[np.uint32]) -> npt.NDArray[np.int32]:
    h1 = h1 ^ length
    h1 ^= h1 >> _U32(16)
    h1 *= _U32(0x85EBCA6B)
    h1 ^= h1 >> _U32(13)
    h1 *= _U32(0xC2B2AE35)
    h1 ^= h1 >> _U32(16)
    return h1.view(np.int32)


def hash_int_array(values: npt.ArrayLike, seed: int = SPARK_SEED) -> npt.NDArray[np.int32]:
    """Vectorised :func:`hash_int` over an integer array (values must fit in 32 bits)."""
    v = np.asarray(values).astype(np.int32, copy=False).view(np.uint32)
    h1 = _v_mix_h1(np.full(v.shape, seed & _M32, dtype=np.uint32), _v_mix_k1(v))
    return _v_fmix(h1, np.full(v.shape, 4, dtype=np.uint32))


def hash_long_array(values: npt.ArrayLike, seed: int = SPARK_SEED) -> npt.NDArray[np.int32]:
    """Vectorised :func:`hash_long` over an integer array."""
    v = np.ascontiguousarray(np.asarray(values).astype(np.int64, copy=False)).view(np.uint64)
    low = (v & np.uint64(_M32)).astype(np.uint32)
    high = (v >> np.uint64(32)).astype(np.uint32)
    h1 = _v_mix_h1(np.full(v.shape, seed & _M32, dtype=np.uint32), _v_mix_k1(low))
    h1 = _v_mix_h1(h1, _v_mix_k1(high))
    return _v_fmix(h1, np.full(v.shape, 8, dtype=np.uint32))


def _binary_buffers(
    array: pa.Array,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Data bytes, start offsets and lengths of a string/binary Arrow array (nulls: length 0)."""
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(pa.large_binary())
    elif not pa.types.is_large_binary(array.type):
        array = array.cast(pa.large_binary())
    bufs = array.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64, count=len(array) + 1, offset=array.offset * 8)
    data = (
        np.frombuffer(bufs[2], dtype=np.uint8)
        if bufs[2] is not None
        else np.zeros(0, dtype=np.uint8)
    )
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    if array.null_count:
        # a null slot may span bytes (a fixed-size binary's always does, once cast)
        lengths = np.where(array.is_null().to_numpy(zero_copy_only=False), 0, lengths)
    return data, starts, lengths


def hash_binary_array(array: pa.Array, seed: int = SPARK_SEED) -> npt.NDArray[np.int32]:
    """Vectorised :func:`hash_bytes` over an Arrow string or binary array.

    Strings are hashed as their UTF-8 bytes, exactly as Spark hashes a ``string`` column.
    Null entries hash as the empty value; callers mask them beforehand.
    """
    data, starts, lengths = _binary_buffers(array)
    n = len(lengths)
    # Process rows with the most 4-byte blocks first, so the active rows of block j are a prefix.
    nblocks = lengths // 4
    order = np.argsort(-nblocks, kind="stable")
    s_starts = starts[order]
    s_lengths = lengths[order]
    s_blocks = nblocks[order]
    h1 = np.full(n, seed & _M32, dtype=np.uint32)
    neg_blocks = -s_blocks
    # the long rows (a prefix): their blocks in C, one call each
    long_rows = int(np.searchsorted(neg_blocks, -LONG_BLOCKS, side="left"))
    for i in range(long_rows):
        start, size = int(s_starts[i]), 4 * int(s_blocks[i])
        h1[i] = _body_state(data[start:start + size].data, size, seed)
    max_blocks = int(s_blocks[long_rows]) if n > long_rows else 0
    for j in range(max_blocks):  # at most LONG_BLOCKS passes
        active = int(np.searchsorted(neg_blocks, -j, side="left"))  # rows with nblocks > j
        pos = s_starts[long_rows:active] + 4 * j
        word = (
            data[pos].astype(np.uint32)
            | (data[pos + 1].astype(np.uint32) << _U32(8))
            | (data[pos + 2].astype(np.uint32) << _U32(16))
            | (data[pos + 3].astype(np.uint32) << _U32(24))
        )
        h1[long_rows:active] = _v_mix_h1(h1[long_rows:active], _v_mix_k1(word))
    tails = s_lengths % 4
    aligned = s_starts + s_lengths - tails
    for t in range(3):
        rows = np.nonzero(tails > t)[0]
        if rows.size == 0:
            break
        byte = data[aligned[rows] + t].view(np.int8).astype(np.int32).view(np.uint32)
        h1[rows] = _v_mix_h1(h1[rows], _v_mix_k1(byte))
    out = np.empty(n, dtype=np.int32)
    out[order] = _v_fmix(h1, s_lengths.astype(np.uint32))
    return out


def pmod(hashes: npt.NDArray[np.int32], n: int) -> npt.NDArray[np.int32]:
    """Spark's ``pmod(hash, n)``: the non-negative remainder, as Spark's partition id."""
    return np.mod(hashes.astype(np.int64), n).astype(np.int32)
