"""Hash: Spark's own placement, the baseline every other strategy is compared with.

``HashPartitioner`` reproduces exactly where Spark puts a row of ``df.repartition(n, key)``:
``pmod(murmur3(key, seed=42), n)`` (:mod:`trilink_spark.partitioners.core.spark_hash`). With
``hash_function="portable"`` it reproduces instead the PySpark RDD default,
``portable_hash(key) % n`` of ``rdd.partitionBy(n)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from ..._internal.validation import choice
from ...errors import InvalidArgumentError, InvalidKeyTypeError
from .keys import DEFAULT_NULL_POLICY, Key, KeyArray
from .spark_hash import (
    hash_binary_array,
    hash_bytes,
    hash_int,
    hash_int_array,
    hash_long,
    hash_long_array,
    hash_string,
)
from .base import Partitioner

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["HashPartitioner", "KEY_TYPES", "check_key_type", "spark_hash_of", "spark_hash_array"]

KeyType = Literal["auto", "int", "long", "string", "binary"]
KEY_TYPES: tuple[str, ...] = ("auto", "int", "long", "string", "binary")
HASH_FUNCTIONS: tuple[str, ...] = ("murmur3", "portable")


def check_key_type(key_type: str) -> str:
    """Validate a Spark key type name (see :data:`KEY_TYPES`) and return it."""
    return choice(key_type, "key_type", KEY_TYPES)


def spark_hash_of(key: Key, key_type: str = "auto") -> int:
    """Spark's ``hash(key)`` for one key. ``key_type="auto"`` hashes Python ints as ``long``."""
    if isinstance(key, int):
        if key_type == "int":
            if not -(2**31) <= key < 2**31:
                raise InvalidKeyTypeError(f"key {key} does not fit the 'int' key type (32 bits)")
            return hash_int(key)
        if key_type in ("auto", "long"):
            return hash_long(key)
    elif isinstance(key, str) and key_type in ("auto", "string"):
        return hash_string(key)
    elif isinstance(key, bytes) and key_type in ("auto", "binary"):
        return hash_bytes(key)
    raise InvalidKeyTypeError(
        f"key {key!r} of type {type(key).__name__} does not match key_type {key_type!r}"
    )


def spark_hash_array(keys: KeyArray, key_type: str = "auto") -> npt.NDArray[np.int32]:
    """Spark's ``hash()`` of every key, vectorised. ``auto`` follows the array's kind."""
    kind = keys.kind if key_type == "auto" else key_type
    if keys.kind in ("int", "long"):
        if kind == "int":
            ints = keys.ints()
            if ints.size and (ints.min() < -(2**31) or ints.max() >= 2**31):
                raise InvalidKeyTypeError("keys do not fit the 'int' key type (32 bits)")
            return hash_int_array(ints)
        if kind == "long":
            return hash_long_array(keys.ints())
    elif kind in ("string", "binary") and keys.kind == kind:
        return hash_binary_array(keys.arrow)
    raise InvalidKeyTypeError(f"keys of kind {keys.kind!r} do not match key_type {key_type!r}")


class HashPartitioner(Partitioner):
    """Spark's hash placement (the baseline).

    Parameters
    ----------
    num_partitions : int
        Number of partitions.
    key_type : {"auto", "int", "long", "string", "binary"}
        The Spark column type the keys come from: Spark hashes ``int`` (also ``short`` and
        ``byte``) and ``long`` values differently. ``"auto"`` follows the keys: 8-32-bit integer
        arrays as ``int``, Python ints and 64-bit arrays as ``long`` (PySpark's default for
        Python ints), ``str`` as ``string``, ``bytes`` as ``binary``. In a DataFrame a key of
        type ``"int"`` or ``"long"`` is cast to it before hashing; ``"auto"`` hashes the
        column's own type (a keyed stream fixes it to the key column's:
        :meth:`~trilink_spark.Partitioner.for_column`).
    hash_function : {"murmur3", "portable"}
        ``"murmur3"`` (default) is the DataFrame placement, exact. ``"portable"`` is PySpark's
        RDD ``portable_hash(key) % n`` (needs pyspark, and ``PYTHONHASHSEED`` for strings).
    null_policy : {"group", "error", "partition0"}

    Notes
    -----
    Cost: stateless; O(len(key)) per key. In a DataFrame the id is ``pmod(hash(key), n)``
    computed by Spark. Balance is at the mercy of the hash: on 10,000 equally heavy keys over 60
    partitions expect a balance degree near 0.65-0.75 (see ``benches/RESULTS.md``).

    Examples
    --------
    >>> import trilink_spark as tl
    >>> tl.HashPartitioner(4).partition("abc")
    0
    >>> tl.HashPartitioner(4, key_type="int").assign([1, 2, 3]).tolist()
    [3, 2, 3]
    >>> tl.HashPartitioner(4).assign([1, 2, 3]).tolist()  # Python ints hash as Spark long
    [1, 0, 3]
    """

    strategy_name = "hash"

    def __init__(
        self,
        num_partitions: int,
        *,
        key_type: KeyType | str = "auto",
        hash_function: str = "murmur3",
        null_policy: str = DEFAULT_NULL_POLICY,
    ) -> None:
        super().__init__(num_partitions, null_policy=null_policy)
        choice(hash_function, "hash_function", HASH_FUNCTIONS)
        self._key_type = check_key_type(key_type)
        self._hash_function = hash_function

    @property
    def key_type(self) -> str:
        """The Spark key type hashed (``"auto"`` follows the keys)."""
        return self._key_type

    @property
    def hash_function(self) -> str:
        """``"murmur3"`` (DataFrame placement) or ``"portable"`` (RDD placement)."""
        return self._hash_function

    def _partition(self, key: Key) -> int:
        if self._hash_function == "portable":
            from pyspark.rdd import portable_hash

            return int(portable_hash(key) % self._num_partitions)
        return spark_hash_of(key, self._key_type) % self._num_partitions

    def _assign(self, keys: KeyArray) -> npt.NDArray[np.int32]:
        if self._hash_function == "portable":
            from pyspark.rdd import portable_hash

            objs = keys.objects().tolist()
            n = self._num_partitions
            return np.fromiter(
                (0 if k is None else portable_hash(k) % n for k in objs),
                dtype=np.int32,
                count=len(objs),
            )
        hashes = spark_hash_array(keys, self._key_type).astype(np.int64)
        return np.mod(hashes, self._num_partitions).astype(np.int32)

    def spark_column(self, key: Column) -> Column:
        """``pmod(hash(key), n)``: exactly Spark's own ``hashpartitioning``.

        A key type ``"int"`` or ``"long"`` casts the column to it first (as
        :class:`~trilink_spark.partitioners.BlockPartitioner` does), so that the JVM hashes
        what :meth:`partition` and :meth:`assign` hash: an ``int`` column under
        ``key_type="long"`` is placed as ``bigint`` values.
        """
        if self._hash_function == "portable":
            raise InvalidArgumentError(
                "hash_function='portable' reproduces RDD placement; DataFrames place with "
                "Spark's murmur3, use HashPartitioner(n) (hash_function='murmur3')"
            )
        from pyspark.sql import functions as F

        if self._key_type in ("int", "long"):  # hashed as the key type partition() hashes
            key = key.cast("int" if self._key_type == "int" else "bigint")
        return F.pmod(F.hash(key), F.lit(self._num_partitions))

    def _params(self) -> dict[str, Any]:
        return {"key_type": self._key_type, "hash_function": self._hash_function}
