"""What a keyed stream's state path holds, read without running the stream.

:func:`read_state` returns one row per key of a committed version as a Spark DataFrame, in the
manner of Spark's state data source reader (``spark.read.format("statestore")``);
:func:`state_summary` describes the path (keys and bytes per partition, stored versions, the
last committed batch, the placement, the swaps) without Spark, for ``trilink-spark state``.
Both only read: nothing under the path is created, changed or deleted.

Examples
--------
>>> from trilink_spark.keyed import read_state, state_summary
>>> read_state(spark, "/tmp/state").orderBy("key").show()  # doctest: +SKIP
>>> state_summary("/tmp/state")["last_committed"]  # doctest: +SKIP
41
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._internal.spark.compat import frame_of_arrow
from ..._internal.validation import INT64_MAX, count, short_repr
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from ...partitioners import BlockPartitioner
from ...state.formats import TASK_PHASES
from ...state.store import KEY_FIELD, KeyedStateStore
from ..swaps.placement import bound_placement, stored_key_type
from ..durable.codec import decode_keys, decode_state, read_counters
from ..durable.manifest import EVENT_TIME_KIND

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["read_state", "state_rows", "state_summary", "STATE_COLUMNS", "read_task_timings",
           "sum_counters", "read_state_values", "batch_profile", "driver_phases"]

logger = logging.getLogger(__name__)

#: The columns :func:`read_state` always returns, before the processor's declared values.
STATE_COLUMNS: tuple[str, ...] = ("key", "partition", "block", "watermark", "last_seen", "rows")


def _version(store: KeyedStateStore, manifest: dict[str, Any], batch_id: int | None) -> int:
    committed = [int(v) for v in manifest.get("committed", [])]
    if not committed:
        raise StateCorruptError(f"{store.path}/manifest.json names no committed batch")
    if batch_id is None:
        return committed[-1]
    batch_id = count(batch_id, "batch_id", low=0)
    if batch_id > committed[-1]:
        raise InvalidArgumentError(
            f"batch_id {batch_id} is not committed under {store.path}; the last committed "
            f"batch is {committed[-1]}")
    starts = sorted(int(s) for s in manifest.get("placements") or [])
    if starts and batch_id < starts[0]:
        raise InvalidArgumentError(
            f"batch_id {batch_id} is not committed under {store.path}: the stream's first "
            f"batch there is {starts[0]}")
    partitions = store.placement_at(batch_id, manifest)[1]
    if not all(batch_id in store.versions(p) for p in range(partitions)):
        kept = sorted(set(store.versions(0)))
        raise InvalidArgumentError(
            f"batch_id {batch_id} is no longer stored under {store.path} (keep_versions pruned "
            f"it); stored versions of partition 0: {kept}")
    return batch_id


def _state_arrow(store: KeyedStateStore, manifest: dict[str, Any], version: int) -> Any:
    """One Arrow table of :data:`STATE_COLUMNS` plus the declared values, vectorised over
    keys (no Python loop per key)."""
    table = store.key_table(version, extra=("high", "seen", "rows", "values"))
    blocks = _blocks(store, manifest, version, table.column(KEY_FIELD))
    return state_rows(table, _delay(store, manifest), blocks)


def state_rows(table: Any, delay: float, blocks: Any = None) -> Any:
    """The rows :func:`read_state` returns for a table of stored state, one per key.

    Parameters
    ----------
    table : pyarrow.Table
        The keys' stored state: ``key``, ``high`` (the highest on-time event time), ``seen``
        (the last event time), ``rows``, ``values`` (a struct of the declared state, JSON
        text without one, null without values), and ``partition`` (int32; 0 when absent), as
        :meth:`~trilink_spark.state.KeyedStateStore.key_table` reads them or
        :func:`~trilink_spark.keyed.durable.codec.encode_state` writes one partition's.
    delay : float
        The stream's delay in event-time units: a key's watermark is its ``high`` less it.
    blocks : pyarrow.Array, optional
        Each key's block (int32); null for every key when None (no block placement).

    Returns
    -------
    pyarrow.Table
        :data:`STATE_COLUMNS`, the watermark and ``last_seen`` null where the key has none
        (an infinite stored value), then one column per declared state field (named
        ``state_<name>`` when a column before it has its name), or ``values``. A key column
        of no type (no key at all) is a string column.

    Notes
    -----
    O(keys), vectorised: no Python loop per key.

    Examples
    --------
    >>> import math
    >>> import pyarrow as pa
    >>> table = pa.table({"key": ["a", "b"], "high": [10.0, -math.inf],
    ...                   "seen": [10.0, 4.0], "rows": [2, 1],
    ...                   "values": pa.array([{"rows": 2}, {"rows": 1}])})
    >>> state_rows(table, 2.0).to_pylist()[0]
    {'key': 'a', 'partition': 0, 'block': None, 'watermark': 8.0, 'last_seen': 10.0, 'rows': 2, 'state_rows': 2}
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    missing = pa.scalar(None, pa.float64())
    high = pc.cast(table.column("high"), pa.float64())
    seen = pc.cast(table.column("seen"), pa.float64())
    keys = table.column(KEY_FIELD)
    columns: dict[str, Any] = {
        "key": keys if not pa.types.is_null(keys.type) else keys.cast(pa.string()),
        "partition": (table.column("partition") if "partition" in table.column_names
                      else pa.array(np.zeros(n, dtype=np.int32))),
        "block": pa.nulls(n, pa.int32()) if blocks is None else blocks,
        "watermark": pc.if_else(pc.is_finite(high), pc.subtract(high, pa.scalar(delay)),
                                missing),
        "last_seen": pc.if_else(pc.is_finite(seen), seen, missing),
        "rows": pc.cast(table.column("rows"), pa.int64()),
    }
    values = table.column("values")
    if pa.types.is_struct(values.type):
        for i, field in enumerate(values.type):
            columns[_value_column(field.name, columns)] = pc.struct_field(values, [i])
    elif not pa.types.is_null(values.type):  # no declared schema: the values as JSON text
        columns["values"] = values
    return pa.table(columns)


