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

from ..errors import InvalidArgumentTypeError
from .._internal.validation import check_num_partitions

__all__ = ["kafka_murmur2", "kafka_default_partition"]

_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C


def _murmur2_same_length(data: npt.NDArray[np.uint8]) -> Any:
    """murmur2 of every row of an ``(m, length)`` byte matrix (Kafka's 32-bit variant)."""
    m, length = data.shape
    h: Any = np.full(m, (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
    words = data[:, : length - length % 4].astype(np.uint32)
    for i in range(0, length - length % 4, 4):
        k = words[:, i] | (words[:, i + 1] << 8) | (words[:, i + 2] << 16) | (words[:, i + 3] << 24)
        k = k * _M
        k ^= k >> np.uint32(24)
        k = k * _M
        h = (h * _M) ^ k
    tail = length % 4
    base = length - tail
    if tail >= 3:
        h ^= data[:, base + 2].astype(np.uint32) << np.uint32(16)
    if tail >= 2:
        h ^= data[:, base + 1].astype(np.uint32) << np.uint32(8)
    if tail >= 1:
        h ^= data[:, base].astype(np.uint32)
        h = h * _M
    h ^= h >> np.uint32(13)
    h = h * _M
    h ^= h >> np.uint32(15)
    return h


def kafka_murmur2(keys: Iterable[bytes]) -> npt.NDArray[np.int32]:
    """Kafka's ``Utils.murmur2`` of each key, as signed 32-bit ints.

    Runtime complexity: O(total key bytes) in numpy, keys grouped by length.

    Examples
    --------
    >>> int(kafka_murmur2([b"21"])[0])
    -973932308
    """
    items = list(keys)
    if any(not isinstance(k, (bytes, bytearray)) for k in items):
        raise InvalidArgumentTypeError("kafka_murmur2 takes bytes keys; encode them first")
    out = np.zeros(len(items), dtype=np.uint32)
    lengths = np.fromiter((len(k) for k in items), dtype=np.int64, count=len(items))
    for length in np.unique(lengths):
        idx = np.flatnonzero(lengths == length)
        joined = b"".join(bytes(items[i]) for i in idx)
        matrix = np.frombuffer(joined, dtype=np.uint8).reshape(len(idx), int(length))
        out[idx] = _murmur2_same_length(matrix)
    return out.view(np.int32)


def _default_encode(key: Any) -> bytes:
    return bytes(key) if isinstance(key, (bytes, bytearray)) else str(key).encode()


def kafka_default_partition(keys: Iterable[Any], num_partitions: int,
                            encode: Callable[[Any], bytes] | None = None) -> npt.NDArray[np.int32]:
    """The partition Kafka's default partitioner gives each key.

    Parameters
    ----------
    keys : iterable
        Keys as the job sees them (bytes are used as they are).
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
