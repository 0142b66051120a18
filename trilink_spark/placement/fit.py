"""Fitting a table strategy on the executors: the heaviest keys by name, the rest by group.

:func:`fit_table` is what :func:`~trilink_spark.key_by` (``fit="full"`` or ``"sample"``) does
for a table strategy (LeastKey, LeastCount, random Weight): it counts the keys with Spark on the
executors and brings the driver at most ``max_keys`` keys and one load per key group, never
every key (:mod:`trilink_spark.partitioners.tables.table`, bounded tables).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .._internal.spark.compat import frame_of_arrow
from .._internal.validation import choice, refuse_streaming
from ..columns import TABLE_KEY_COL, column_of
from ..errors import InvalidKeyTypeError
from ..partitioners.core.keys import check_null_policy, null_key_error, null_partition
from ..partitioners.tables.table import TablePartitioner
from .plans import key_kind, table_frame

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

__all__ = ["fit_table", "key_counts", "key_head", "KeyHead", "scan_sample", "SampleScan",
           "FIT_HOWS",
           "CANDIDATE_SAMPLE", "EXACT_MARGIN"]


_FIT_KEY, _FIT_ROWS, _FIT_PART, _FIT_GROUP, _FIT_KEYS = (
    "_tl_fit_key", "_tl_fit_rows", "_tl_fit_part", "_tl_fit_group", "_tl_fit_keys")


#: How :func:`fit_table` finds the heaviest keys: ``"aggregate"`` counts every key with
#: Spark's aggregation; ``"sample"`` finds candidates on a sample and counts only them.
FIT_HOWS: tuple[str, ...] = ("aggregate", "sample")


def fit_table(df: DataFrame, key: str, p: TablePartitioner, fraction: float = 1.0,
              seed: int = 0, how: str | None = None) -> None:
    """Teach table strategy ``p`` the keys of ``df``'s column ``key`` without ever bringing
    every key to the driver.

    ``how="aggregate"``: one Spark job counts every key (Spark's hash
    aggregation, on the executors) and returns, in one result, the counts of the keys
    ``p``'s table holds, the heaviest keys it does not (as many as it has entries left:
    ``takeOrdered`` by count, then key), and the rows and distinct keys of every key group
    over all keys; Spark reuses the aggregation's exchange for the three parts. Every count
    is exact, and so is the choice of the heaviest keys.

    ``how="sample"`` (the default for LeastCount and random Weight, whose group loads are
    rows: measured the faster at a million keys and more, where the aggregation's top-k
    merges ``max_keys`` rows from every task on one, ``benches/RESULTS.md``; LeastKey, whose
    group load is its number of keys, defaults to ``"aggregate"``, which counts them
    exactly):

    1. One Spark job over the key column returns, per key group
       (``pmod(hash(key), p.num_groups)``), its rows and an estimate of its distinct keys
       (``approx_count_distinct``, 5 % relative error per group, a fraction of a percent
       over their sum), and the heaviest keys of a
       :data:`CANDIDATE_SAMPLE` Bernoulli sample (``takeOrdered`` by count): the candidates
       for entries.
    2. Few keys (the estimate within :data:`EXACT_MARGIN` of the entries ``p`` has left):
       one aggregation counts every key exactly, at most ``max_keys + 1`` of them to the
       driver, and when they all fit, ``p`` learns them one by one, exactly as a per-key
       table always did. Few rows (a sample smaller than the entries left): the
       ``"aggregate"`` way instead.
    3. Else one job counts the candidates and the keys ``p``'s table holds exactly (a
       broadcast semi-join, then Spark's aggregation: at most that many rows back), the
       heaviest candidates get the entries left and every other key goes by its group,
       whose load is its rows less the counted keys' rows
       (:meth:`~trilink_spark.partitioners.tables.table.TablePartitioner.fit_loads`).

    The explicit keys' counts are exact; which keys are the heaviest is found on the
    sample: a key of 150 rows is sampled with 95 % probability, one of 350 rows with
    99.9 %, and a lighter key that is missed (where it matters little which keys get
    entries) goes by its group. The groups' key counts (LeastKey's load) are estimates.

    Parameters
    ----------
    df : DataFrame
        A bounded frame (a stream is refused, as by :func:`key_counts`).
    key : str
        The key column (int, long, string or binary).
    p : TablePartitioner
        Fitted in place.
    fraction, seed : float, int
        A Bernoulli sample of the rows to learn from (``fit="sample"``), seeded.
    how : {"aggregate", "sample"}, optional
        How the heaviest keys are found (above); default by the strategy's load.

    Raises
    ------
    NullKeyError
        A null key under the null policy ``"error"``.

    Notes
    -----
    Cost, ``"aggregate"``: one Spark job, one aggregation exchange of the key column
    (map-side combined), a broadcast of ``p``'s table when it holds keys, and a top-k per
    task. ``"sample"``: two Spark jobs, each a scan of the key column with map-side combined aggregations
    whose exchanges carry at most ``num_groups`` + ``max_keys`` rows per task (the small
    case: one full per-key aggregation instead of the second), and a broadcast of the
    candidates. The driver receives at most ``len(p) + max_keys + num_groups`` rows:
    memory O(``max_keys`` + groups), never O(distinct keys). A faster fit than one
    aggregation of every key (``benches/RESULTS.md``, the table-scale section).

    Examples
    --------
    >>> p = tl.LeastCountPartitioner(8)  # doctest: +SKIP
    >>> fit_table(df, "user", p)  # doctest: +SKIP
    >>> p.bounded  # more than 65,536 users: the heaviest by name, the rest by group  # doctest: +SKIP
    True
    """
    from pyspark.sql import functions as F

    _refuse_stream(df)
    kind, dtype = key_kind(df, key)
    if kind is None:  # pragma: no cover - _check_strategy_for refused it already
        raise InvalidKeyTypeError(f"key column {key!r} cannot be placed through a table")
    spark = df.sparkSession
    src = df.select(column_of(key).alias(_FIT_KEY))
    if fraction < 1.0:
        src = src.sample(fraction=fraction, seed=seed)
    k, c = F.col(_FIT_KEY), F.col(_FIT_ROWS)
    group = _group_of(p, kind)
    room = _room(p)
    counted = src.groupBy(_FIT_KEY).agg(F.count(F.lit(1)).alias(_FIT_ROWS))
    if how is None:
        how = "aggregate" if p.counts_keys else "sample"
    if choice(how, "how", FIT_HOWS) == "aggregate":
        named, by_group, _ = _aggregated(_union(_aggregate_parts(counted, p, kind, dtype)))
        _learn(p, named, by_group, key, exact=named.num_rows >= _distinct(by_group))
        return
    groups = src.groupBy(group.alias(_FIT_GROUP)).agg(
        F.count(F.lit(1)).alias(_FIT_ROWS),
        F.approx_count_distinct(k, 0.05).cast("bigint").alias(_FIT_KEYS))
    first = groups.select(F.lit(2).alias(_FIT_PART), F.lit(None).cast(dtype).alias(_FIT_KEY),
                          F.col(_FIT_ROWS), F.col(_FIT_GROUP), F.col(_FIT_KEYS))
    if room:
        sampled = src.where(k.isNotNull()).sample(fraction=CANDIDATE_SAMPLE, seed=seed + 1)
        top = sampled.groupBy(_FIT_KEY).agg(F.count(F.lit(1)).alias(_FIT_ROWS)) \
            .orderBy(c.desc(), k.asc()).limit(room)
        first = first.unionByName(_listed(1, top))
    summary = first.toArrow()
    part = summary.column(_FIT_PART).to_numpy()
    by_group = summary.filter(pa.array(part == 2))
    estimate = float(pa.compute.sum(by_group.filter(pa.compute.greater_equal(
        by_group.column(_FIT_GROUP), 0)).column(_FIT_KEYS)).as_py() or 0)
    if room and estimate <= room * EXACT_MARGIN:
        every = _listed(1, counted.where(k.isNotNull()).limit(len(p) + room + 1)).toArrow()
        if every.num_rows <= len(p) + room:  # every key: the per-key fit, exactly
            _learn(p, every, by_group, key, exact=True)
            return
    rows = float(pa.compute.sum(by_group.column(_FIT_ROWS)).as_py() or 0)
    if room and rows * CANDIDATE_SAMPLE < room:
        # a sample too small to name the entries left: the few rows are counted instead
        fit_table(df, key, p, fraction, seed, how="aggregate")
        return
    candidates = summary.filter(pa.array(part == 1)).column(_FIT_KEY).combine_chunks()
    if len(p):
        table_keys = table_frame(spark, p, kind, dtype).select(F.col(TABLE_KEY_COL))
    names = frame_of_arrow(spark, pa.table({TABLE_KEY_COL: candidates})).select(
        F.col(TABLE_KEY_COL).cast(dtype).alias(TABLE_KEY_COL))
    if len(p):
        names = names.unionByName(table_keys)
    exact = counted.join(F.broadcast(names.distinct()), k == F.col(TABLE_KEY_COL), "left_semi")
    _learn(p, _listed(1, exact).toArrow(), by_group, key, exact=False)


def _refuse_stream(df: DataFrame) -> None:
    """Refuse a streaming frame: every count here is a job over the whole frame."""
    refuse_streaming(df, "strategy='auto' (or fitting a table strategy)", "it counts the keys with "
                     "a job before placing them", "On a stream name a stateless strategy ('hash',"
                     " 'modulo', 'weight') or pass a fitted one with fit='none'; or place each "
                     "micro-batch in writeStream.foreachBatch (adaptive_foreach_batch)")


def key_counts(df: DataFrame, key: str, fraction: float, seed: int, null_policy: str) -> Any:
    """``{key: count}`` as an Arrow table sorted by key (deterministic; the null key, kept
    under the null policies ``"group"`` and ``"partition0"``, last). Raises
    :class:`~trilink_spark.errors.NullKeyError` for a null key under ``"error"``. One Spark
    aggregation job over the key column (of a ``fraction`` sample)."""
    from pyspark.sql import functions as F

    _refuse_stream(df)
    src = df.select(column_of(key))
    if fraction < 1.0:
        src = src.sample(fraction=fraction, seed=seed)
    table = src.groupBy(column_of(key)).agg(F.count(F.lit(1)).alias("count")).toArrow()
    if table.column(0).null_count and check_null_policy(null_policy) == "error":
        raise null_key_error(f"column {key!r} has null keys")
    return table.sort_by([(table.column_names[0], "ascending")])


#: The share of rows :func:`fit_table` samples to find the candidates for a table's entries.
CANDIDATE_SAMPLE = 0.02
#: :func:`fit_table` counts every key exactly when its estimate of the new keys is at most
#: this many times the entries the table has left.
EXACT_MARGIN = 1.1


def _room(p: TablePartitioner) -> int:
    """The entries table ``p`` has left."""
    return 0 if p.bounded else max(0, p.max_keys - len(p))


def _group_of(p: TablePartitioner, kind: str) -> Column:
    """A key's group as ``p`` hashes it (``-1`` for the null key), over :data:`_FIT_KEY`."""
    from pyspark.sql import functions as F

    k = F.col(_FIT_KEY)
    spark_type = {"int": "int", "long": "bigint"}.get(p.fallback_type(kind))
    hashed = F.hash(k.cast(spark_type)) if spark_type is not None else F.hash(k)
    return F.when(k.isNull(), F.lit(-1)).otherwise(F.pmod(hashed, F.lit(p.num_groups)))