def _delay(store: KeyedStateStore, manifest: dict[str, Any]) -> float:
    """The stream's delay in event-time units, from the manifest's configuration (0 when
    none is recorded); StateCorruptError naming the manifest for one that is not a finite
    number."""
    import math

    config = manifest.get("config") or {}
    delay = config.get("delay") if isinstance(config, dict) else config
    if delay is None:
        return 0.0
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) \
            or abs(delay) > INT64_MAX or not math.isfinite(delay):
        raise StateCorruptError(
            f"{store.path}/manifest.json records a delay of {short_repr(delay)} (config "
            f"{type(config).__name__}); a stream records a finite number of event-time units")
    return float(delay)


def _value_column(name: str, taken: dict[str, Any]) -> str:
    """The column name of the declared state value ``name``: ``name`` itself, or, when a
    column of :data:`STATE_COLUMNS` (or an earlier value) has it, ``state_<name>`` (prefixed
    again until free)."""
    while name in taken:
        name = f"state_{name}"
    return name


def _blocks(store: KeyedStateStore, manifest: dict[str, Any], version: int, keys: Any) -> Any:
    """Each key's block under the placement in force at ``version``, hashed as the key type
    its placement record holds (else the stored key column's), null for a null key and
    without a block placement. Vectorised over the Arrow keys: O(total key bytes)."""
    import pyarrow as pa

    placement, _, recorded = store.placement_record_at(version, manifest)
    if not isinstance(placement, BlockPartitioner) or not len(keys) \
            or pa.types.is_null(keys.type):
        return pa.nulls(len(keys), pa.int32())
    kind = recorded if recorded is not None else stored_key_type(keys.type)
    placement = bound_placement(placement, kind, recorded is not None)
    if not isinstance(placement, BlockPartitioner):  # pragma: no cover - binding keeps the kind
        return pa.nulls(len(keys), pa.int32())
    array = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    nulls = array.is_null()
    filled = placement.blocks(array.drop_null() if array.null_count else array)
    out = np.full(len(array), -1, dtype=np.int64)
    out[~np.asarray(nulls.to_numpy(zero_copy_only=False), dtype=bool)] = filled
    return pa.array(out.astype(np.int32), pa.int32(),
                    mask=np.asarray(nulls.to_numpy(zero_copy_only=False), dtype=bool))


