"""Run a keyed process function on each micro-batch of a Structured Streaming query.

:func:`keyed_foreach_batch` returns a :class:`KeyedBatchFunction`, the ``foreachBatch``
callable: it places each micro-batch as :func:`~trilink_spark.keyed_process` does and keeps
each partition's state (watermarks, timers, window accumulators, user state) between
micro-batches in a :class:`~trilink_spark.state.KeyedStateStore`, versioned by batch id.

What committed state says (:func:`read_task_timings`, :func:`sum_counters`,
:func:`read_state_values`) is read by :mod:`~trilink_spark.keyed.records.state_reader`. What this
module calls: :mod:`~trilink_spark.keyed.durable.manifest` (the manifest protocol: one writer, the
version a batch starts from, the commit), :mod:`~trilink_spark.keyed.run.prepare` (arguments,
arrival order), :mod:`~trilink_spark.keyed.swaps.placement` (the batch's placement and the swaps
decided for it) and :mod:`~trilink_spark.keyed.run.task` (each partition's task and its state
I/O).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._internal.optiming import OperatorTimer, operator_timer
from ..._internal.spark.frames import ArrowMap, Projection, batch_values
from ..._internal.spark.session import conf_count, conf_get, session_confs
from ..._internal.spark.compat import streaming_query_id
from ..._internal.spark.executors import ensure_executors
from ..._internal.spark.locality import Preferred, Where, live_executors, locality_enabled
from ..._internal.spark.locality import new_counts, prefer
from ...errors import typed_task_errors
from ..._internal.validation import choice, refuse_streaming_batch_function, seconds
from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from ...columns import POS_COL, ColumnCache, python_input, python_input_columns
from ...partitioners import BlockPartitioner, Partitioner, TablePartitioner
from ...partitioners.core.keys import check_null_policy
from ...eventtime import delay_in_units, event_time_micros
from ...eventtime import time_kind as column_time_kind
from ...state.local import LOCAL_KEY_TYPES, supports_key_type
from ...state.foreach import StatefulBatchFunction
from ...state.store import KeyedStateStore
from ..semantics.process import KeyedWatermarkProcessFunction
from ..durable.local_sync import LocalConfig, LocalSync
from ..durable.manifest import PROCESSING_RECORD, batch_time, claim, commit_batch, runner_config
from ..durable.manifest import EVENT_TIME_KIND, start_version
from ..swaps.placement import KeyColumn, Placed, check_rebalancer, swap_report
from ..swaps.plan import SwapReport, SwapRequest, write_segments
from ..swaps.replanner import Replanner
from ..swaps.units import UnitRows, unit_rows
from ..records.history import RunHistory
from ..records.state_reader import batch_profile, driver_phases, read_state_values
from ..records.state_reader import read_task_timings, sum_counters
from .prepare import TagPlan, arrival_columns, arrival_order, check_processor
from .prepare import tag_plan
from .task import StateIO, partition_function, run_without_rows, state_types

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KeyedBatchFunction", "keyed_foreach_batch", "PreparedBatch"]

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class PreparedBatch:
    """One micro-batch as :meth:`KeyedBatchFunction.__call__` prepared it for its tasks.

    Attributes
    ----------
    tagged : DataFrame
        The batch's rows with their arrival positions, not yet placed.
    delay, idle : float
        ``delay`` and ``idle_timeout`` in the event-time column's units.
    out_schema, arrow_schema
        The processor's output schema (Spark, Arrow).
    key_type, value_type
        The state's key and value Arrow types.
    config : dict
        The run's configuration as the manifest records it (a restart must match it).
    query : str or None
        The streaming query's id (the same writer across a restart).
    confs : dict
        The session's confs, read once for the batch (:func:`session_confs`).
    """

    tagged: Any
    delay: float
    idle: float
    out_schema: Any
    arrow_schema: Any
    key_type: Any
    value_type: Any
    config: dict[str, Any]
    query: str | None
    confs: dict[str, str]


@dataclass(frozen=True)
class BatchFrames:
    """What a run's steady batches share on a classic session (:meth:`KeyedBatchFunction._mapped`):
    what it was built for (the tagging plan, the placement, the timing directory), the state
    settings but for each batch's, the arrival-order projection and the processor's
    ``mapInArrow``. Holds JVM objects: never pickled."""

    built: tuple[Any, Any, str | None, Any]
    io: StateIO
    projection: Projection
    mapper: ArrowMap

    def serves(self, built: tuple[Any, Any, str | None, Any]) -> bool:
        """Whether these were built for ``built``: the same tagging plan and placement
        objects (by identity: a plan's columns do not compare), an equal timing directory
        and table version."""
        plan, strategy, root, version = self.built
        return (plan is built[0] and strategy is built[1] and root == built[2]
                and version == built[3])


class KeyedBatchFunction(StatefulBatchFunction):
    """The ``foreachBatch`` callable of :func:`keyed_foreach_batch`.

    Each call runs one micro-batch in five steps: prepare (arguments, types, arrival order),
    claim (the manifest: one writer, the version the batch starts from), place (its
    :class:`~trilink_spark.keyed.swaps.replanner.Replanner` decides the placement and any
    swap), tasks (one per partition, each on its own state), commit (the manifest records the
    batch; the rebalancer and the history see it).

    Attributes
    ----------
    swaps : list of SwapReport
        One report per batch that moved state (:meth:`request_swap`), and one per swap
        refused at a batch (``refused`` says why).
    replanner : Replanner
        The owner of the run's placement decision.
    """

    def __init__(self, func: Callable[[DataFrame, int], Any], store: KeyedStateStore,
                 options: dict[str, Any]) -> None:
        super().__init__(func, store, options)
        self.token = uuid.uuid4().hex
        self.swaps: list[SwapReport] = []
        self.replanner = Replanner(store, options)
        self._types: tuple[Any, Any] | None = None
        self._time_kind: str | None = None  # the event-time column's kind, once
        self.history = RunHistory()
        self._warned_files = False  # logged once that the key type keeps the file store
        self._ttl_units = math.inf  # state_ttl in the event-time column's units
        self._processing_ttl_ms = math.inf  # state_ttl of processing time, in milliseconds
        #: The driver's clock (seconds since the epoch), read once per batch that has no
        #: recorded processing time yet (:func:`~trilink_spark.keyed.durable.manifest.batch_time`);
        #: replaceable by any picklable callable, a fixed clock in tests.
        self._clock: Callable[[], float] = time.time
        #: (table, its version, its units) of the last bounded table counted for the
        #: rebalancer (:meth:`_counted`)
        self._unit_rows: tuple[Partitioner, int, UnitRows | None] | None = None
        #: Where each partition's task ran last (its local copy), asked for by the next
        #: batch's task (:meth:`_preferring`).
        self._where: dict[int, Where] = {}
        #: Tasks that ran where their copy was (``stayed``), that ran elsewhere
        #: (``moved``), and of those, away from an executor that was gone (``lost``).
        self.locality: dict[str, int] = new_counts()
        #: The tagging plan of the last batch's schema, built once per schema
        #: (:meth:`_tag_plan`), and the columns built once by name (:meth:`_tasks`).
        self._tagging: tuple[tuple[str, str, str | None, str | None], TagPlan] | None = None
        self._columns = ColumnCache()
        #: What steady batches share on a classic session (:meth:`_mapped`).
        self._frames: BatchFrames | None = None
        #: The newest batch's driver phases (:meth:`batch_profile`): its id and milliseconds.
        self._profile: dict[str, float] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "replanner" not in state:  # pickled by an earlier release: its placement fields
            self.replanner = Replanner.from_fields(self.store, self.options, state)
        if "history" not in state:  # pickled by an earlier release: its history fields
            self.history = RunHistory()
            self.history.keep = state.get("_history_keep")
            self.history.skipped = bool(state.get("_history_skipped"))
        self.__dict__.setdefault("_warned_files", False)
        self.__dict__.setdefault("_ttl_units", math.inf)
        self.__dict__.setdefault("_processing_ttl_ms", math.inf)
        self.__dict__.setdefault("_where", {})
        self.__dict__.setdefault("locality", new_counts())
        self.__dict__.setdefault("_clock", time.time)
        self.__dict__.setdefault("_unit_rows", None)
        self.__dict__.setdefault("_tagging", None)
        self.__dict__.setdefault("_columns", ColumnCache())
        self.__dict__.setdefault("_frames", None)
        self.__dict__.setdefault("_profile", None)

    # ------------------------------------------------------------------ swaps
    def request_swap(self, strategy: str | Partitioner | None = None, *,
                     num_partitions: int | None = None, refit: str = "minimal",
                     mode: str = "sync", max_keys_per_batch: int | None = None) -> None:
        """Change the placement (strategy or partition count) at the next micro-batch.

        Parameters
        ----------
        strategy : str or Partitioner, optional
            The new placement; default the current one, re-fitted.
        num_partitions : int, optional
            The new partition count (a rescale).
        refit : {"minimal", "none"}
            ``"minimal"`` (default): :func:`~trilink_spark.partitioners.rebalance_minimal` from the
            current (or given) placement, with the stored keys' row counts as loads, so only the
            keys needed for balance move. ``"none"``: the given strategy as it is (a table strategy
            without a table is fitted on the stored keys' counts).
        mode : {"sync", "fluid"}
            ``"sync"`` moves every key at the next batch. ``"fluid"`` moves at most
            ``max_keys_per_batch`` per batch, heaviest first, until done.
        max_keys_per_batch : int, optional
            Required for ``"fluid"``.

        Raises
        ------
        InvalidArgumentError
            Bad arguments, a fluid swap still under way, a stream placed by
            ``keyed_by_source``, or a swap that cannot be carried out from the placement in
            force (more partitions than a ``BlockPartitioner`` has blocks, a target that
            cannot be built).
        InvalidKeyTypeError
            The target cannot place the stream's keys (``modulo`` on string keys; any swap
            of a ``double`` key column, which only Spark's own hash places).

        Notes
        -----
        Checked at once against the placement in force and the key type recorded with it
        (before the first batch it is not known, nor, until this runner's first batch, for
        state an older release wrote; a swap that cannot be planned is then refused at the
        batch). Nothing moves until the
        next batch: then the driver plans the swap from the stored keys (O(keys)), one small
        Spark job writes the moved keys' state as segments, and each task of the batch
        starts from its own state minus outgoing keys plus incoming ones. Only moved keys'
        state is rewritten; the query never stops. A report is appended to :attr:`swaps`.
        A swap that still cannot be planned at the batch never fails it: the batch runs with
        the placement in force, the refusal is logged (a warning) and reported
        (``SwapReport.refused``).

        The request survives the driver: it is also written to the state path (a small
        checksummed JSON record, ``records/swap-request.json``; one JSON write), and a
        runner restarted on the state path carries it out at its first batch. The batch
        that plans (or refuses) it records it as done in the manifest at its commit, and a
        replayed batch reuses its plan, so it is carried out once. A newer request replaces
        it; :meth:`cancel_swap` drops it.

        Examples
        --------
        >>> run.request_swap(num_partitions=8)  # doctest: +SKIP
        >>> run.request_swap("least_count", mode="fluid", max_keys_per_batch=1000)  # doctest: +SKIP
        """
        request = SwapRequest.checked(strategy, num_partitions, refit, mode, max_keys_per_batch)
        self.replanner.ask(request, persist=True)

    def cancel_swap(self) -> SwapRequest | None:
        """Drop the swap requested for the next batch (one under way goes on), and its record
        on the state path; returns it (None when this runner holds none)."""
        return self.replanner.cancel()

    @property
    def pending_swap(self) -> SwapRequest | None:
        """The swap requested for the next batch, if any."""
        return self.replanner.pending

    @property
    def rebalances(self) -> list[tuple[int, Any]]:
        """``(batch_id, decision)`` of every batch the rebalancer judged, each batch once."""
        return self.replanner.rebalances

    # ------------------------------------------------------------------ the batch
    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        refuse_streaming_batch_function(batch_df, "KeyedBatchFunction", "keyed_foreach_batch")
        with typed_task_errors():  # a task's TrilinkError reaches the caller as itself
            self._run(batch_df, batch_id)

    def _run(self, batch_df: DataFrame, batch_id: int) -> None:
        """One micro-batch (:meth:`__call__`)."""
        started = time.perf_counter()
        batch = self._prepare(batch_df)
        manifest, prev, clock = self._claim(batch_df, batch_id, batch)
        local = self._local_config(batch_df, batch.key_type, manifest.get("path_id"), clock,
                                   batch.confs)

        def planning(current: Partitioner) -> LocalSync | None:
            return None if local is None else self._sync(batch, local.placed_by(current))

        chosen = self.replanner.place(batch_df, batch.tagged, batch_id, prev, manifest,
                                      planning)
        if local is not None and chosen.strategy is not None:
            local = local.placed_by(chosen.strategy)
        io, moved_bytes = self._state_io(batch_df, batch_id, prev, batch, chosen, local,
                                         started)
        listed, job = self._tasks(batch_df, batch_id, batch, chosen, io, clock)
        self._commit(batch_df, batch_id, prev, batch, manifest, chosen, clock, listed,
                     moved_bytes, started)
        self._profile = driver_phases(batch_id, started, *job, time.perf_counter())

    def _prepare(self, batch_df: DataFrame) -> PreparedBatch:
        """Step 1: the batch's arguments, state types and the run's configuration. A
        malformed conf fails here, before any work. O(columns) and a few Py4J calls."""
        spark = batch_df.sparkSession
        self.history.start(spark)  # read once per runner: a malformed conf fails here
        ensure_executors(spark, self.store.path, self.store.fs, needs=("rocksdict",))
        o = self.options
        confs = session_confs(spark)  # every conf the batch reads, in one go
        plan = self._tag_plan(batch_df, confs)
        tagged = plan.tag(batch_df)
        delay_units, idle_units = plan.delay_units, plan.idle_units
        out_schema, arrow_schema = plan.out_schema, plan.arrow_schema
        if self._types is None:  # a stream's schema is fixed: parse the state types once
            self._types = state_types(batch_df, o["key"], o["processor"])
            self._time_kind = column_time_kind(batch_df, o["event_time"])
            if o.get("state_ttl_time") == "processing":
                self._processing_ttl_ms = seconds(o["state_ttl"], "state_ttl") * 1000.0
            elif o.get("state_ttl") is not None:
                _, time_kind = event_time_micros(batch_df, o["event_time"])
                self._ttl_units = delay_in_units(o["state_ttl"], time_kind, "state_ttl")
                if not self._ttl_units > 0:
                    raise InvalidArgumentError(
                        f"state_ttl must be a positive duration, got {o['state_ttl']!r}")
        key_type, value_type = self._types
        return PreparedBatch(tagged, delay_units, idle_units, out_schema, arrow_schema,
                             key_type, value_type,
                             runner_config(o, delay_units, idle_units, value_type),
                             streaming_query_id(batch_df), confs)

    def _tag_plan(self, batch_df: DataFrame, confs: dict[str, str]) -> TagPlan:
        """The batch's :class:`~trilink_spark.keyed.run.prepare.TagPlan`: built at the first
        batch, and again only when the schema or the session time zone differs from the last
        batch's (a stream's are fixed), so a steady batch builds no column expression. Two
        Py4J calls for the schema; the time zone and ANSI mode come from ``confs``."""
        o = self.options
        spark = batch_df.sparkSession
        # ANSI mode can change a cast's nullability, and each plan reads its schema once
        built = (type(batch_df).__module__, batch_df.schema.json(),
                 confs.get("spark.sql.session.timeZone"),  # unset: the JVM's, fixed
                 confs.get("spark.sql.ansi.enabled"))
        cached = self._tagging
        if cached is not None and cached[0] == built:
            return cached[1]
        plan = tag_plan(batch_df, o["key"], o["event_time"], o["processor"], o["delay"],
                        o["order_by"], o["idle_timeout"])
        self._tagging = (built, plan)
        self._columns = ColumnCache()  # built again with the plan
        return plan

    def __getstate__(self) -> dict[str, Any]:
        # column expressions belong to this process's session: a copy builds its own
        state = dict(self.__dict__)
        state["_tagging"] = None
        state["_columns"] = ColumnCache()
        state["_frames"] = None
        return state

    def _claim(self, batch_df: DataFrame, batch_id: int, batch: PreparedBatch
               ) -> tuple[dict[str, Any], int | None, tuple[float, float] | None]:
        """Step 2: claim the state path for this writer; the manifest, the committed
        version the batch starts from, and (with a processing-time TTL) the batch's recorded
        processing time and the TTL's ``since``. One manifest read, one or two writes."""
        o = self.options
        manifest = claim(self.store, self.store.read_manifest(), self.token, batch.query,
                         batch.config, o["takeover"])
        gaps = choice(conf_get(batch.confs, "state.allowBatchGaps", "false").strip()
                      .lower(), "spark.trilink.state.allowBatchGaps", ("true", "false"))
        prev = start_version(self.store, manifest, batch_id, gaps == "true")
        clock: tuple[float, float] | None = None
        if math.isfinite(self._processing_ttl_ms):  # fixed before any task runs
            manifest, at, since = batch_time(self.store, manifest, batch_id,
                                             self._clock() * 1000.0, self.token, batch.query,
                                             batch.config, o["takeover"])
            clock = (at, since)
        return manifest, prev, clock

    def _sync(self, batch: PreparedBatch, local: LocalConfig) -> LocalSync:
        """What a task other than the batch's own needs to bring a local copy up to date."""
        return LocalSync(local, self.options["processor"], batch.delay, batch.idle,
                         batch.key_type)

    def _state_io(self, batch_df: DataFrame, batch_id: int, prev: int | None,
                  batch: PreparedBatch, chosen: Placed, local: LocalConfig | None,
                  started: float) -> tuple[StateIO, int]:
        """Step 3 (after the replanner placed the batch): a swap's moved state written as
        segments (one small Spark job), and the tasks' view of the state; with the bytes the
        swap moved."""
        plan = chosen.plan
        moved_bytes = 0
        if plan is not None:
            planned = time.perf_counter()
            for p in range(max(chosen.partitions, chosen.prev_partitions)):
                self.store.delete_changelog(p, batch_id, snapshot=True)  # another plan's try
            moved_bytes = write_segments(
                batch_df.sparkSession, self.store, batch_id, int(plan["prev"]), chosen.moves,
                self.token, None if local is None else self._sync(batch, local))
            logger.info("batch %d: swap planned in %.3f s, segments written in %.3f s",
                        batch_id, planned - started, time.perf_counter() - planned)
        return StateIO(self.store, batch_id, prev, chosen.prev_partitions, plan is not None,
                       batch.key_type, batch.value_type, self._counted(chosen.strategy),
                       carried=None if plan is None else plan.get("carried_counters"),
                       owner=self.token, local=local), moved_bytes

    def _counted(self, strategy: Partitioner | None) -> BlockPartitioner | UnitRows | None:
        """What the tasks count their rows by for the rebalancer: a block table's blocks; a
        bounded table's units (groups and named keys, :mod:`~trilink_spark.keyed.swaps.units`)
        when the run has a rebalancer, built once per table version (O(entries)); else
        nothing."""
        if isinstance(strategy, BlockPartitioner):
            return strategy
        if self.options.get("rebalancer") is None or not isinstance(strategy, TablePartitioner) \
                or not strategy.bounded:
            return None
        cached = self._unit_rows
        if cached is not None and cached[0] is strategy and cached[1] == strategy.table_version:
            return cached[2]
        column = self.replanner.column
        counted = unit_rows(strategy, (column.kind if column is not None else None)
                            or strategy.key_type)
        self._unit_rows = (strategy, strategy.table_version, counted)
        return counted

    def _tasks(self, batch_df: DataFrame, batch_id: int, batch: PreparedBatch,
               chosen: Placed, io: StateIO, clock: tuple[float, float] | None
               ) -> tuple[list[list[int]], tuple[float, float]]:
        """Step 4: one task per partition (``func`` runs the output), then the partitions no
        task ran for (their keys may still expire, or move in a swap). Returns each
        partition's versions, and the driver's clock when ``func`` was called and returned
        (:meth:`batch_profile`)."""
        o = self.options
        seen = self._preferring(batch_df, chosen, io, batch.confs)
        rows = chosen.rows if seen is None else seen.frame
        timer = operator_timer(batch_df.sparkSession, "keyed", batch.confs)
        values = {**io.batch_values(), "timer": None if timer is None else timer.run}
        untouched: list[int] = []
        own_task = io.local is not None and (clock is not None or io.swap)
        with batch_values(batch_df.sparkSession, self.token, values) as shared:
            out = self._mapped(rows, batch, chosen, io, timer, shared)
            called = time.perf_counter()
            self.func(out, batch_id)
            returned = time.perf_counter()
            listed = self._ensure_written(
                out, batch_id, chosen.partitions,
                fill=untouched.append if own_task else io.carry_forward,
                snapshots=io.local is None)
        if seen is not None:
            self._located(batch_df, batch_id, seen, chosen.partitions)
        if untouched:
            run_without_rows(batch_df.sparkSession, io, untouched, o["processor"], o["key"],
                             batch.delay, batch.idle, batch.arrow_schema)
            for p in untouched:  # their copies are where that job ran them
                self._where.pop(p, None)
        return listed, (called, returned)

    def _mapped(self, rows: DataFrame, batch: PreparedBatch, chosen: Placed, io: StateIO,
                timer: OperatorTimer | None, shared: bool) -> DataFrame:
        """The batch's output: ``rows`` in arrival order through the processor's tasks.

        ``shared`` (a classic session): the projection and the ``mapInArrow`` function are
        built once per schema, placement and run settings (:meth:`StateIO.same_run`) and
        serve every batch, whose own values reach the tasks as a local property
        (:mod:`~trilink_spark._internal.spark.frames`): a few Py4J commands a batch. Else
        (Spark Connect) the function carries the batch's values and is built per batch."""
        o = self.options
        built = (self._tagging, chosen.strategy, None if timer is None else timer.root,
                 getattr(io.blocks, "table_version", None))  # its pickled copy's version
        cached = self._frames
        if not shared:
            placed, aliases = python_input(arrival_order(rows, o["order_by"], self._columns),
                                           self._columns)
            fn = partition_function(o["processor"], o["key"], batch.delay, batch.idle,
                                    batch.arrow_schema, io, timer, aliases)
            return placed.mapInArrow(fn, batch.out_schema)
        if cached is None or not cached.serves(built) or not cached.io.same_run(io):
            kept = arrival_columns(rows.columns, o["order_by"])
            selected, aliases = python_input_columns(kept, self._columns)
            inside = {name: alias for alias, name in aliases.items()}
            fn = partition_function(o["processor"], o["key"], batch.delay, batch.idle,
                                    batch.arrow_schema, io.without_batch(), timer, aliases,
                                    batch_token=self.token)
            cached = self._frames = BatchFrames(
                built, io, Projection(selected),
                ArrowMap(fn, batch.out_schema,
                         [self._columns(inside.get(c, c)) for c in kept]))
        ordered = rows if o["order_by"] is None else \
            rows.sortWithinPartitions(self._columns(o["order_by"]), POS_COL)
        return cached.mapper(cached.projection(ordered))

    def _preferring(self, batch_df: DataFrame, chosen: Placed, io: StateIO,
                    confs: dict[str, str]) -> Preferred | None:
        """The batch's placed rows with each partition's task asking for the executor that
        ran it last (:mod:`~trilink_spark._internal.spark.locality`), where its local copy
        is; None for the file store, on Spark Connect, with ``spark.trilink.state.locality``
        off (by default in local mode), and where the helper jar cannot be loaded.
        About 10 Py4J calls."""
        if io.local is None or not locality_enabled(batch_df.sparkSession, confs):
            return None
        return prefer(chosen.rows, [self._where.get(p) for p in range(chosen.partitions)])

    def _located(self, batch_df: DataFrame, batch_id: int, seen: Preferred,
                 partitions: int) -> None:
        """Remember where each partition ran (its copy is there now); count and log the
        partitions that ran away from their copies, naming the executors that are gone."""
        ran = seen.ran()
        away = {p: (self._where[p], w) for p, w in ran.items()
                if p in self._where and self._where[p] != w}
        if away:
            self.locality["moved"] += len(away)
            alive = live_executors(batch_df.sparkSession)
            gone = sorted({old.executor for old, _ in away.values()
                           if alive is not None and old.executor not in alive})
            self.locality["lost"] += sum(1 for old, _ in away.values()
                                         if old.executor in gone)
            logger.info("batch %d: %d partition(s) ran away from their local copies (%s)%s; "
                        "they caught up or rebuilt from %s", batch_id, len(away),
                        ", ".join(f"{p}: executor {old.executor} -> {new.executor}"
                                  for p, (old, new) in sorted(away.items())),
                        f", executor(s) {', '.join(gone)} gone" if gone else "",
                        self.store.path)
        self.locality["stayed"] += sum(1 for p, w in ran.items() if self._where.get(p) == w)
        self._where = {p: w for p, w in {**self._where, **ran}.items() if p < partitions}

    def _commit(self, batch_df: DataFrame, batch_id: int, prev: int | None,
                batch: PreparedBatch, manifest: dict[str, Any], chosen: Placed,
                clock: tuple[float, float] | None, listed: list[list[int]],
                moved_bytes: int, started: float) -> None:
        """Step 5: record the batch in the manifest (with this start's arguments, the swap
        request it carried out, the end of a processing-time TTL), prune old versions, then
        show the rebalancer the batch and write its history record."""
        o = self.options
        done = chosen.request_id
        extra: dict[str, Any] = {}
        if self.replanner.started_with is not None:  # what the next restart compares
            extra["started_with"] = self.replanner.started_with
        if done is not None:  # a stored request is never carried out twice
            extra["swap_request_done"] = done
        if self._time_kind is not None:  # how read_state gives watermarks back
            extra[EVENT_TIME_KIND] = self._time_kind
        if clock is None and manifest.get(PROCESSING_RECORD) is not None:
            extra[PROCESSING_RECORD] = None  # a later processing-time TTL starts afresh
        commit_batch(self.store, batch_id, prev, self.token, batch.query, batch.config,
                     o["takeover"], chosen.new, extra)
        self.replanner.done(done)
        self.store.prune(chosen.partitions, batch_id, keep_from=prev, listed=listed)
        if chosen.strategy is not None:
            self.replanner.judge(batch_id, chosen.strategy, chosen.partitions)
        self.swaps.extend(chosen.refused)
        if chosen.plan is not None:
            self.swaps.append(swap_report(chosen.plan, batch_id, moved_bytes,
                                          time.perf_counter() - started))
        self.history.record(self.store, batch_df.sparkSession, batch_id, chosen.partitions,
                            chosen.strategy, started, done, self.swaps, self.rebalances)

    def _local_config(self, batch_df: DataFrame, key_type: Any, path_id: Any = None,
                      clock: tuple[float, float] | None = None,
                      confs: dict[str, str] | None = None) -> LocalConfig | None:
        """The executor-local store's settings for this batch, read once per batch (None:
        the file store, chosen with ``state_store="files"`` or needed for a key type the
        local store cannot encode); :meth:`LocalConfig.placed_by` gives them for a
        placement. ``clock``: the batch's processing time and the processing-time TTL's
        ``since``. The copies are named by the state path and its manifest's ``path_id``: a
        path wiped and begun again gets copies of its own (a manifest written before
        ``path_id`` existed keeps the name it had). A few conf reads."""
        o = self.options
        read = session_confs(batch_df.sparkSession) if confs is None else confs
        mode = choice(o.get("state_store") or conf_get(read, "state.store", "rocksdb"),
                      "state store (state_store= or spark.trilink.state.store)", STATE_STORES)
        encodable = supports_key_type(key_type)
        if (mode == "files" or not encodable) and (
                math.isfinite(self._ttl_units) or math.isfinite(self._processing_ttl_ms)):
            raise InvalidArgumentError(
                "state_ttl needs the local state store (state_store='rocksdb' and a key "
                f"column of an integer, float, boolean, string, binary, date or timestamp "
                f"type); this run uses the file store (key type {key_type})")
        if mode == "files":
            return None
        if not encodable:
            if not self._warned_files:
                logger.warning("state at %s: key type %s is kept in the file store (the "
                               "local store encodes %s)", self.store.path, key_type,
                               ", ".join(LOCAL_KEY_TYPES))
                self._warned_files = True
            return None
        root = conf_get(read, "state.localDir", "")  # "": the executor's own (the task's)
        interval = conf_count(read, "state.snapshotInterval", 10)
        column = self.replanner.column or KeyColumn.of(batch_df, o["key"])
        kind = column.kind
        blocks = BlockPartitioner(1, key_type=kind or "auto", null_policy="partition0") \
            if kind in ("int", "long", "string", "binary") else None
        named = f"{type(self.store.fs).__name__}:{self.store.path}"
        if isinstance(path_id, str) and path_id:
            named += f":{path_id}"
        store_id = hashlib.sha256(named.encode()).hexdigest()[:20]
        keep = choice(conf_get(read, "state.keepOpen", "true").strip().lower(),
                      "spark.trilink.state.keepOpen", ("true", "false"))
        at, since = clock or (None, None)
        drop_after = conf_count(read, "state.dropCopiesAfter", 10, low=0)  # 0: never
        return LocalConfig(root, store_id, interval, self._ttl_units, blocks,
                           self._processing_ttl_ms, at, since, keep_open=keep == "true",
                           drop_after=drop_after)

    # ------------------------------------------------------------------ inspection
    def task_timings(self, version: int | None = None) -> Any:
        """What each task of a committed batch measured of its own work.

        Parameters
        ----------
        version : int, optional
            A committed batch (the newest by default; the state keeps the newest two).

        Returns
        -------
        pandas.DataFrame
            One row per partition: ``partition``, ``rows`` (rows it processed),
            ``process_ms`` (its keyed work: load state, run the hooks, encode state),
            ``blocks`` (how many blocks it got rows of, -1 without a block placement), and
            with the local store ``sync`` (what the task did to its local copy first:
            ``current``, ``undo``, ``catch-up`` or ``rebuild``, counted here and logged) and
            ``keys_read`` (the keys whose state it read: the batch's and the due ones; the
            file store reads them all and reports -1, as does a partition without a record:
            carried forward, no task ran, with ``-1`` figures and ``sync`` ""), and
            ``snapshot`` (whether the task had the version it started from written as a
            snapshot, off its path). ``process_ms`` leaves out the local copy's upkeep
            (starting a snapshot, waiting for RocksDB's compaction): it is not load;
            ``upkeep_ms`` is that upkeep (-1 without the local store). ``executor`` and
            ``host``: where the task ran, when the stage asked for its copies' executors
            (``spark.trilink.state.locality``; "" otherwise).

        Raises
        ------
        InvalidArgumentTypeError
            ``version`` is not an int.
        InvalidArgumentError
            ``version`` is not a committed batch (the committed ones are named).

        Notes
        -----
        Reads each partition's timing file, beside its state version (O(partitions)); no
        Spark job, no listener.

        Examples
        --------
        >>> run.task_timings()  # doctest: +SKIP
           partition  rows  process_ms  blocks
        0          0  2000       412.5      31
        1          1  1990       130.2      33
        """
        return read_task_timings(self.store, version)

    def batch_profile(self) -> dict[str, Any]:
        """Where the newest batch this runner committed spent its time, on the driver and in
        its tasks (:func:`~trilink_spark.keyed.records.state_reader.batch_profile`: the fields).

        Raises
        ------
        InvalidArgumentError
            This runner has committed no batch in this process yet.

        Notes
        -----
        Reads each partition's timing record of the batch (O(partitions)); the driver's
        figures are kept for the newest batch only.

        Examples
        --------
        >>> run.batch_profile()["plan_ms"]  # doctest: +SKIP
        41.7
        """
        if self._profile is None:
            raise InvalidArgumentError(
                "no batch has run in this process yet: batch_profile describes the newest "
                "batch this runner committed")
        return batch_profile(self.store, self._profile)

    def counters(self) -> dict[str, int]:
        """Rows, late rows (key watermark) and late rows by the partition watermark, summed
        over the partitions' latest committed state: run-wide totals, since a swap that
        removes partitions carries their counters into partition 0."""
        return sum_counters(self.store)

    def owners(self, version: int | None = None) -> dict[Any, int]:
        """``{key: partition}`` of the newest (or a given) committed version."""
        return self.store.owners(version)

    def state_values(self, version: int | None = None) -> dict[Any, dict[str, Any]]:
        """Every key's stored values (``ctx.set_state``) in the newest (or a given) committed
        version: ``{key: {name: value}}``.

        Raises
        ------
        StateCorruptError
            A key is stored in two partitions, or a file is missing or corrupt.

        Notes
        -----
        Cost: reads the version's state files once more (O(state)); for inspection and tests.

        Examples
        --------
        >>> run.state_values()  # doctest: +SKIP
        {'u0001': {'n': 412}, 'u0002': {'n': 97}}
        """
        return read_state_values(self.store, version)


def keyed_foreach_batch(
    func: Callable[[DataFrame, int], Any],
    key: str,
    event_time: str,
    processor: KeyedWatermarkProcessFunction,
    delay: Any,
    state_path: str,
    *,
    order_by: str | None = None,
    strategy: str | Partitioner = "hash",
    num_partitions: int | None = None,
    idle_timeout: Any = None,
    filesystem: Any = None,
    keep_versions: int = 10,
    takeover: bool = False,
    rebalancer: Any = None,
    state_store: str | None = None,
    state_ttl: Any = None,
    state_ttl_time: str = "event",
    null_policy: str | None = None,
) -> KeyedBatchFunction:
    """A ``foreachBatch`` function running ``processor`` with state kept across micro-batches.

    Parameters
    ----------
    func : callable
        ``func(output_df, batch_id)``: ``output_df`` holds what the hooks emitted for the batch.
    key, event_time, processor, delay, order_by, idle_timeout
        As :func:`keyed_process`.
    state_path : str
        Directory (local path or URI such as ``s3://bucket/prefix``) of the state.
    strategy, num_partitions
        Placement, decided at the first batch and stored with the state (table strategies
        with their table). It changes only through a swap (:meth:`KeyedBatchFunction.request_swap`).
        The manifest records the arguments of each start: a restart whose ``strategy`` (a
        name or a Partitioner's configuration) or ``num_partitions`` differs from the
        recorded ones swaps to it at its first batch with no other swap to run; a restart
        with the same arguments keeps the placement in force, whatever run-time swaps made
        it. An :class:`~trilink_spark.AdaptivePartitioner` executes its switches as swaps
        (a restarted one's initial choice is not a switch). The key column's type is stored
        with the placement (tinyint, smallint and int hash as Spark ``int``, bigint as
        ``long``), and every placement of the state, swaps' and a rebalancer's included,
        hashes its keys as that type (a strategy's ``key_type="auto"`` takes it; one that
        cannot hold the column's values is refused with
        :class:`~trilink_spark.errors.InvalidKeyTypeError`). A restart whose key column has
        another type is refused.
    null_policy : {"group", "error", "partition0"}, optional
        As in :func:`~trilink_spark.key_by` (None: a strategy object's own, else
        ``spark.trilink.nullPolicy``, else ``"group"``), fixed at the first batch with the
        placement; a swap by name keeps it, a swap to a strategy object takes the object's.
    filesystem : pyarrow.fs.FileSystem, optional
        Default: inferred from ``state_path``.
    keep_versions : int
        State versions kept per partition (older ones are deleted; what a replay of the
        newest batch needs is always kept).
    takeover : bool
        Take over a state path another runner wrote (it must have stopped for good). Without
        it a second writer is refused with :class:`~trilink_spark.errors.StateOwnershipError`
        before any of its tasks writes, on a fresh path too (the first runner creates the
        manifest, its claim, before its first task runs); a restarted query (same query id)
        is the same writer. A runner whose path was taken over writes nothing more: each
        task checks the owner in the manifest before it writes.
    rebalancer : LoadAwareRebalancer, optional
        Moves key blocks from slow partitions to fast ones (needs ``strategy`` to be a
        :class:`~trilink_spark.BlockPartitioner`). After every batch it sees each task's own
        timing and rows per block (:meth:`KeyedBatchFunction.task_timings`); a decision
        with moves becomes a swap at the next batch, in which only the moved blocks' state
        travels. Every decision is logged and kept in ``run.rebalances``.
    state_store : {"rocksdb", "files"}, optional
        Where each partition's state lives between batches: an executor-local RocksDB copy
        that a batch reads and writes only the keys it touches of (``"rocksdb"``), or the
        whole state rewritten by every batch (``"files"``). Default:
        ``spark.trilink.state.store``, else ``"rocksdb"``.
    state_ttl : str, float or timedelta, optional
        Delete the state of a key that got no row for this long (after its due timers
        fired; a later row starts it afresh). By event time (``state_ttl_time="event"``):
        an interval string, seconds or a timedelta for a timestamp event time, a number in
        the column's unit for a numeric one. By processing time: a duration in seconds (an
        interval string, a number of seconds or a timedelta) whatever the column's type.
        Needs the local store (refused with ``state_store="files"``).
    state_ttl_time : {"event", "processing"}
        The clock of ``state_ttl``. ``"event"`` (default): the partition's newest event time
        moved on by ``state_ttl`` since the key's last row. ``"processing"``: no batch
        brought the key a row for ``state_ttl`` of processing time. Each batch's processing
        time is the driver's clock when the batch first runs, recorded in the manifest
        before its tasks run (one manifest write per batch), so a replayed batch expires
        the same keys; each key keeps the time of the last batch that brought it a row (the
        state's ``batch_time`` column). A key without one (state written before, or by
        batches without a processing-time TTL) counts from the first batch of the run's
        processing-time TTL. Expiry reads only the expired keys (an index of the local
        copy); a key expires at the first batch at or after its TTL ran out that runs its
        partition's task.

    Returns
    -------
    KeyedBatchFunction

    Notes
    -----
    Guarantees. Each task loads its partition's state as of the last committed batch (the
    manifest says which), processes the batch, and writes version ``batch_id`` (an Arrow table
    with one row per key, written to a temporary file, then renamed). The batch is committed
    in the manifest once every partition wrote it. Replaying a batch id (a retried task, a
    restarted query re-running its last batch) starts again from the same committed version,
    so it produces the same state and output: with an idempotent or transactional sink the
    pipeline is exactly once. A missing version is an error (never a silent restart from an
    older one), as are a second writer and a restart with another configuration (key, event
    time, delay, processor settings). If ``func`` does not compute the output, it is computed
    once more (to a no-op sink) so the state still advances. So is a manifest that is missing
    while state files exist (a partial restore), or older than the state (state versions it
    does not know, before the batch): never a silent restart, never a dropped batch. Every
    stored file carries a checksum: a damaged one is a
    :class:`~trilink_spark.errors.StateCorruptError` naming it, never another value read back.

    Swaps: :meth:`KeyedBatchFunction.request_swap` changes the strategy or partition count at
    the next batch boundary, moving only the keys whose partition changes, with their state,
    exactly once (module :mod:`trilink_spark.keyed.swaps.plan`).

    Ahead KeyBy: when the stream's key column is declared with
    :func:`~trilink_spark.placement.keyed_by_source` (a ``trilink-kafka`` read of a topic written
    with :func:`~trilink_spark.placement.ahead_key_by`), every micro-batch is processed where it
    was read, with no shuffle, and each Kafka partition keeps its own state; ``strategy`` is not
    used. A change in the topic's partition count is refused rather than stranding state.

    Examples
    --------
    >>> run = tl.keyed_foreach_batch(write, "sensor", "ts", tl.KeyedWindowAggregate(10.0),
    ...                              delay=2.0, state_path="/tmp/state")  # doctest: +SKIP
    >>> stream.writeStream.foreachBatch(run).start()  # doctest: +SKIP
    """
    if not callable(func):
        raise InvalidArgumentTypeError(f"func must be callable, got {type(func).__name__}")
    check_processor(processor)
    if rebalancer is not None:
        check_rebalancer(rebalancer, strategy)
    store = KeyedStateStore(state_path, filesystem=filesystem, keep_versions=keep_versions)
    options = {
        "key": key, "event_time": event_time, "processor": processor, "delay": delay,
        "order_by": order_by, "strategy": strategy, "num_partitions": num_partitions,
        "idle_timeout": idle_timeout, "takeover": bool(takeover), "rebalancer": rebalancer,
        "state_store": check_state_store(state_store), "state_ttl": check_ttl(state_ttl),
        "state_ttl_time": check_ttl_time(state_ttl_time, state_ttl),
        "null_policy": None if null_policy is None else check_null_policy(null_policy),
    }
    if state_store == "files" and state_ttl is not None:
        raise InvalidArgumentError("state_ttl needs the local state store; "
                                   "state_store='files' keeps every key")
    return KeyedBatchFunction(func, store, options)


#: The keyed state stores: ``rocksdb`` (executor-local, costs what a batch touches) and
#: ``files`` (every batch rewrites each partition's whole state).
STATE_STORES = ("rocksdb", "files")


def check_state_store(value: Any) -> str | None:
    """``state_store`` checked at call time (None: the conf decides at the first batch)."""
    return None if value is None else choice(value, "state_store", STATE_STORES)


def check_ttl(value: Any) -> Any:
    """``state_ttl`` checked at call time: an interval string, a positive number or
    timedelta (converted to the event time's units at the first batch), or None."""
    import datetime

    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, datetime.timedelta)):
        raise InvalidArgumentTypeError(
            "state_ttl must be an interval string ('7 days'), a number or a timedelta, got "
            f"{type(value).__name__}")
    length = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if not length > 0:
        raise InvalidArgumentError(f"state_ttl must be positive, got {value!r}")
    return value


#: The clocks of ``state_ttl``: the partition's event time, or the batches' processing time.
TTL_TIMES = ("event", "processing")


def check_ttl_time(value: Any, state_ttl: Any) -> str:
    """``state_ttl_time`` checked at call time, with the ``state_ttl`` it needs: by
    processing time, ``state_ttl`` is a duration in seconds (:func:`seconds`), parsed now."""
    clock = choice(value, "state_ttl_time", TTL_TIMES)
    if clock == "processing":
        if state_ttl is None:
            raise InvalidArgumentError(
                "state_ttl_time='processing' needs a state_ttl (how long a key may get no "
                "row before its state expires)")
        seconds(state_ttl, "state_ttl")
    return clock