def _listed(part: int, rows: DataFrame) -> DataFrame:
    """Counted keys as rows of the fit's result (part ``part``)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    return rows.select(F.lit(part).alias(_FIT_PART), F.col(_FIT_KEY),
                       F.col(_FIT_ROWS).cast("bigint").alias(_FIT_ROWS),
                       F.lit(None).cast(T.IntegerType()).alias(_FIT_GROUP),
                       F.lit(None).cast(T.LongType()).alias(_FIT_KEYS))


def _aggregate_parts(counted: DataFrame, p: TablePartitioner, kind: str, dtype: DataType,
                     placements: Sequence[Callable[[Column], Column]] = ()) -> list[DataFrame]:
    """The parts of the ``"aggregate"`` fit over ``counted`` (every key's rows, one
    aggregation whose exchange the parts share): every group's rows and keys (part 2), the
    counts of the keys ``p`` holds and of the heaviest it does not, as many as it has
    entries left (part 1); and the rows per partition of each of ``placements`` (part
    ``3 + i``), summed by the groups' own aggregation (one exchange for all)."""
    from pyspark.sql import functions as F

    k, c = F.col(_FIT_KEY), F.col(_FIT_ROWS)
    units = [F.struct(F.lit(2).alias(_FIT_PART), _group_of(p, kind).alias(_FIT_GROUP),
                      F.lit(1).alias(_FIT_KEYS))]
    units += [F.struct(F.lit(3 + i).alias(_FIT_PART), place(k).cast("int").alias(_FIT_GROUP),
                       F.lit(0).alias(_FIT_KEYS)) for i, place in enumerate(placements)]
    unit = F.col("_tl_fit_unit")
    parts = [counted.select(c, F.explode(F.array(*units)).alias("_tl_fit_unit"))
             .groupBy(unit[_FIT_PART].alias(_FIT_PART), unit[_FIT_GROUP].alias(_FIT_GROUP))
             .agg(F.sum(c).cast("bigint").alias(_FIT_ROWS),
                  F.sum(unit[_FIT_KEYS]).cast("bigint").alias(_FIT_KEYS))
             .select(F.col(_FIT_PART), F.lit(None).cast(dtype).alias(_FIT_KEY),
                     F.col(_FIT_ROWS), F.col(_FIT_GROUP), F.col(_FIT_KEYS))]
    unknown = counted.where(k.isNotNull())
    if len(p):
        frame = table_frame(counted.sparkSession, p, kind, dtype)
        parts.append(_listed(1, counted.join(frame, k == F.col(TABLE_KEY_COL), "left_semi")))
        unknown = unknown.join(frame, k == F.col(TABLE_KEY_COL), "left_anti")
    room = _room(p)
    if room:
        parts.append(_listed(1, unknown.orderBy(c.desc(), k.asc()).limit(room)))
    return parts