def read_state(spark: SparkSession, state_path: str, batch_id: int | None = None) -> DataFrame:
    """One row per key of a keyed stream's committed state, as a DataFrame.

    Parameters
    ----------
    spark : SparkSession
        Classic or Connect.
    state_path : str
        The ``state_path`` a :func:`~trilink_spark.keyed_foreach_batch` stream writes.
    batch_id : int, optional
        A committed batch whose version is still stored (``keep_versions``); default the last
        committed one.

    Returns
    -------
    DataFrame
        ``key`` (the key column's type), ``partition`` (int), ``block`` (int: the key's block
        under a :class:`~trilink_spark.BlockPartitioner`, else null), ``watermark`` (the
        key's watermark, its highest event time less the delay; null before any on-time row)
        and ``last_seen`` (its last event time): timestamps where the event-time column is a
        timestamp, else doubles in the column's unit (a path last committed by a release that
        did not record the column's kind: doubles, microseconds for timestamps), ``rows`` (long: rows the key has sent), then one column per
        field of the processor's declared ``state_schema`` (or ``values``, the JSON text of
        each key's values, without one); a field named like one of the columns before it
        comes as ``state_<name>``. A null key (null policies ``"group"`` and
        ``"partition0"``) has a null ``block``; blocks are hashed as the key type the
        placement was recorded with.

    Raises
    ------
    InvalidArgumentTypeError
        ``state_path`` is not a str, or ``batch_id`` not an int (bools and floats refused).
    InvalidArgumentError
        The path is empty, not a directory or not a path or URI that can be read, or
        ``batch_id`` is not committed (after the last committed batch, or before the
        stream's first) or no longer stored.
    StateStoreError
        The path's filesystem cannot be reached.
    StateCorruptError
        The manifest or a state file is missing, damaged or foreign, or a key is stored in two
        partitions.

    Notes
    -----
    Cost: reads every partition's state file of that version on the driver (O(state)) and
    makes one local DataFrame of it from the Arrow table (no Python object per key; blocks
    hashed vectorised); no Spark job until the frame is used. Nothing on the path is
    written.

    Examples
    --------
    >>> from trilink_spark.keyed import read_state
    >>> read_state(spark, "/tmp/state").filter("rows > 100").show()  # doctest: +SKIP
    """
    store = KeyedStateStore.open_existing(state_path)
    manifest = _manifest_of(store)
    version = _version(store, manifest, batch_id)
    table = _state_arrow(store, manifest, version)
    if manifest.get(EVENT_TIME_KIND) == "timestamp":
        table = as_timestamps(table)
    logger.info("read_state: %d keys of batch %d under %s", table.num_rows, version, store.path)
    # the Arrow table itself (classic and Connect take it whole): no pandas round trip, no
    # Python object per key
    # one chunk per column: Spark reads the table's record batches, which must align
    return frame_of_arrow(spark, table, _spark_schema(table))


