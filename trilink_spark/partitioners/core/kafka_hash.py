"""Kafka's default placement, vectorised: ``toPositive(murmur2(key bytes)) % partitions``.

This is where a producer with no partitioner of its own (Java client's default,
``kafka-python``'s ``DefaultPartitioner``) puts a keyed record: the Hash baseline on the Kafka
side, against which :func:`~trilink_spark.placement.ahead_key_by`'s strategies are measured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import InvalidArgumentTypeError
from ..._internal.validation import check_num_partitions

__all__ = ["kafka_murmur2", "kafka_default_partition"]

_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C


#: Every key's first this many 4-byte blocks are chained in numpy, one pass per block position
#: over all the keys that reach it. Beyond it a pass runs only while at least
#: :data:`MIN_PASS_KEYS` keys reach its block; the fewer keys left have their remaining blocks
#: chained one Python step each (their mixed blocks computed in numpy first).
LONG_BLOCKS = 64
#: The fewest keys a numpy pass beyond :data:`LONG_BLOCKS` blocks chains (below it a pass's
#: fixed cost outweighs a Python step per key).
MIN_PASS_KEYS = 256
_M32 = 0xFFFFFFFF


def _mix(k: Any) -> Any:
    """murmur2's mix of 4-byte blocks (a uint32 array)."""
    k = k * _M
    k ^= k >> np.uint32(24)
    return k * _M


def _mixed_blocks(data: npt.NDArray[np.uint8], starts: Any, block: int) -> Any:
    """murmur2's mixed block ``block`` (0-based) of the keys starting at ``starts``."""
    pos = starts + 4 * block
    return _mix(data[pos].astype(np.uint32) | (data[pos + 1].astype(np.uint32) << np.uint32(8))
                | (data[pos + 2].astype(np.uint32) << np.uint32(16))
                | (data[pos + 3].astype(np.uint32) << np.uint32(24)))


def _chain_long(data: npt.NDArray[np.uint8], start: int, first: int, blocks: int, h: int) -> int:
    """murmur2's running state ``h`` after blocks ``first`` .. ``blocks - 1`` of one key: the
    mixed blocks in numpy, then ``h = h * m ^ k`` one step each (a chain numpy cannot split)."""
    body = data[start + 4 * first:start + 4 * blocks].view("<u4").astype(np.uint32)
    m = int(_M)
    for k in _mix(body).tolist():
        h = ((h * m) & _M32) ^ k
    return h


def _murmur2_rows(data: npt.NDArray[np.uint8], starts: Any, lengths: Any
                  ) -> npt.NDArray[np.uint32]:
    """murmur2 of every key of a joined byte buffer (``starts``/``lengths`` per key)."""
    n = len(lengths)
    nblocks = lengths // 4
    # keys with the most blocks first, so the keys still chaining at block j are a prefix
    order = np.argsort(-nblocks, kind="stable")
    s_starts, s_lengths, s_blocks = starts[order], lengths[order], nblocks[order]
    h: Any = ((_SEED ^ s_lengths) & _M32).astype(np.uint32)
    neg_blocks = -s_blocks
    most = int(s_blocks[0]) if n else 0
    # numpy passes: every block below LONG_BLOCKS, then while >= MIN_PASS_KEYS keys reach it
    # (fewer than MIN_PASS_KEYS keys have more than s_blocks[MIN_PASS_KEYS - 1] blocks)
    wide = int(s_blocks[MIN_PASS_KEYS - 1]) if n >= MIN_PASS_KEYS else 0
    passes = min(most, max(LONG_BLOCKS, wide))
    for j in range(passes):
        active = int(np.searchsorted(neg_blocks, -j, side="left"))  # keys with > j blocks
        h[:active] = (h[:active] * _M) ^ _mixed_blocks(data, s_starts[:active], j)
    for i in range(int(np.searchsorted(neg_blocks, -passes, side="left"))):
        h[i] = _chain_long(data, int(s_starts[i]), passes, int(s_blocks[i]), int(h[i]))
    tail = s_lengths % 4
    base = s_starts + 4 * s_blocks
    for size, shift in ((3, 16), (2, 8)):
        rows = np.flatnonzero(tail >= size)
        h[rows] ^= data[base[rows] + size - 1].astype(np.uint32) << np.uint32(shift)
    rows = np.flatnonzero(tail >= 1)
    h[rows] = (h[rows] ^ data[base[rows]].astype(np.uint32)) * _M
    h ^= h >> np.uint32(13)
    h = h * _M
    h ^= h >> np.uint32(15)
    out = np.empty(n, dtype=np.uint32)
    out[order] = h
    return out


def kafka_murmur2(keys: Iterable[bytes]) -> npt.NDArray[np.int32]:
    """Kafka's ``Utils.murmur2`` of each key, as signed 32-bit ints.

    Runtime complexity: O(total key bytes): one numpy pass per 4-byte block position, the
    first :data:`LONG_BLOCKS` over every key that reaches it and later ones only while at
    least :data:`MIN_PASS_KEYS` keys do, plus one Python step per remaining block of the
    fewer than :data:`MIN_PASS_KEYS` keys longer than that.

    Examples
    --------
    >>> int(kafka_murmur2([b"21"])[0])
    -973932308
    """
    items = list(keys)
    if any(not isinstance(k, (bytes, bytearray)) for k in items):
        raise InvalidArgumentTypeError("kafka_murmur2 takes bytes keys; encode them first")
    lengths = np.fromiter((len(k) for k in items), dtype=np.int64, count=len(items))
    starts = np.zeros(len(items), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    data = np.frombuffer(b"".join(items), dtype=np.uint8)
    return _murmur2_rows(data, starts, lengths).view(np.int32)


def _default_encode(key: Any) -> bytes:
    # a memoryview's str() is its address: its bytes are the key, as for bytes and bytearray
    return bytes(key) if isinstance(key, (bytes, bytearray, memoryview)) else str(key).encode()


def kafka_default_partition(keys: Iterable[Any], num_partitions: int,
                            encode: Callable[[Any], bytes] | None = None) -> npt.NDArray[np.int32]:
    """The partition Kafka's default partitioner gives each key.

    Parameters
    ----------
    keys : iterable
        Keys as the job sees them (bytes, bytearray and memoryview are used as they are).
    num_partitions : int
        The topic's partition count.
    encode : callable, optional
        Key to the bytes the producer sends; default ``str(key).encode()`` (how Spark's Kafka
        sink writes ``CAST(key AS STRING)``).

    Examples
    --------
    >>> kafka_default_partition([21, 22, 23], 4).tolist()
    [0, 3, 0]
    """
    n = check_num_partitions(num_partitions)
    to_bytes = encode or _default_encode
    hashed = kafka_murmur2(to_bytes(k) for k in keys).view(np.uint32) & np.uint32(0x7FFFFFFF)
    return (hashed % np.uint32(n)).astype(np.int32)