def _union(parts: list[DataFrame]) -> DataFrame:
    query = parts[0]
    for extra in parts[1:]:
        query = query.unionByName(extra)
    return query


def _aggregated(query: DataFrame) -> tuple[Any, Any, Any]:
    """The fit's result, run: the listed keys (part 1), the groups (part 2), the rest."""
    result = query.toArrow()
    part = result.column(_FIT_PART).to_numpy()
    return (result.filter(pa.array(part == 1)), result.filter(pa.array(part == 2)),
            result.filter(pa.array(part > 2)))


def _distinct(by_group: Any) -> int:
    """The distinct non-null keys over the groups' key counts."""
    nonnull = pa.compute.greater_equal(by_group.column(_FIT_GROUP), 0)
    return int(pa.compute.sum(by_group.filter(nonnull).column(_FIT_KEYS)).as_py() or 0)


@dataclass(frozen=True)
class SampleScan:
    """What one Spark job learns of a key column for ``strategy="auto"``
    (:func:`scan_sample`): every count the driver may hold, never every key.

    Attributes
    ----------
    rows, nulls, distinct, heaviest : int
        The rows, the null key's rows, the distinct non-null keys and the heaviest key's
        rows (the null key counted as one key).
    listed : pyarrow.Table
        The heaviest non-null keys (at most the template table's ``max_keys``) and their
        exact rows, sorted by key: every key when ``distinct <= max_keys``.
    loads : list of numpy.ndarray
        Rows per partition of every placement given to :func:`scan_sample`, in order.
    """

    key: str
    rows: int
    nulls: int
    distinct: int
    heaviest: int
    listed: Any = field(repr=False)
    by_group: Any = field(repr=False)
    loads: list[npt.NDArray[np.float64]] = field(repr=False)

    @property
    def complete(self) -> bool:
        """Whether :attr:`listed` holds every non-null key."""
        return bool(self.listed.num_rows >= self.distinct)

    def counts(self) -> tuple[Any, npt.NDArray[np.float64]]:
        """:attr:`listed`'s keys (an Arrow array) and rows."""
        return (self.listed.column(_FIT_KEY).combine_chunks(),
                self.listed.column(_FIT_ROWS).to_numpy().astype(np.float64))

    def fit(self, p: TablePartitioner) -> npt.NDArray[np.float64]:
        """Fit fresh table ``p`` (the template's kind: same groups, hashing and entries) as
        :func:`fit_table` with ``how="aggregate"`` would on the scanned data, and return the
        rows per partition it gives them. O(``max_keys`` log + groups), on the driver."""
        _learn(p, self.listed, self.by_group, self.key, exact=self.complete)
        keys, rows = self.counts()
        n = p.num_partitions
        loads = np.bincount(p.lookup(keys), weights=rows, minlength=n).astype(np.float64)
        groups = p.groups
        if groups is not None:  # every key not listed goes by its group
            gid = pa.compute.fill_null(self.by_group.column(_FIT_GROUP), -2).to_numpy()
            g_rows = self.by_group.column(_FIT_ROWS).to_numpy().astype(np.float64)
            ok = gid >= 0
            rest = np.bincount(gid[ok], weights=g_rows[ok], minlength=p.num_groups)
            rest -= np.bincount(p.key_groups(keys), weights=rows, minlength=p.num_groups)
            loads += np.bincount(groups, weights=np.maximum(rest, 0.0), minlength=n)
        if self.nulls:
            loads[null_partition(p.null_policy, n)] += self.nulls
        return loads