def as_timestamps(table: Any) -> Any:
    """``table`` (:func:`state_rows`) with ``watermark`` and ``last_seen``, microseconds,
    as UTC timestamps (a value out of a timestamp's range: null). O(keys), vectorised."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name in ("watermark", "last_seen"):
        at = table.schema.get_field_index(name)
        values = table.column(name).combine_chunks()
        ok = pc.and_(pc.is_finite(values), pc.less_equal(pc.abs(values), 2.0**62))
        whole = pc.if_else(ok, values, pa.scalar(None, pa.float64()))
        stamps = pc.floor(whole).cast(pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        table = table.set_column(at, pa.field(name, stamps.type), stamps)
    return table


def _manifest_of(store: KeyedStateStore) -> dict[str, Any]:
    """The state path's manifest; a path without one is refused by :func:`read_state` and
    :func:`state_summary` (``trilink-spark state``) alike. One read."""
    manifest = store.read_manifest()
    if manifest is None:
        raise StateCorruptError(
            f"{store.path} holds no manifest.json: not a keyed state path, or one no batch "
            "was ever run on (the first batch writes it)")
    return manifest


def _spark_schema(table: Any) -> Any:
    """The Spark schema of the Arrow table (a null key column, no keys at all, is a string)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    fields = []
    for field in table.schema:
        spark_type = StringType() if pa.types.is_null(field.type) else from_arrow_type(field.type)
        fields.append(StructField(field.name, spark_type, True))
    return StructType(fields)


def _brief(placement: Any) -> dict[str, Any] | None:
    """A placement's ``to_dict()`` with its tables (one entry per key or block) replaced by
    their lengths, so a summary stays small at millions of keys."""
    if placement is None:
        return None
    brief: dict[str, Any] = {}
    for name, value in placement.to_dict().items():
        if isinstance(value, (list, dict)) and len(value) > 16:
            brief[f"{name}_entries"] = len(value)
        else:
            brief[name] = value
    return brief


def state_summary(state_path: str) -> dict[str, Any]:
    """A summary of a keyed state path, without Spark.

    Returns
    -------
    dict
        ``path``, ``last_committed`` (None before the first commit), ``committed``,
        ``placement`` (the strategy in force, as its ``to_dict()``, a table longer than 16
        entries given as its length, ``table_entries``), ``partitions``: per
        partition ``{"partition", "keys", "bytes", "versions"}`` of the last committed
        version, ``keys`` and ``bytes`` in all, and ``swaps``: per swap batch
        ``{"batch", "partitions_before", "partitions_after", "moved_keys"}``.

    Raises
    ------
    InvalidArgumentError
        The path is not a directory.
    StateCorruptError
        The path holds no manifest (as :func:`read_state` says), or a stored file is
        missing, damaged or foreign.

    Notes
    -----
    Cost: reads the manifest, each partition's newest committed state file and each swap's
    plan (O(state)); nothing is written.
    """
    store = KeyedStateStore.open_existing(state_path)
    manifest = _manifest_of(store)
    out: dict[str, Any] = {"path": store.path, "last_committed": None, "committed": [],
                           "placement": None, "partitions": [], "keys": 0, "bytes": 0,
                           "swaps": []}
    if not manifest.get("committed"):
        return out
    committed = [int(v) for v in manifest["committed"]]
    version = committed[-1]
    placement, partitions = store.placement_at(version, manifest)
    out.update(last_committed=version, committed=committed, placement=_brief(placement))
    for p in range(partitions):
        table = store.load_table(p, version)  # read once: its size is the file's, not re-read
        keys = 0 if table is None else table.num_rows
        size = store.version_bytes(p, version)  # its snapshot and changelogs
        out["partitions"].append({"partition": p, "keys": keys, "bytes": size,
                                  "versions": store.versions(p)})
        out["keys"] += keys
        out["bytes"] += size
    for batch in store.swap_batches():
        plan = store.load_plan(batch) or {}
        out["swaps"].append({"batch": batch, "partitions_before": plan.get("partitions_before"),
                             "partitions_after": plan.get("partitions_after"),
                             "moved_keys": plan.get("moved_keys")})
    return json.loads(json.dumps(out, default=str))  # type: ignore[no-any-return]


