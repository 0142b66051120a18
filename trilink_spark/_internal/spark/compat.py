"""Classic PySpark and Spark Connect: the few things the package reads from a DataFrame's
session, done the same way on both kinds.

Classic PySpark drives a JVM in the driver through Py4J (``df._jdf``, ``df.rdd``,
``spark.sparkContext``). A Spark Connect session (``SparkSession.builder.remote(...)``) sends
plans to a server over gRPC: the client has no JVM and no RDDs, and a ``foreachBatch``
function runs in a Python process of the server. The helpers here use public DataFrame APIs
(``explain``, ``mapInArrow``) where classic PySpark would reach into the JVM, so the callers
work on both; what has no Connect equivalent is reported as unavailable (``None``), or refused
with :class:`~trilink_spark.errors.ConnectUnsupportedError` by :func:`require_classic`.

Examples
--------
>>> is_connect(object())
False
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ...errors import ConnectUnsupportedError
from ..validation import choice

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "frame_of_arrow",
    "is_connect",
    "require_classic",
    "plan_text",
    "num_partitions",
    "partition_counts",
    "streaming_query_id",
    "EXPLAIN_MODES",
]

#: The modes ``DataFrame.explain`` takes.
EXPLAIN_MODES = ("simple", "extended", "codegen", "cost", "formatted")

_CONNECT_PACKAGE = "pyspark.sql.connect."


def is_connect(obj: Any) -> bool:
    """Whether ``obj`` (a SparkSession, DataFrame or Column) belongs to Spark Connect.

    Parameters
    ----------
    obj : object
        Anything; objects that are not PySpark's are never Connect ones.

    Returns
    -------
    bool
        True for Spark Connect objects (subclasses included), False for classic ones.

    Notes
    -----
    Cost: none, a look at the class; no PySpark module is imported.

    Examples
    --------
    >>> is_connect("a string")
    False
    """
    return any(cls.__module__.startswith(_CONNECT_PACKAGE) for cls in type(obj).__mro__)


def require_classic(obj: Any, what: str, instead: str) -> None:
    """Refuse a Spark Connect ``obj`` for a feature that needs classic PySpark.

    Parameters
    ----------
    obj : object
        The DataFrame, session or column the feature was given.
    what : str
        The feature, as the message names it.
    instead : str
        What to use on Spark Connect.

    Raises
    ------
    ConnectUnsupportedError
        When ``obj`` is a Spark Connect object.

    Notes
    -----
    Cost: none.

    Examples
    --------
    >>> require_classic(object(), "this", "that")  # classic (or not Spark at all): no error
    """
    if is_connect(obj):
        raise ConnectUnsupportedError(
            f"{what} needs classic PySpark (a JVM in the driver), not Spark Connect; {instead}"
        )


class _ThreadCapture(io.TextIOBase):
    """A stdout that keeps what one thread writes and passes every other thread's writes on."""

    def __init__(self, passthrough: Any) -> None:
        super().__init__()
        self._thread = threading.get_ident()
        self._passthrough = passthrough
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        if threading.get_ident() == self._thread:
            self._parts.append(text)
        else:
            self._passthrough.write(text)
        return len(text)

    def flush(self) -> None:
        self._passthrough.flush()

    def getvalue(self) -> str:
        return "".join(self._parts)


_STDOUT_LOCK = threading.Lock()


def plan_text(df: DataFrame, mode: str = "simple") -> str:
    """What ``df.explain(mode=mode)`` prints, as a string (classic and Spark Connect).

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    mode : str
        One of :data:`EXPLAIN_MODES`. ``"simple"`` gives the physical plan only.

    Returns
    -------
    str
        The text, headers (``== Physical Plan ==``) included. Once a classic DataFrame has run
        with adaptive execution, its plan is the final one followed by the initial one.

    Notes
    -----
    Cost: Spark analyses and plans the query (on Spark Connect: one round trip to the server);
    no Spark job runs. ``sys.stdout`` is replaced during the call (under a lock): what other
    threads print meanwhile still reaches the previous stdout.

    Examples
    --------
    >>> plan_text(spark.range(3))  # doctest: +SKIP
    '== Physical Plan ==\\n*(1) Range (0, 3, step=1, splits=2)\\n\\n'
    """
    import sys

    choice(mode, "mode", EXPLAIN_MODES)
    with _STDOUT_LOCK:
        capture = _ThreadCapture(sys.stdout)
        with contextlib.redirect_stdout(capture):
            df.explain(mode=mode)
    return capture.getvalue()


