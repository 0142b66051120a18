"""Block: Spark's hash into a fixed number of blocks, then a table from block to partition.

A key goes to block ``pmod(hash(key), num_blocks)``, Spark's own ``hash`` (Murmur3, seed 42,
:mod:`trilink_spark.partitioners.core.spark_hash`), then to partition ``table[block]``. The key-to-block
step never changes, so changing the number of partitions, or moving load, only rewrites the small
table: a block moves with all its keys, and every other block stays where it was
(:func:`~trilink_spark.partitioners.choosing.refit.rebalance_minimal` computes such a table). In a DataFrame
the id is one JVM expression: ``element_at(<table literal>, pmod(hash(key), B) + 1)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..._internal.validation import check_num_partitions
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, NullKeyError
from .keys import DEFAULT_NULL_POLICY, Key, KeyArray, normalize_key, to_key_array
from .base import Partitioner
from .hash import check_key_type, spark_hash_array, spark_hash_of

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["BlockPartitioner", "DEFAULT_BLOCKS", "MAX_BLOCKS", "range_table"]

#: Blocks of a :class:`BlockPartitioner` unless told otherwise.
DEFAULT_BLOCKS = 4096
#: The most blocks a :class:`BlockPartitioner` may have (the table is a JVM literal, and the
#: bound keeps a hostile stored strategy from asking for gigabytes).
MAX_BLOCKS = 1 << 20


def range_table(num_partitions: int, num_blocks: int) -> npt.NDArray[np.int32]:
    """The default table: block ``b`` on partition ``b * num_partitions // num_blocks``.

    Contiguous runs of blocks, each partition holding ``num_blocks / num_partitions`` of them
    (within one). O(num_blocks).

    Examples
    --------
    >>> range_table(3, 8).tolist()
    [0, 0, 0, 1, 1, 1, 2, 2]
    """
    n = check_num_partitions(num_partitions)
    b = _check_num_blocks(num_blocks, n)
    return (np.arange(b, dtype=np.int64) * n // b).astype(np.int32)


def _check_num_blocks(num_blocks: Any, num_partitions: int) -> int:
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, (int, np.integer)):
        raise InvalidArgumentTypeError(
            f"num_blocks must be an int >= 1, got {type(num_blocks).__name__}"
        )
    if num_blocks < 1:
        raise InvalidArgumentError(f"num_blocks must be >= 1, got {num_blocks}")
    if num_blocks > MAX_BLOCKS:
        raise InvalidArgumentError(f"num_blocks must be at most {MAX_BLOCKS:,}, got {num_blocks}")
    if num_blocks < num_partitions:
        raise InvalidArgumentError(
            f"num_blocks ({num_blocks}) must be >= num_partitions ({num_partitions}): with "
            "fewer blocks than partitions some partitions could never receive a key; pass "
            f"num_blocks={max(DEFAULT_BLOCKS, num_partitions)} or more"
        )
    return int(num_blocks)


def _check_table(table: Any, num_partitions: int, num_blocks: int) -> npt.NDArray[np.int32]:
    if isinstance(table, (str, bytes, dict)) or not isinstance(table, (Sequence, np.ndarray)):
        raise InvalidArgumentTypeError(
            f"table must be a sequence of {num_blocks} partition ids, got {type(table).__name__}"
        )
    arr = np.asarray(table)
    if arr.ndim != 1 or arr.size != num_blocks:
        raise InvalidArgumentError(
            f"table must list one partition id per block: {num_blocks} ids, got shape "
            f"{arr.shape}"
        )
    if arr.dtype.kind not in "iu":
        raise InvalidArgumentTypeError(
            f"table entries must be ints (partition ids), got dtype {arr.dtype}"
        )
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= num_partitions):
        bad = int(np.flatnonzero((arr < 0) | (arr >= num_partitions))[0])
        raise InvalidArgumentError(
            f"table entry for block {bad} is {int(arr[bad])}, outside [0, {num_partitions})"
        )
    out = arr.astype(np.int32)
    out.flags.writeable = False
    return out


class BlockPartitioner(Partitioner):
    """Spark's hash into ``num_blocks`` blocks, and a table from block to partition.

    Key ``k`` goes to block ``pmod(hash(k), num_blocks)`` (exactly Spark's ``hash``) and to
    partition ``table[block]``. The table is configuration, not learned: change it with
    :meth:`with_table` or :func:`~trilink_spark.partitioners.choosing.refit.rebalance_minimal`, which
    moves as few blocks as it can when the load or the number of partitions changes.

    Parameters
    ----------
    num_partitions : int
        Number of partitions.
    num_blocks : int
        Number of blocks, from ``num_partitions`` to :data:`MAX_BLOCKS` (default 4096).
    table : sequence of int, optional
        Partition of each block (``num_blocks`` ints in ``[0, num_partitions)``). Default: the
        range table, block ``b`` on partition ``b * num_partitions // num_blocks``.
    key_type : {"auto", "int", "long", "string", "binary"}
        The Spark type of the key column, as for :class:`~trilink_spark.HashPartitioner`
        (Spark hashes ``int`` and ``long`` values differently). In a DataFrame a key of type
        ``"int"`` or ``"long"`` is cast to it before hashing.
    null_policy : {"group", "error", "partition0"}
        The null key has no block: its partition is the null policy's
        (:func:`~trilink_spark.partitioners.core.keys.null_partition`), whatever the table.

    Notes
    -----
    Cost: stateless; O(len(key)) per key, one table lookup more than Hash. Memory: the table,
    4 bytes per block. In a DataFrame the id is computed in the JVM by one expression over a
    literal of the table (folded into a constant by Spark's optimiser: a 4096-block table plans
    in well under a second). Balance is Hash's on average (blocks are hashed), and a rebalanced
    table can do much better on skewed keys without ever splitting a key.

    Examples
    --------
    >>> from trilink_spark.partitioners import BlockPartitioner
    >>> p = BlockPartitioner(4, num_blocks=8)
    >>> p.table.tolist()
    [0, 0, 1, 1, 2, 2, 3, 3]
    >>> p.blocks(["a", "b", "c"]).tolist(), p.assign(["a", "b", "c"]).tolist()
    ([2, 1, 2], [1, 0, 1])
    >>> p.with_table([3, 3, 2, 2, 1, 1, 0, 0]).partition("a")
    2
    """

    strategy_name = "block"
    #: The table is what a rebalance learns from loads: :meth:`fresh` gives the range table.
    learned_fields = ("table",)

    def __init__(
        self,
        num_partitions: int,
        num_blocks: int = DEFAULT_BLOCKS,
        table: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
        *,
        key_type: str = "auto",
        null_policy: str = DEFAULT_NULL_POLICY,
    ) -> None:
        super().__init__(num_partitions, null_policy=null_policy)
        self._num_blocks = _check_num_blocks(num_blocks, self._num_partitions)
        self._key_type = check_key_type(key_type)
        if table is None:
            self._table = range_table(self._num_partitions, self._num_blocks)
            self._table.flags.writeable = False
        else:
            self._table = _check_table(table, self._num_partitions, self._num_blocks)

    # ------------------------------------------------------------------ properties
    @property
    def num_blocks(self) -> int:
        """Number of blocks keys are hashed into."""
        return self._num_blocks

    @property
    def key_type(self) -> str:
        """The Spark key type hashed (``"auto"`` follows the keys)."""
        return self._key_type

    @property
    def table(self) -> npt.NDArray[np.int32]:
        """Partition of every block: a read-only int32 copy, index = block. O(num_blocks)."""
        out = self._table.copy()
        out.flags.writeable = False
        return out

    # ------------------------------------------------------------------ blocks
    def block_of(self, key: Any) -> int:
        """Block of one key, ``pmod(hash(key), num_blocks)``. O(len(key)).

        Raises :class:`~trilink_spark.errors.NullKeyError` for ``None``: a null key has no block.
        """
        k = normalize_key(key)
        if k is None:
            raise NullKeyError(
                "key is None: a null key has no block (its partition is fixed by the null "
                "policy, argument null_policy or conf spark.trilink.nullPolicy: "
                "pmod(42, num_partitions) under 'group', 0 under 'partition0'; "
                "partition(None) gives it)")
        return spark_hash_of(k, self._key_type) % self._num_blocks

    def blocks(self, keys: Any) -> npt.NDArray[np.int64]:
        """Block of every key, vectorised; ``-1`` for a null key (null policies ``"group"``
        and ``"partition0"``).

        O(total key bytes), no Python loop per key.
        """
        karr = to_key_array(keys, self._null_policy)
        out = self._blocks(karr)
        if karr.null_mask is not None:
            out[karr.null_mask] = -1
        return out

    def _blocks(self, keys: KeyArray) -> npt.NDArray[np.int64]:
        hashes = spark_hash_array(keys, self._key_type).astype(np.int64)
        return np.mod(hashes, self._num_blocks)

    def blocks_of_partition(self, partition: int) -> npt.NDArray[np.int64]:
        """The blocks placed on ``partition``, ascending. O(num_blocks)."""
        if isinstance(partition, bool) or not isinstance(partition, (int, np.integer)):
            raise InvalidArgumentTypeError(
                f"partition must be an int, got {type(partition).__name__}"
            )
        if not 0 <= partition < self._num_partitions:
            raise InvalidArgumentError(
                f"partition must be in [0, {self._num_partitions}), got {partition}"
            )
        return np.flatnonzero(self._table == partition).astype(np.int64)

    def with_table(
        self,
        table: Sequence[int] | npt.NDArray[np.integer[Any]],
        num_partitions: int | None = None,
    ) -> BlockPartitioner:
        """The same blocks with another table (optionally on another number of partitions).

        ``self`` is unchanged. O(num_blocks).
        """
        n = self._num_partitions if num_partitions is None else num_partitions
        return BlockPartitioner(n, self._num_blocks, table, key_type=self._key_type,
                                null_policy=self._null_policy)

    # ------------------------------------------------------------------ placement
    def _partition(self, key: Key) -> int:
        return int(self._table[spark_hash_of(key, self._key_type) % self._num_blocks])

    def _assign(self, keys: KeyArray) -> npt.NDArray[np.int32]:
        return self._table[self._blocks(keys)]

    def spark_column(self, key: Column) -> Column:
        """``element_at(<table>, pmod(hash(key), num_blocks) + 1)``, one JVM expression.

        The table travels as one string literal split and cast to ``array<int>``, which Spark's
        optimiser folds into a constant array (4096 separate literals would take seconds to
        build through py4j).
        """
        from pyspark.sql import functions as F

        if self._key_type in ("int", "long"):
            key = key.cast("int" if self._key_type == "int" else "bigint")
        literal = F.split(F.lit(",".join(map(str, self._table.tolist()))), ",")
        table = literal.cast("array<int>")
        block = F.pmod(F.hash(key), F.lit(self._num_blocks))
        return F.element_at(table, block + F.lit(1))

    # ------------------------------------------------------------------ serialisation
    def _params(self) -> dict[str, Any]:
        return {
            "num_blocks": self._num_blocks,
            "table": self._table.tolist(),
            "key_type": self._key_type,
        }

    def __repr__(self) -> str:
        return (
            f"BlockPartitioner(num_partitions={self._num_partitions}, "
            f"num_blocks={self._num_blocks})"
        )