def read_task_timings(store: KeyedStateStore, version: int | None = None) -> Any:
    """What each task of a committed batch measured of its own work.

    Parameters
    ----------
    store : KeyedStateStore
    version : int, optional
        A committed batch (the newest by default).

    Returns
    -------
    pandas.DataFrame
        Columns ``partition``, ``rows``, ``process_ms``, ``blocks``, ``sync``, ``keys_read``,
        ``snapshot``, ``upkeep_ms``, ``sync_ms``, ``read_ms``, ``hooks_ms``, ``write_ms``,
        ``executor``, ``host``
        (:meth:`~trilink_spark.keyed.KeyedBatchFunction.task_timings`).

    Raises
    ------
    InvalidArgumentTypeError
        ``version`` is not an int.
    InvalidArgumentError
        ``version`` is not a committed batch (the committed ones are named).
    """
    import pandas as pd

    if version is not None and (isinstance(version, bool)
                                or not isinstance(version, (int, np.integer))):
        raise InvalidArgumentTypeError(
            f"version must be an int (a committed batch id) or None, got "
            f"{type(version).__name__}")
    manifest = store.read_manifest() or {}
    committed = [int(c) for c in manifest.get("committed") or []]
    if version is not None and int(version) not in committed:
        raise InvalidArgumentError(
            f"batch {version} is not a committed version of {store.path}; the "
            f"committed ones are {committed}")
    if not committed:
        return pd.DataFrame({c: [] for c in _TIMING_COLUMNS})
    at, partitions = store.committed_layout(None if version is None else int(version))
    rows = []
    for p in range(partitions):
        t = store.timing(p, at)
        if t is None:
            rows.append((p, -1, -1.0, -1, "", -1, False, -1.0, *[-1.0] * len(TASK_PHASES),
                         "", ""))
            continue
        per_block = t.get("block_rows")
        phases = t.get("phases_ms") or {}
        rows.append((p, int(t["rows"]), float(t["process_ms"]),
                     -1 if per_block is None else len(per_block["blocks"]),
                     t.get("sync") or "", int(t.get("keys_read", -1)),
                     bool(t.get("snapshot", False)), float(t.get("upkeep_ms", -1.0)),
                     *[float(phases.get(name, -1.0)) for name in TASK_PHASES],
                     str(t.get("executor", "")), str(t.get("host", ""))))
    return pd.DataFrame(rows, columns=list(_TIMING_COLUMNS))


def driver_phases(batch_id: int, started: float, called: float, returned: float,
                  ended: float) -> dict[str, float]:
    """The driver's part of :func:`batch_profile` from its clock (``time.perf_counter``
    seconds): when the batch started, the user's function was called and returned, and the
    batch ended. O(1)."""
    return {"batch": batch_id, "plan_ms": (called - started) * 1e3,
            "job_ms": (returned - called) * 1e3, "commit_ms": (ended - returned) * 1e3,
            "total_ms": (ended - started) * 1e3}