def _count_partition(batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` body: one row (partition id, rows) per partition, empty ones included."""
    import pyarrow as pa
    from pyspark import TaskContext

    rows = sum(batch.num_rows for batch in batches)
    context = TaskContext.get()
    pid = context.partitionId() if context is not None else 0
    yield pa.RecordBatch.from_arrays([pa.array([pid], pa.int64()), pa.array([rows], pa.int64())],
                                     names=["pid", "rows"])


def partition_counts(df: DataFrame) -> npt.NDArray[np.int64]:
    """Rows on each partition of ``df``, empty partitions included (classic and Spark Connect).

    Returns
    -------
    numpy.ndarray of int64
        Index = partition id; its length is the number of partitions (0 for a DataFrame with
        no partition at all, as an empty local relation on Spark Connect).

    Notes
    -----
    Cost: runs one Spark job over ``df`` (``mapInArrow``): each task streams its partition to
    a Python worker as Arrow batches of one null-typed column (no column data: only the row
    count crosses), and one row per partition reaches the driver. ``spark_partition_id()``
    with ``groupBy`` would miss empty partitions.

    Examples
    --------
    >>> partition_counts(spark.range(0, 10, 1, 4)).tolist()  # doctest: +SKIP
    [2, 3, 2, 3]
    """
    from pyspark.sql import functions as F

    probe = df.select(F.lit(None).alias("_tl_none"))
    rows = probe.mapInArrow(_count_partition, "pid long, rows long").collect()
    pairs = [(int(r["pid"]), int(r["rows"])) for r in rows]
    loads = np.zeros(max([0] + [p + 1 for p, _ in pairs]), dtype=np.int64)
    for pid, count in pairs:
        loads[pid] += count
    return loads


def num_partitions(df: DataFrame) -> int:
    """Number of partitions of ``df`` (classic and Spark Connect).

    Notes
    -----
    Cost: classic: ``df.rdd.getNumPartitions()``, which plans the query and builds its RDD
    (with adaptive execution, the shuffle stages before the final one run). Spark Connect has
    no RDDs: :func:`partition_counts` runs one Spark job over ``df``; call that instead when
    the rows per partition are wanted too.

    Examples
    --------
    >>> num_partitions(spark.range(0, 10, 1, 4))  # doctest: +SKIP
    4
    """
    if is_connect(df):
        return int(partition_counts(df).size)
    return int(df.rdd.getNumPartitions())


def streaming_query_id(batch_df: DataFrame) -> str | None:
    """Id of the streaming query running this ``foreachBatch`` batch, or None.

    Returns
    -------
    str or None
        The query's id (stable across restarts from the same checkpoint). None when called
        outside a streaming query (a function called by hand), and always on Spark Connect:
        its server runs ``foreachBatch`` in a Python process that is not told the query id.

    Notes
    -----
    Cost: classic: one Py4J call (the ``sql.streaming.queryId`` local property of the calling
    thread); Spark Connect: none.

    Examples
    --------
    >>> streaming_query_id(spark.range(3)) is None  # not in a streaming query  # doctest: +SKIP
    True
    """
    if is_connect(batch_df):
        return None
    try:
        value = batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception:  # a session without a SparkContext (stopped, or another kind)
        return None
    return value if isinstance(value, str) and value else None


def frame_of_arrow(spark: Any, table: Any, schema: Any = None) -> DataFrame:
    """``spark.createDataFrame(table, schema)`` for a ``pyarrow.Table``, with its chunks
    combined first: PySpark (4.3) silently drops the rows after an empty record batch of a
    multi-chunk table (batches of 1, 0 and 2 rows give a frame of 1 row). Every Arrow table
    the package turns into a DataFrame goes through here. Cost: O(rows) when the table has
    several chunks (one copy), O(1) otherwise; no Spark job.

    Examples
    --------
    >>> import pyarrow as pa
    >>> t = pa.table({"k": pa.chunked_array([pa.array(["a"]), pa.array([], pa.string()),
    ...                                      pa.array(["b", "c"])])})
    >>> frame_of_arrow(spark, t).count()  # doctest: +SKIP
    3
    """
    combined = table.combine_chunks()
    frame: DataFrame = (spark.createDataFrame(combined) if schema is None
                        else spark.createDataFrame(combined, schema=schema))
    return frame