@dataclass(frozen=True)
class KeyHead:
    """Every key of a key column when it has at most ``limit`` (:func:`key_head`).

    Attributes
    ----------
    complete : bool
        Whether the column has at most ``limit`` distinct non-null keys; only then do the
        other fields hold anything.
    keys, rows : pyarrow.Array, numpy.ndarray
        The non-null keys, sorted, and their rows.
    nulls : int
        The null key's rows.
    """

    complete: bool
    keys: Any = field(repr=False)
    rows: npt.NDArray[np.float64] = field(repr=False)
    nulls: int

    @property
    def total(self) -> int:
        """Every row counted."""
        return int(self.rows.sum()) + self.nulls


def key_head(df: DataFrame, key: str, limit: int) -> KeyHead:
    """The keys of ``df[key]`` and their rows, if there are at most ``limit`` of them.

    One Spark aggregation job whose result stops at ``limit + 2`` keys: the driver never
    holds more, whatever the column holds. Cost: one scan of the key column and one
    map-side combined exchange, as ``groupBy(key).count()``.
    """
    from pyspark.sql import functions as F

    _refuse_stream(df)
    got = df.select(column_of(key).alias(_FIT_KEY)).groupBy(_FIT_KEY).agg(
        F.count(F.lit(1)).alias(_FIT_ROWS)).limit(limit + 2).toArrow()
    is_null = pa.compute.is_null(got.column(_FIT_KEY)).to_numpy(zero_copy_only=False)
    rows = got.column(_FIT_ROWS).to_numpy().astype(np.float64)
    nulls = int(rows[is_null].sum())
    kept = got.filter(pa.array(~is_null)).sort_by([(_FIT_KEY, "ascending")])
    if got.num_rows > limit + 1 or kept.num_rows > limit:
        return KeyHead(False, pa.array([], got.schema.field(_FIT_KEY).type),
                       np.zeros(0), nulls)
    return KeyHead(True, kept.column(_FIT_KEY).combine_chunks(),
                   kept.column(_FIT_ROWS).to_numpy().astype(np.float64), nulls)