def batch_profile(store: KeyedStateStore, driver: Mapping[str, float]) -> dict[str, Any]:
    """A batch's time, on the driver and in its tasks: what
    :meth:`~trilink_spark.keyed.KeyedBatchFunction.batch_profile` returns.

    Parameters
    ----------
    store : KeyedStateStore
    driver : mapping
        The runner's figures of the batch (:func:`driver_phases`): ``batch``; ``plan_ms``
        (prepare, place and build the batch's frame, before the user's function is called),
        ``job_ms`` (the user's function: the Spark jobs that run the keyed tasks and write
        the output), ``commit_ms`` (partitions without a task, the manifest, pruning and
        the history record) and ``total_ms``.

    Returns
    -------
    dict
        ``driver``'s fields; then, from the batch's task timings (:func:`read_task_timings`),
        the slowest task's ``task_ms`` (``process_ms`` plus ``upkeep_ms``) and each phase at
        its largest over the tasks: ``sync_ms`` (open or take over the local copy and
        bring it to the batch's version), ``read_ms`` (the touched keys' state),
        ``hooks_ms`` (the processor), ``write_ms`` (log, copy and commit the changes),
        ``upkeep_ms`` (snapshot start, compaction wait); and ``job_other_ms``, ``job_ms``
        less ``task_ms``: Spark's part of the job (scheduling, the exchange, Python
        workers, the output, and further waves of tasks). -1 where the tasks measured
        nothing (the file store, or the batch's records are pruned).

    Notes
    -----
    O(partitions) timing reads.

    Examples
    --------
    >>> batch_profile(store, {"batch": 3, "plan_ms": 40.0, "job_ms": 500.0,
    ...                       "commit_ms": 30.0, "total_ms": 570.0})  # doctest: +SKIP
    {'batch': 3, 'plan_ms': 40.0, ..., 'hooks_ms': 120.5, ..., 'job_other_ms': 210.2}
    """
    out: dict[str, Any] = {k: (int(v) if k == "batch" else round(float(v), 3))
                           for k, v in driver.items()}
    phases = [f"{name}_ms" for name in TASK_PHASES] + ["upkeep_ms"]
    try:
        tasks = read_task_timings(store, int(driver["batch"]))
    except InvalidArgumentError:  # pruned, or another runner committed since
        tasks = None
    ran = None if tasks is None else tasks[(tasks["rows"] >= 0) & (tasks["sync_ms"] >= 0)]
    if ran is None or not len(ran):
        out.update(dict.fromkeys(("task_ms", *phases, "job_other_ms"), -1.0))
        return out
    out["task_ms"] = round(float((ran["process_ms"] + ran["upkeep_ms"]).max()), 3)
    for column in phases:
        out[column] = round(float(ran[column].max()), 3)
    out["job_other_ms"] = round(max(out["job_ms"] - out["task_ms"], 0.0), 3)
    return out


_TIMING_COLUMNS = ("partition", "rows", "process_ms", "blocks", "sync", "keys_read",
                   "snapshot", "upkeep_ms", *[f"{name}_ms" for name in TASK_PHASES],
                   "executor", "host")


def sum_counters(store: KeyedStateStore) -> dict[str, int]:
    """Rows, late rows (key watermark) and late rows by the partition watermark, summed
    over the partitions' latest committed state (zeros before the first commit).
    O(partitions) state reads."""
    total = {"rows": 0, "late": 0, "late_partition": 0}
    if not (store.read_manifest() or {}).get("committed"):
        return total
    version, partitions = store.committed_layout()
    for p in range(partitions):
        found = read_counters(store.load_table(p, version), store.version_path(p, version))
        for name in total:
            total[name] += found.get(name, 0)
    return total


def read_state_values(store: KeyedStateStore, version: int | None = None
                 ) -> dict[Any, dict[str, Any]]:
    """Every key's stored values in the newest (or a given) committed version:
    ``{key: {name: value}}`` (:meth:`~trilink_spark.keyed.KeyedBatchFunction.state_values`).
    Keys as :meth:`~trilink_spark.state.KeyedStateStore.owners` and the key column give
    them: the null key ``None`` (never the runtime's NaN), integers exact ints (never the
    floats pandas makes of an integer column holding a null).

    Raises
    ------
    StateCorruptError
        A key is stored in two partitions, or a file is missing or corrupt.
    """
    owners = store.owners(version)
    manifest = store.read_manifest() or {}
    at = int(manifest["committed"][-1]) if version is None else version
    out: dict[Any, dict[str, Any]] = {}
    for p in sorted(set(owners.values())):
        where = store.version_path(p, at)
        table = store.load_table(p, at)
        values = decode_state(table, where).values
        column = table.column(KEY_FIELD)
        # row by row: the runtime's key of each row (NaN, floats) to the stored one
        for runtime, stored in zip(decode_keys(column), column.to_pylist()):
            if runtime in values:
                out[stored] = values[runtime]
    return out
