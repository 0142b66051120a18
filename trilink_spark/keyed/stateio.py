"""What a task of a stateful keyed micro-batch reads and writes of its partition's state.

:class:`StateIO` travels with each task of :func:`~trilink_spark.keyed_foreach_batch`: it
loads the partition's version the batch starts from (minus the keys a swap moves out, plus the
segments it moves in), saves the new version with the task's timing, and counts rows per block
for a rebalancer. :func:`state_types` gives the Arrow types the state is encoded with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from ..errors import TrilinkError
from ..partitioners import BlockPartitioner
from ..state.store import KEY_FIELD, KeyedStateStore
from .process import KeyedWatermarkProcessFunction
from .snapshot import PartitionState, encode_state, merge_in, split_out

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["StateIO", "state_types"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateIO:
    """What a task of a stateful batch needs to load and save its partition's state
    (picklable; shipped with the task).

    Attributes
    ----------
    store : KeyedStateStore
    batch_id : int
        The version the task writes.
    prev : int or None
        The version it starts from (None: empty state).
    prev_partitions : int
        Partitions that existed at ``prev``; a task of a partition at or above starts empty.
    swap : bool
        Whether ``batch_id`` has a swap plan: then the task drops its outgoing keys and takes
        in its incoming segments.
    key_type, value_type : pyarrow.DataType or None
        The key column's type and the processor's declared ``state_schema``.
    blocks : BlockPartitioner or None
        The placement when it is a block table: each task then counts its rows per block,
        and stores the counts with its timing (:meth:`KeyedStateStore.save_timing`).
    """

    store: KeyedStateStore
    batch_id: int
    prev: int | None
    prev_partitions: int
    swap: bool
    key_type: Any
    value_type: Any
    blocks: BlockPartitioner | None = None

    def load(self, pid: int) -> Any:
        """The state table partition ``pid`` starts this batch from (None: empty)."""
        import pyarrow.compute as pc

        table = None
        if self.prev is not None and pid < self.prev_partitions:
            table = self.store.load_table(pid, self.prev)
        if not self.swap:
            return table
        moves = self.store.load_moves(self.batch_id)
        if table is not None:
            leaving = moves.filter(pc.equal(moves.column("from"), pid))
            table, _ = split_out(table, leaving.column(KEY_FIELD).combine_chunks())
        arriving = moves.filter(pc.equal(moves.column("to"), pid))
        sources = sorted(set(arriving.column("from").to_pylist()))
        incoming = [self.store.load_segment(self.batch_id, s, pid) for s in sources]
        for source, segment in zip(sources, incoming):
            expected = arriving.filter(pc.equal(arriving.column("from"), source))
            if not _holds_exactly(segment, expected.column(KEY_FIELD)):
                raise StateCorruptError(
                    f"{self.store.segment_path(self.batch_id, source)}: its segment for "
                    f"partition {pid} holds {segment.num_rows} rows, not the "
                    f"{expected.num_rows} keys batch {self.batch_id}'s plan moves from "
                    f"partition {source} to {pid} (each once); it is not this swap's segment")
        return merge_in(table, incoming)

    def carry_forward(self, pid: int) -> None:
        """Write ``pid``'s version as it stands (no task ran for it: an empty micro-batch)."""
        table = self.load(pid)
        if table is None:
            table = encode_state(PartitionState(), self.key_type, self.value_type)
        self.store.save_table(pid, self.batch_id, table)

    def save(self, pid: int, state: PartitionState, timing: dict[str, Any] | None = None
             ) -> None:
        """Write ``pid``'s version, and the task's ``timing`` in a file beside it
        (:meth:`KeyedStateStore.save_timing`). The state is the batch's result; the timing is
        a measurement, so failing to write it (a junk file in its place, a full disk) is
        logged and never fails the task."""
        self.store.save_table(pid, self.batch_id, encode_state(state, self.key_type,
                                                               self.value_type))
        if timing is not None:
            try:
                self.store.save_timing(pid, self.batch_id, timing)
            except (TrilinkError, OSError, ValueError, TypeError) as err:
                logger.warning("partition %d, batch %d: timing not written (%s: %s)", pid,
                               self.batch_id, type(err).__name__, err)

    def block_rows(self, keys: Any) -> dict[str, list[int]] | None:
        """Rows per block of ``keys`` (sparse: the blocks that got rows), or None without a
        block placement. O(rows), vectorised."""
        if self.blocks is None:
            return None
        if len(keys) == 0:
            return {"blocks": [], "rows": []}
        try:
            blocks = self.blocks.blocks(keys)
        except (TrilinkError, ValueError, TypeError, OverflowError) as err:
            # a measurement never fails the batch: the placement itself ran already
            logger.warning("rows per block not counted (%s: %s)", type(err).__name__, err)
            return None
        counts = np.bincount(blocks[blocks >= 0], minlength=self.blocks.num_blocks)  # no nulls
        used = np.flatnonzero(counts)
        return {"blocks": used.tolist(), "rows": counts[used].tolist()}


def _holds_exactly(segment: Any, keys: Any) -> bool:
    """Whether ``segment``'s key column holds exactly ``keys``, each once (a null key
    included). O(rows), vectorised."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if segment.num_rows != len(keys) or KEY_FIELD not in segment.column_names:
        return False
    if not segment.num_rows:
        return True
    held = segment.column(KEY_FIELD)
    try:
        wanted = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        if wanted.type != held.type:
            wanted = wanted.cast(held.type)
        distinct = pc.count_distinct(held, mode="all").as_py()
        found = pc.all(pc.is_in(held, value_set=wanted)).as_py()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return False
    return bool(distinct == segment.num_rows and found)


def state_types(df: DataFrame, key: str, processor: KeyedWatermarkProcessFunction
                ) -> tuple[Any, Any]:
    """The key's Arrow type and the processor's declared ``state_schema`` as an Arrow struct.

    Returns
    -------
    key_type : pyarrow.DataType or None
        None when Arrow has no type for the key's Spark type.
    value_type : pyarrow.StructType or None
        None when the processor declares no ``state_schema``.

    Raises
    ------
    InvalidArgumentTypeError, InvalidArgumentError
        A ``state_schema`` that is not a DDL string or a StructType, or not a struct.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    try:
        key_type = to_arrow_type(df.schema[key].dataType)
    except (TypeError, ValueError, NotImplementedError):
        key_type = None
    ddl = getattr(processor, "state_schema", None)
    if ddl is None:
        return key_type, None
    if not isinstance(ddl, (str, StructType)):
        raise InvalidArgumentTypeError(
            f"state_schema must be a Spark DDL string or a StructType, got {type(ddl).__name__}")
    try:
        parsed = ddl if isinstance(ddl, StructType) else StructType.fromDDL(ddl)
    except Exception as err:
        raise InvalidArgumentError(f"state_schema {ddl!r} is not a Spark DDL struct ({err})") \
            from None
    value_type = to_arrow_type(parsed)
    if not pa.types.is_struct(value_type):
        raise InvalidArgumentError(f"state_schema {ddl!r} must describe a struct")
    return key_type, value_type