def scan_sample(df: DataFrame, key: str, template: TablePartitioner,
                placements: Sequence[Callable[[Column], Column]]) -> SampleScan:
    """Count ``df[key]`` for ``strategy="auto"`` in one Spark job: the ``"aggregate"`` fit of
    fresh table ``template`` (the heaviest ``max_keys`` keys exactly and every group's rows
    and keys), and the rows per partition of each of ``placements`` (a stateless
    strategy's partition of a key column, ``-1`` for a row it does not place).

    Notes
    -----
    One job: one aggregation exchange of the key column (map-side combined), whose output
    every part reads. The driver receives at most ``max_keys`` keys, ``num_groups`` + 1
    group rows and ``n`` loads per placement: memory O(``max_keys`` + groups).
    """
    from pyspark.sql import functions as F

    _refuse_stream(df)
    kind, dtype = key_kind(df, key)
    if kind is None:  # pragma: no cover - the caller scores only placeable keys
        raise InvalidKeyTypeError(f"key column {key!r} cannot be placed through a table")
    counted = df.select(column_of(key).alias(_FIT_KEY)).groupBy(_FIT_KEY).agg(
        F.count(F.lit(1)).alias(_FIT_ROWS))
    parts = _aggregate_parts(counted, template, kind, dtype, placements)
    listed, by_group, rest = _aggregated(_union(parts))
    listed = listed.sort_by([(_FIT_KEY, "ascending")])
    gid = pa.compute.fill_null(by_group.column(_FIT_GROUP), -2).to_numpy()
    g_rows = by_group.column(_FIT_ROWS).to_numpy()
    nulls = int(g_rows[gid == -1].sum())
    top = listed.column(_FIT_ROWS).to_numpy()
    n = template.num_partitions
    which = rest.column(_FIT_PART).to_numpy()
    pid = rest.column(_FIT_GROUP).to_numpy()
    got = rest.column(_FIT_ROWS).to_numpy().astype(np.float64)
    loads = []
    for i in range(len(placements)):
        mine = (which == 3 + i) & (pid >= 0)
        loads.append(np.bincount(pid[mine], weights=got[mine], minlength=n).astype(np.float64))
    return SampleScan(key, int(g_rows.sum()), nulls, _distinct(by_group),
                      max(int(top.max()) if top.size else 0, nulls), listed, by_group, loads)


