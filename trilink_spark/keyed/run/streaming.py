"""Run a keyed process function on each micro-batch of a Structured Streaming query.

:func:`keyed_foreach_batch` returns a :class:`KeyedBatchFunction`, the ``foreachBatch``
callable: it places each micro-batch as :func:`~trilink_spark.keyed_process` does and keeps
each partition's state (watermarks, timers, window accumulators, user state) between
micro-batches in a :class:`~trilink_spark.state.KeyedStateStore`, versioned by batch id.

What committed state says (:func:`read_task_timings`, :func:`sum_counters`,
:func:`read_state_values`) is read by :mod:`~trilink_spark.keyed.records.state_reader`. What this
module calls: :mod:`~trilink_spark.keyed.durable.manifest` (the manifest protocol: one writer, the
version a batch starts from, the commit), :mod:`~trilink_spark.keyed.run.prepare` (arguments,
arrival order), :mod:`~trilink_spark.keyed.swaps.replanner` (the batch's placement and the swaps
decided for it) and :mod:`~trilink_spark.keyed.run.task` (each partition's task and its state
I/O).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..._internal.optiming import operator_timer
from ..._internal.spark.session import conf_count, conf_get
from ..._internal.spark.compat import streaming_query_id
from ..._internal.spark.executors import ensure_executors
from ..._internal.validation import choice, seconds
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from ...errors import StateStoreError
from ...columns import python_input
from ...partitioners import BlockPartitioner, Partitioner
from ...partitioners.keys import check_null_policy
from ...placement.key_by import place_rows
from ...placement.source import is_keyed_by_source
from ...eventtime import delay_in_units, event_time_micros
from ...state.local import LOCAL_KEY_TYPES, supports_key_type
from ...state.batch import StatefulBatchFunction
from ...state.store import KeyedStateStore
from ..records.history import record_run_batch, run_history_keep
from ..durable.local_sync import LocalConfig, LocalSync
from ..durable.manifest import PROCESSING_RECORD, batch_time, claim, commit_batch, runner_config
from ..durable.manifest import start_version
from .prepare import arrival_order, check_processor, prepare
from ..semantics.process import KeyedWatermarkProcessFunction
from ..swaps.replanner import KeyColumn, Placed, adaptive_choice, adaptive_request, bound_placement
from ..swaps.replanner import (check_rebalancer, first_placement, rebalance_target,
                               rebalancer_decision)
from ..swaps.replanner import refusal_report, replayed_placement, restart_request, resume_request
from ..swaps.replanner import check_restart_null_policy, source_placement, started_arguments
from ..swaps.replanner import state_key_type, stored_placement, swap_report
from ..records.state_reader import read_state_values, read_task_timings, sum_counters
from ..swaps.plan import SwapReport, SwapRequest, check_request, plan_swap, write_segments
from ..swaps.block_plan import block_aim, plan_block_swap, plans_by_blocks
from .task import StateIO, partition_function, run_without_rows, state_types
from ..._internal.validation import refuse_streaming_batch_function

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KeyedBatchFunction", "keyed_foreach_batch"]

logger = logging.getLogger(__name__)

#: Name of the state path's record of a swap requested and not yet planned
#: (:meth:`KeyedStateStore.save_record`).
SWAP_RECORD = "swap-request"


class KeyedBatchFunction(StatefulBatchFunction):
    """The ``foreachBatch`` callable of :func:`keyed_foreach_batch`.

    Attributes
    ----------
    swaps : list of SwapReport
        One report per batch that moved state (:meth:`request_swap`), and one per swap
        refused at a batch (``refused`` says why).
    """

    def __init__(self, func: Callable[[DataFrame, int], Any], store: KeyedStateStore,
                 options: dict[str, Any]) -> None:
        super().__init__(func, store, options)
        self.token = uuid.uuid4().hex
        self.swaps: list[SwapReport] = []
        #: ``(batch_id, decision)`` of every batch the rebalancer judged, each batch once.
        self.rebalances: list[tuple[int, Any]] = []
        self._rebalanced_through: int | None = None  # the last batch the rebalancer saw
        self._request: SwapRequest | None = None
        self._lock = threading.Lock()
        self._types: tuple[Any, Any] | None = None
        self._column: KeyColumn | None = None
        #: The key type of a state whose placement record holds none (an older release's),
        #: derived once from its stored keys (:func:`~trilink_spark.keyed.swaps.replanner.state_key_type`).
        self._derived_kind: tuple[str | None] | None = None
        self._warned_files = False  # logged once that the key type keeps the file store
        self._ttl_units = math.inf  # state_ttl in the event-time column's units
        self._processing_ttl_ms = math.inf  # state_ttl of processing time, in milliseconds
        #: The driver's clock (seconds since the epoch), read once per batch that has no
        #: recorded processing time yet (:func:`~trilink_spark.keyed.durable.manifest.batch_time`);
        #: replaceable by any picklable callable, a fixed clock in tests.
        self._clock: Callable[[], float] = time.time
        self._init_placement_state()

    def _init_placement_state(self) -> None:
        #: the placement arguments of this start, recorded in the manifest (restart rule)
        self._arguments = {**started_arguments(self.options["strategy"],
                                               self.options["num_partitions"]),
                           "null_policy": self.options.get("null_policy")}
        self._restart_checked = False  # compared with the previous start's arguments yet?
        self._adaptive: tuple[str, int] | None = None  # the adaptive strategy's last choice
        self._picked_up = False  # read the stored swap request of an earlier runner yet?
        self._persisted: str | None = None  # id of the request stored on the state path

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        if "_restart_checked" not in state:  # pickled by an earlier release
            self._init_placement_state()
        self.__dict__.setdefault("_column", None)
        self.__dict__.setdefault("_derived_kind", None)
        self.__dict__.setdefault("_warned_files", False)
        self.__dict__.setdefault("_ttl_units", math.inf)
        self.__dict__.setdefault("_processing_ttl_ms", math.inf)
        self.__dict__.setdefault("_clock", time.time)

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
        self._ask(request, persist=True)

    def _ask(self, request: SwapRequest, persist: bool) -> None:
        """Check ``request`` against the committed state and make it the pending one;
        ``persist``: also store it on the state path (a ``request_swap`` call)."""
        manifest = self.store.read_manifest()
        committed = [] if manifest is None else manifest.get("committed", [])
        if committed:
            last = int(committed[-1])
            plan = self.store.load_plan(last)
            if plan is not None and not plan["complete"]:
                raise InvalidArgumentError(
                    "a fluid swap is under way; request another once run.swaps[-1].complete "
                    "is True (or call run.cancel_swap() to drop a pending request)")
            current, _, recorded = self.store.placement_record_at(last, manifest)
            if current is None:
                raise InvalidArgumentError(
                    f"state at {self.store.path} is placed by keyed_by_source (each input "
                    "partition keeps its own state): it cannot swap")
            kind, column_type = self._key_type(recorded)
            check_request(bound_placement(current, kind, recorded is not None), request, kind,
                          column_type)
        if persist:
            request = replace(request, request_id=uuid.uuid4().hex)
        with self._lock:
            if persist:
                self.store.save_record(SWAP_RECORD, request.to_record())
                self._persisted = request.request_id
            self._request = request

    def _key_type(self, recorded: str | None) -> tuple[str | None, str | None]:
        """The key type a request is checked with, and the key column's Spark type when no
        strategy hashes it in Python (a ``double`` column, say; else None).

        The state's key type is the one its placement record holds (``recorded``), the one
        every plan places keys by; a record an older release wrote holds none, and then the
        key type is the one this runner found for the state, else its key column's. Before
        this runner's first batch on such a state it is not known: ``(None, None)``, and the
        request is checked when it is planned. O(1).
        """
        if recorded is not None:
            return recorded, None
        if self._derived_kind is not None and self._derived_kind[0] is not None:
            return self._derived_kind[0], None
        if self._column is None:
            return None, None
        return self._column.kind, None if self._column.kind else self._column.spark_type

    def cancel_swap(self) -> SwapRequest | None:
        """Drop the swap requested for the next batch (one under way goes on), and its record
        on the state path; returns it (None when this runner holds none)."""
        with self._lock:
            request, self._request = self._request, None
            self.store.delete_record(SWAP_RECORD)
            self._persisted = None
        return request

    def _pick_up(self, manifest: dict[str, Any] | None) -> None:
        """Once per runner: take over the request an earlier runner stored and no batch
        planned (a request the manifest records as done is deleted, never carried out)."""
        body = self.store.load_record(SWAP_RECORD)
        request = None if body is None else SwapRequest.from_record(
            body, self.store.record_path(SWAP_RECORD))
        self._picked_up = True
        if request is None:
            return
        with self._lock:
            if request.request_id == (manifest or {}).get("swap_request_done"):
                if self._persisted in (None, request.request_id):
                    self.store.delete_record(SWAP_RECORD)
                    self._persisted = None
            elif self._request is None:
                logger.info("state at %s: a swap requested before the restart and never "
                            "planned is carried out now", self.store.path)
                self._request, self._persisted = request, request.request_id

    def _forget(self, done: str | None) -> None:
        """After the commit that recorded request ``done`` as done: delete its record."""
        if done is None:
            return
        with self._lock:
            if self._persisted == done:
                self.store.delete_record(SWAP_RECORD)
                self._persisted = None

    @property
    def pending_swap(self) -> SwapRequest | None:
        """The swap requested for the next batch, if any."""
        return self._request

    # ------------------------------------------------------------------ the batch
    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        refuse_streaming_batch_function(batch_df, "KeyedBatchFunction", "keyed_foreach_batch")
        started = time.perf_counter()
        run_history_keep(self, batch_df.sparkSession)  # a malformed conf fails before any work
        ensure_executors(batch_df.sparkSession, self.store.path, self.store.fs,
                         needs=("rocksdict",))
        o = self.options
        tagged, delay_units, idle_units, out_schema, arrow_schema = prepare(
            batch_df, o["key"], o["event_time"], o["processor"], o["delay"], o["order_by"],
            o["idle_timeout"],
        )
        if self._types is None:  # a stream's schema is fixed: parse the state types once
            self._types = state_types(batch_df, o["key"], o["processor"])
            self._column = KeyColumn.of(batch_df, o["key"])
            if o.get("state_ttl_time") == "processing":
                self._processing_ttl_ms = seconds(o["state_ttl"], "state_ttl") * 1000.0
            elif o.get("state_ttl") is not None:
                _, time_kind = event_time_micros(batch_df, o["event_time"])
                self._ttl_units = delay_in_units(o["state_ttl"], time_kind, "state_ttl")
                if not self._ttl_units > 0:
                    raise InvalidArgumentError(
                        f"state_ttl must be a positive duration, got {o['state_ttl']!r}")
        key_type, value_type = self._types
        config = runner_config(o, delay_units, idle_units, value_type)
        query = streaming_query_id(batch_df)
        manifest = claim(self.store, self.store.read_manifest(), self.token, query, config,
                         o["takeover"])
        if not self._picked_up:
            self._pick_up(manifest)
        prev = start_version(self.store, manifest, batch_id)
        clock: tuple[float, float] | None = None
        if math.isfinite(self._processing_ttl_ms):  # fixed before any task runs
            manifest, at, since = batch_time(self.store, manifest, batch_id,
                                             self._clock() * 1000.0, self.token, query,
                                             config, o["takeover"])
            clock = (at, since)
        source = is_keyed_by_source(batch_df, o["key"])
        swap_plan: dict[str, Any] | None = None
        moved_bytes = 0
        done: str | None = None
        refused: tuple[SwapReport, ...] = ()
        if source:
            placed, partitions = source_placement(self.store, batch_df, o["key"], tagged, prev)
            prev_partitions = partitions
            new_placement = prev is None
            self._restart_checked = True
            if new_placement:
                self.store.save_placement(batch_id, None, partitions)
        else:
            def planning(strategy: Partitioner) -> LocalSync | None:
                found = self._local_config(batch_df, key_type, strategy,
                                           manifest.get("path_id"), clock)
                return None if found is None else LocalSync(
                    found, o["processor"], delay_units, idle_units, key_type)

            chosen = self._placement(batch_df, batch_id, prev, manifest, planning)
            done, refused = chosen.request_id, chosen.refused
            prev_partitions, swap_plan, new_placement = (chosen.prev_partitions, chosen.plan,
                                                         chosen.new)
            placed = place_rows(tagged, o["key"], chosen.strategy, fit="none")
            partitions = chosen.strategy.num_partitions
        blocks = None if source else chosen.strategy
        local = self._local_config(batch_df, key_type, blocks, manifest.get("path_id"), clock)
        if swap_plan is not None:
            local_sync = None if local is None else LocalSync(
                local, o["processor"], delay_units, idle_units, key_type)
            planned = time.perf_counter()
            for p in range(max(partitions, prev_partitions)):  # an attempt under another plan
                self.store.delete_changelog(p, batch_id, snapshot=True)
            moved_bytes = write_segments(batch_df.sparkSession, self.store, batch_id,
                                         int(swap_plan["prev"]), chosen.moves, self.token,
                                         local_sync)
            logger.info("batch %d: swap planned in %.3f s, segments written in %.3f s",
                        batch_id, planned - started, time.perf_counter() - planned)
        io = StateIO(self.store, batch_id, prev, prev_partitions, swap_plan is not None,
                     key_type, value_type,
                     blocks if isinstance(blocks, BlockPartitioner) else None,
                     carried=None if swap_plan is None else swap_plan.get("carried_counters"),
                     owner=self.token, local=local)
        placed, aliases = python_input(arrival_order(placed, o["order_by"]))
        fn = partition_function(o["processor"], o["key"], delay_units, idle_units, arrow_schema,
                                io, operator_timer(batch_df.sparkSession, "keyed"), aliases)
        out = placed.mapInArrow(fn, out_schema)
        self.func(out, batch_id)
        # partitions no task ran for: their keys may still expire, or move in a swap
        untouched: list[int] = []
        own_task = io.local is not None and (clock is not None or io.swap)
        listed = self._ensure_written(out, batch_id, partitions,
                                      fill=untouched.append if own_task else io.carry_forward,
                                      snapshots=io.local is None)
        if untouched:
            run_without_rows(batch_df.sparkSession, io, untouched, o["processor"], o["key"],
                             delay_units, idle_units, arrow_schema)
        extra: dict[str, Any] = {}
        if self._restart_checked:  # this start's arguments: what the next restart compares
            extra["started_with"] = self._arguments
        if done is not None:  # a stored request is never carried out twice
            extra["swap_request_done"] = done
        if clock is None and manifest.get(PROCESSING_RECORD) is not None:
            extra[PROCESSING_RECORD] = None  # a later processing-time TTL starts afresh
        commit_batch(self.store, batch_id, prev, self.token, query, config, o["takeover"],
                     new_placement, extra)
        self._forget(done)
        self.store.prune(partitions, batch_id, keep_from=prev, listed=listed)
        if o.get("rebalancer") is not None and not source:
            self._rebalance(batch_id, chosen.strategy, partitions)
        self.swaps.extend(refused)
        if swap_plan is not None:
            self.swaps.append(swap_report(swap_plan, batch_id, moved_bytes,
                                          time.perf_counter() - started))
        record_run_batch(self, batch_df.sparkSession, batch_id, partitions,
                         None if source else chosen.strategy, started, done)

    def _local_config(self, batch_df: DataFrame, key_type: Any, placement: Partitioner | None,
                      path_id: Any = None, clock: tuple[float, float] | None = None
                      ) -> LocalConfig | None:
        """The executor-local store's settings for this batch (None: the file store, chosen
        with ``state_store="files"`` or needed for a key type the local store cannot encode).
        ``clock``: the batch's processing time and the processing-time TTL's ``since``.
        The copies are named by the state path and its manifest's ``path_id``: a path wiped
        and begun again gets copies of its own (a manifest written before ``path_id`` existed
        keeps the name it had)."""
        o = self.options
        spark = batch_df.sparkSession
        mode = o.get("state_store") or conf_get(spark, "state.store", "rocksdb")
        if mode not in STATE_STORES:
            raise InvalidArgumentError(
                f"state store must be one of {STATE_STORES}, got {mode!r} (state_store= or "
                "spark.trilink.state.store)")
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
        root = conf_get(spark, "state.localDir", "")  # "": the executor's own (the task's)
        interval = conf_count(spark, "state.snapshotInterval", 10)
        if isinstance(placement, BlockPartitioner):
            blocks: BlockPartitioner | None = placement
        else:
            kind = self._column.kind if self._column is not None else None
            blocks = BlockPartitioner(1, key_type=kind or "auto", null_policy="partition0") \
                if kind in ("int", "long", "string", "binary") else None
        named = f"{type(self.store.fs).__name__}:{self.store.path}"
        if isinstance(path_id, str) and path_id:
            named += f":{path_id}"
        store_id = hashlib.sha256(named.encode()).hexdigest()[:20]
        keep = choice(conf_get(spark, "state.keepOpen", "true").strip().lower(),
                      "spark.trilink.state.keepOpen", ("true", "false"))
        at, since = clock or (None, None)
        return LocalConfig(root, store_id, interval, self._ttl_units, blocks,
                           self._processing_ttl_ms, at, since, keep_open=keep == "true")

    def _placement(self, batch_df: DataFrame, batch_id: int, prev: int | None,
                   manifest: dict[str, Any] | None,
                   planning: Callable[[Partitioner], LocalSync | None] | None = None
                   ) -> Placed:
        """The placement of ``batch_id``, and the swap plan when it moves state. A new
        placement (the first batch's, or a swap's) is stored before any task runs, with the
        state's key type; a swap that cannot be planned is refused (:meth:`_plan`).
        ``planning(placement)``: the local copies a swap between block tables plans from
        (:mod:`~trilink_spark.keyed.swaps.block_plan`); None, or returning None: by keys."""
        o = self.options
        column = self._column if self._column is not None else KeyColumn.of(batch_df, o["key"])
        if prev is None:
            replayed = replayed_placement(self.store, batch_id, column.kind)
            if replayed is not None:
                return self._replayed(replayed)
            first = first_placement(self.store, batch_df, column, batch_id, o["strategy"],
                                    o["num_partitions"], o.get("null_policy"))
            self._restart_checked = True  # the state starts with this start's arguments
            self._adaptive = adaptive_choice(o["strategy"])
            return Placed(first, 0, None, None, True)
        current, prev_partitions, recorded, unfinished = stored_placement(self.store, prev)
        kind = self._state_kind(prev, prev_partitions, recorded, column)
        replayed = replayed_placement(self.store, batch_id, kind)
        if replayed is not None:  # decided by an earlier attempt of this batch: never re-decide
            return self._replayed(replayed)
        current = bound_placement(current, kind, recorded is not None)
        if not self._restart_checked:  # a restart keeps the state's null policy, or is refused
            check_restart_null_policy(self.store, manifest or {}, batch_df, o, current)
        refused: tuple[SwapReport, ...] = ()
        done = None
        request: SwapRequest | None
        target: Partitioner | None = None
        if unfinished is not None:
            with self._lock:  # made while the batch that started the fluid swap ran
                waiting, self._request = self._request, None
            if waiting is not None:
                done = waiting.request_id
                refused = (refusal_report(
                    batch_id, waiting, current, "a fluid swap is under way; request another "
                    "once run.swaps[-1].complete is True", 0.0),)
            request, target = resume_request(unfinished, kind)
        else:
            request = self._pending(batch_df, batch_id, manifest or {}, current)
        if request is None:
            return Placed(current, prev_partitions, None, None, False, refused, done)
        return self._plan(batch_df, batch_id, prev, current, prev_partitions, request,
                          target, kind, refused, done, planning)

    def _replayed(self, replayed: Placed) -> Placed:
        """An earlier attempt's placement of this batch; the request it planned is done."""
        if replayed.request_id is not None:
            self._drop(replayed.request_id)
        return replayed

    def _plan(self, batch_df: DataFrame, batch_id: int, prev: int, current: Partitioner,
              prev_partitions: int, request: SwapRequest, target: Partitioner | None,
              kind: str | None, refused: tuple[SwapReport, ...], done: str | None,
              planning: Callable[[Partitioner], LocalSync | None] | None) -> Placed:
        """Plan ``request`` for ``batch_id`` on the state's key type ``kind`` and store the
        plan before any task runs. A request that cannot be planned (the planner refuses its
        target, its key type, or the stored keys) is refused: logged, reported, and the batch
        runs with the placement ``current``. Reading the state (a corrupt or missing file)
        still fails the batch."""
        started = time.perf_counter()
        try:
            aim = block_aim(current, request, target, kind)
            local = None
            if aim is not None and planning is not None and plans_by_blocks(
                    conf_get(batch_df.sparkSession, "state.blockPlans", "auto"), aim,
                    lambda: sum(self.store.version_bytes(p, prev)
                                for p in range(prev_partitions))):
                local = planning(current)
            if aim is not None and local is not None:
                plan, moves, placement = plan_block_swap(
                    batch_df.sparkSession, self.store, batch_id, prev,
                    current, request, aim, local)  # type: ignore[arg-type]
            else:
                plan, moves, placement = plan_swap(self.store, batch_id, prev, current,
                                                   request, target, kind)
        except (StateCorruptError, StateStoreError, MemoryError):
            raise  # the state cannot be read: the batch fails, the request waits for its retry
        except Exception as err:  # noqa: BLE001 - a plan that cannot be made is refused
            self._drop(request.request_id, request)  # once: it never blocks later batches
            report = refusal_report(batch_id, request, current, f"{type(err).__name__}: {err}",
                                    time.perf_counter() - started)
            return Placed(current, prev_partitions, None, None, False, (*refused, report),
                          request.request_id or done)
        self.store.save_placement(batch_id, placement, placement.num_partitions, kind)
        self.store.save_plan(batch_id, plan, moves)  # from now on a replay reuses it
        self._drop(request.request_id, request)
        logger.info("batch %d: swap %s, %d of %d keys move, %d -> %d partitions", batch_id,
                    plan["mode"], plan["moved_keys"], plan["keys_total"],
                    plan["partitions_before"], plan["partitions_after"])
        return Placed(placement, prev_partitions, plan, moves, True, refused,
                      request.request_id or done)

    def _state_kind(self, prev: int, partitions: int, recorded: str | None,
                    column: KeyColumn) -> str | None:
        """The state's key type (:func:`~trilink_spark.keyed.swaps.replanner.state_key_type`), checked
        against the key column; derived from the stored keys once per runner when the
        placement record holds none (an older release wrote it)."""
        if recorded is None and self._derived_kind is not None:
            return self._derived_kind[0]
        kind = state_key_type(self.store, prev, partitions, recorded, column)
        if recorded is None:
            self._derived_kind = (kind,)
        return kind

    def _drop(self, request_id: str | None, request: SwapRequest | None = None) -> None:
        """Clear the pending request when it is ``request`` (or has the id ``request_id``)."""
        with self._lock:
            pending = self._request
            if pending is not None and (pending is request or (
                    request_id is not None and pending.request_id == request_id)):
                self._request = None

    def _pending(self, batch_df: DataFrame, batch_id: int, manifest: dict[str, Any],
                 current: Partitioner) -> SwapRequest | None:
        """The swap to run now: a request (an adaptive strategy's switch included), else, at
        the first batch of a restarted runner with no other swap to run, the one its
        arguments ask for (:func:`~trilink_spark.keyed.swaps.replanner.restart_request`)."""
        self._adapt(batch_df, batch_id, current)
        with self._lock:
            request = self._request
        if request is None and not self._restart_checked:
            request = restart_request(self.store, manifest, self.options["strategy"],
                                      self.options["num_partitions"], current)
            self._restart_checked = True
        return request

    def _adapt(self, batch_df: DataFrame, batch_id: int, current: Partitioner) -> None:
        """An adaptive strategy decides before each new batch; a switch (a change of its
        choice since the previous batch) becomes a request."""
        if self._request is not None:
            return
        request, self._adaptive = adaptive_request(
            self.options["strategy"], batch_df, self.options["key"], batch_id, current,
            self._adaptive)
        if request is not None:
            with self._lock:
                if self._request is None:
                    self._request = request

    def _rebalance(self, batch_id: int, current: Partitioner, partitions: int) -> None:
        """Show the rebalancer this batch's figures; a decision with moves becomes a swap
        at the next batch (only the moved blocks' state travels).

        Each batch is shown once: a replayed batch (the same ``batch_id`` again) is not
        measured twice. A measurement never fails the batch, which is committed already:
        missing or malformed figures, and any error of the rebalancer, are logged and
        nothing is decided."""
        if self._rebalanced_through is not None and batch_id <= self._rebalanced_through:
            logger.info("batch %d: replayed; the rebalancer saw it already", batch_id)
            return
        self._rebalanced_through = batch_id
        try:
            self._rebalance_batch(batch_id, current, partitions)
        except Exception as err:  # noqa: BLE001 - a measurement never fails the query
            logger.warning("batch %d: rebalancer skipped (%s: %s)", batch_id,
                           type(err).__name__, err)

    def _rebalance_batch(self, batch_id: int, current: Partitioner, partitions: int) -> None:
        """One judgement of the rebalancer (:meth:`_rebalance`), kept in :attr:`rebalances`;
        a decision with moves becomes a swap request unless one is pending or under way."""
        rebalancer = self.options["rebalancer"]
        decision = rebalancer_decision(rebalancer, self.store, batch_id, current, partitions)
        if decision is None:
            return
        self.rebalances.append((batch_id, decision))
        logger.info("batch %d: rebalancer: %s", batch_id, decision.reason)
        target = rebalance_target(rebalancer, self.store, batch_id, current, decision,
                                  self._request is not None)
        if target is not None:  # this runner's measurement: not stored for a restart
            self._ask(SwapRequest.checked(target, None, "none", "sync", None), persist=False)

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
            ``upkeep_ms`` is that upkeep (-1 without the local store).

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
