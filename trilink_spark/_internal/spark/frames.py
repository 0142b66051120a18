"""Plans built once and applied to many micro-batches: a stream's steady batch sends a few
Py4J commands, not one per column.

On a classic session every DataFrame call is a Py4J round trip, and passing a list of columns
converts it element by element: a ``select`` of 8 columns costs about 10 commands, a
``mapInArrow`` about 34 (its Python function is pickled and registered in the JVM each time).
A stream applies the same plan to every micro-batch, so:

- :class:`Projection` keeps the JVM sequence of its columns and selects it in one command;
- :class:`ArrowMap` registers its ``mapInArrow`` function once, over columns named by name,
  and applies it in one command; what changes from batch to batch reaches its tasks through a
  local property of the calling thread (:func:`batch_values`, :func:`task_batch_values`),
  which Spark ships with every task of the jobs that thread starts.

On Spark Connect (no Py4J) both build the plan as PySpark's own calls do. Neither holds
anything picklable: a copy of a runner builds its own.

Examples
--------
>>> from pyspark.sql import functions as F
>>> keep = Projection([F.col("id")])  # doctest: +SKIP
>>> keep(spark.range(3)).columns  # doctest: +SKIP
['id']
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import StateStoreError
from .compat import is_connect

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["Projection", "known_schema", "ArrowMap", "batch_values", "task_batch_values",
           "BATCH_PROPERTY"]

#: The prefix of the local property that carries a runner's per-batch values to its tasks
#: (the runner's token follows).
BATCH_PROPERTY = "spark.trilink.batch."


class Projection:
    """A ``select`` of fixed columns, applied to many frames (O(columns) once, then one
    Py4J command a frame on a classic session; ``df.select(*columns)`` on Spark Connect).

    Parameters
    ----------
    columns : sequence of Column
        Expressions that name their inputs (``F.col``), so that they resolve in any frame
        with those columns.
    fixed_schema : bool
        Every frame it is applied to has one schema (the caller keys the projection by it),
        so its output's schema is read once, from the first output, and given to the later
        ones (a classic frame reads its schema over Py4J, two commands, once per frame).
    """

    def __init__(self, columns: Sequence[Column], fixed_schema: bool = False) -> None:
        self.columns = tuple(columns)
        self.fixed_schema = fixed_schema
        self._seq: tuple[Any, Any] | None = None
        self._schema: Any = None

    def __call__(self, df: DataFrame) -> DataFrame:
        if is_connect(df):
            return df.select(*self.columns)
        from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

        spark = df.sparkSession
        owner = spark.sparkContext  # held: a restarted context's objects are not reused
        if self._seq is None or self._seq[0] is not owner:
            jvm: Any = spark.sparkContext._jvm
            self._seq = (owner, jvm.PythonUtils.toSeq([c._jc for c in self.columns]))
        out = ClassicFrame(df._jdf.select(self._seq[1]), spark)
        if self.fixed_schema:
            if self._schema is None:
                self._schema = out.schema
            else:
                known_schema(out, self._schema)
        return out

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a Projection holds JVM objects of its session: build one per process")


def known_schema(df: DataFrame, schema: Any) -> None:
    """Give ``df`` its ``schema``, known already, where PySpark caches a frame's schema on
    the frame (classic ``DataFrame.schema`` is a ``functools.cached_property``), so reading
    it costs no Py4J command; elsewhere nothing (the frame reads its own). ``schema`` must be
    the frame's: the caller's cache key guarantees it. O(1)."""
    import functools
    import inspect

    if isinstance(inspect.getattr_static(type(df), "schema", None), functools.cached_property):
        vars(df)["schema"] = schema


class ArrowMap:
    """``df.mapInArrow(func, schema)`` over frames with the columns ``columns``, its function
    registered once (a classic session then sends one Py4J command a frame).

    Parameters
    ----------
    func : callable
        The ``mapInArrow`` function; what differs between batches must reach it another way
        (:func:`batch_values`).
    schema : StructType
        Its output schema.
    columns : sequence of Column
        The input frames' columns by name (``F.col``), in order: each frame must have
        exactly these.
    """

    def __init__(self, func: Callable[[Iterator[Any]], Iterator[Any]], schema: Any,
                 columns: Sequence[Column]) -> None:
        self.func = func
        self.schema = schema
        self.columns = tuple(columns)
        self._column: tuple[Any, Any] | None = None

    def __call__(self, df: DataFrame) -> DataFrame:
        if is_connect(df):
            return df.mapInArrow(self.func, self.schema)
        from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame
        from pyspark.sql.pandas.functions import pandas_udf
        from pyspark.util import PythonEvalType

        spark = df.sparkSession
        owner = spark.sparkContext
        if self._column is None or self._column[0] is not owner:
            udf = pandas_udf(self.func, returnType=self.schema,  # type: ignore[call-overload]
                             functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
            self._column = (owner, udf(*self.columns)._jc)
        return ClassicFrame(df._jdf.mapInArrow(self._column[1], False, None), spark)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("an ArrowMap holds JVM objects of its session: build one per process")


@contextlib.contextmanager
def batch_values(spark: Any, token: str, values: dict[str, Any]) -> Iterator[bool]:
    """Within the block, the tasks of jobs this thread starts can read ``values``
    (:func:`task_batch_values` with the same ``token``); yields whether they can (False on
    Spark Connect, which has no local properties: pass the values in the function there).

    ``values`` is sent as JSON (finite and infinite floats, ints, strings, None, lists and
    dicts of those). Cost: two Py4J commands (set, and remove at the end)."""
    if is_connect(spark):
        yield False
        return
    sc = spark.sparkContext
    sc.setLocalProperty(BATCH_PROPERTY + token, json.dumps(values, allow_nan=True))
    try:
        yield True
    finally:
        sc.setLocalProperty(BATCH_PROPERTY + token, None)


def task_batch_values(token: str) -> dict[str, Any]:
    """Inside a task: the values the driver set with :func:`batch_values` for ``token``.

    Raises
    ------
    StateStoreError
        The task's job was not started by the thread that set them, inside the block: a
        batch's output frame computed on another thread (use ``pyspark.InheritableThread``),
        or after the batch (a cached frame evicted and computed again later).
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    raw = None if context is None else context.getLocalProperty(BATCH_PROPERTY + token)
    if not raw:
        raise StateStoreError(
            "a keyed batch's task ran without its batch's values: its output frame was "
            "computed outside the batch function's thread or after the batch ended; compute "
            "it inside the function, on its thread or a pyspark.InheritableThread started "
            "from it")
    try:
        values = json.loads(raw)  # reads Infinity back as json.dumps wrote it
    except ValueError as err:
        raise StateStoreError(f"local property {BATCH_PROPERTY + token}: not the batch's "
                              f"values ({err})") from err
    if not isinstance(values, dict):
        raise StateStoreError(f"local property {BATCH_PROPERTY + token}: not the batch's "
                              "values (not a JSON object)")
    return values