def _learn(p: TablePartitioner, listed: Any, by_group: Any, key: str, exact: bool) -> None:
    """Teach ``p`` the exactly counted keys ``listed`` and the groups' loads ``by_group``
    (:func:`fit_table`): the keys the table knows and the heaviest new ones (as many as it
    has entries left) by name, the rest by group less the named keys' rows."""
    import pyarrow.compute as pc

    gid = pc.fill_null(by_group.column(_FIT_GROUP), -2).to_numpy()
    g_rows = by_group.column(_FIT_ROWS).to_numpy().astype(np.float64)
    g_keys = by_group.column(_FIT_KEYS).to_numpy().astype(np.float64)
    null_rows = float(g_rows[gid == -1].sum())
    if null_rows and p.null_policy == "error":
        raise null_key_error(f"column {key!r} has null keys")
    b = p.num_groups
    ok = gid >= 0
    rest_rows = np.bincount(gid[ok], weights=g_rows[ok], minlength=b).astype(np.float64)
    rest_keys = np.bincount(gid[ok], weights=g_keys[ok], minlength=b).astype(np.float64)
    listed = listed.sort_by([(_FIT_KEY, "ascending")])  # the per-key fit's order
    keys = listed.column(_FIT_KEY).combine_chunks()
    rows = listed.column(_FIT_ROWS).to_numpy().astype(np.float64)
    if exact:  # every key is listed: no rest
        p.fit_loads(keys, rows, None, null_rows)
        return
    known = np.asarray(p.lookup_known(keys), dtype=bool)
    room = 0 if p.bounded else max(0, p.max_keys - len(p))
    new_at = np.flatnonzero(~known)
    chosen = np.zeros(len(rows), dtype=bool)
    chosen[known] = True
    chosen[new_at[np.argsort(-rows[new_at], kind="stable")[:room]]] = True
    ids = p.key_groups(keys)
    rest_rows -= np.bincount(ids, weights=rows, minlength=b)  # the listed keys leave their
    rest_keys -= np.bincount(ids, minlength=b)                # groups' sums ...
    back = ~chosen  # ... and the candidates without an entry go back to theirs
    rest_rows += np.bincount(ids[back], weights=rows[back], minlength=b)
    rest_keys += np.bincount(ids[back], minlength=b)
    keep = pa.array(chosen)
    p.fit_loads(keys.filter(keep), rows[chosen],
                (np.maximum(rest_rows, 0.0), np.maximum(rest_keys, 0.0)), null_rows)
