"""The one owner of a keyed run's placement: which placement each micro-batch runs with.

A :class:`Replanner` belongs to one :class:`~trilink_spark.keyed.KeyedBatchFunction`. It
holds everything the placement decision needs between batches (the pending swap request, the
adaptive strategy's last choice, the restart rule's state, the rebalancer's judgements) and
answers one question per batch, :meth:`Replanner.place`: the placement the batch's rows go by,
and the swap plan when the batch moves state. The runner never decides placement itself.

The rules it applies, in order (the primitives live in :mod:`.placement`, the plans in
:mod:`.plan` and :mod:`.block_plan`):

1. Ahead KeyBy: a stream placed by its source keeps each input partition's rows and state.
2. The first batch: the configured strategy, fitted and stored with the key type.
3. A replayed batch: the placement an earlier attempt decided (never decided again).
4. A fluid swap under way goes on; a request made meanwhile is refused.
5. Otherwise a pending request (``request_swap``, an adaptive switch, a rebalancer's
   decision) or, at a restarted runner's first batch, the swap its arguments ask for.
6. A swap that cannot be planned is refused: the batch runs with the placement in force.

Examples
--------
>>> import trilink_spark as tl
>>> from trilink_spark.state import KeyedStateStore
>>> import tempfile
>>> store = KeyedStateStore(tempfile.mkdtemp())
>>> planner = Replanner(store, {"strategy": "hash", "num_partitions": 4, "key": "k",
...                             "null_policy": None, "rebalancer": None})
>>> planner.pending is None
True
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from ..._internal.locking import PicklableLock
from ..._internal.spark.session import conf_get
from ...errors import InvalidArgumentError, StateCorruptError, StateStoreError
from ...partitioners import Partitioner
from ...placement.key_by import place_rows
from ...placement.source import is_keyed_by_source
from ...state.store import KeyedStateStore
from ..durable.local_sync import LocalSync
from .block_plan import block_aim, plan_block_swap, plans_by_blocks
from .placement import KeyColumn, Placed, adaptive_choice, adaptive_request, bound_placement
from .placement import check_restart_null_policy, first_placement, rebalance_target
from .placement import rebalancer_decision, refusal_report, replayed_placement
from .placement import restart_request, resume_request, source_placement, started_arguments
from .placement import over_bound, state_key_type, stored_placement, unfinished_plan
from .plan import SwapReport, SwapRequest, check_request, plan_swap

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Replanner", "SWAP_RECORD"]

logger = logging.getLogger(__name__)

#: Name of the state path's record of a swap requested and not yet planned
#: (:meth:`KeyedStateStore.save_record`).
SWAP_RECORD = "swap-request"

#: The fields of a runner pickled before the replanner existed that are the replanner's now.
_OLD_FIELDS = {"_request": "_request", "_rebalanced_through": "_rebalanced_through",
               "rebalances": "rebalances", "_derived_kind": "_derived_kind",
               "_column": "column", "_arguments": "_arguments",
               "_restart_checked": "_restart_checked", "_adaptive": "_adaptive",
               "_picked_up": "_picked_up", "_persisted": "_persisted"}


class Replanner(PicklableLock):
    """Decides each micro-batch's placement for one keyed run (module docs).

    Parameters
    ----------
    store : KeyedStateStore
        The run's state.
    options : dict
        The run's options (``strategy``, ``num_partitions``, ``null_policy``, ``key``,
        ``rebalancer``; the runner's own dict, read, never changed).

    Attributes
    ----------
    rebalances : list of (int, decision)
        Every batch the rebalancer judged, each batch once.
    column : KeyColumn or None
        The stream's key column, known from the first batch this runner ran.

    Notes
    -----
    Picklable (the lock is made again), so the run it belongs to can ship to a Spark Connect
    server. Thread-safe: ``request_swap`` may be called from any thread while a batch runs.
    Per batch the decision costs a few small reads of the state path (the placement record,
    the plan of a replayed batch); a swap costs its plan (:mod:`.plan`, :mod:`.block_plan`).
    """

    def __init__(self, store: KeyedStateStore, options: dict[str, Any]) -> None:
        self.store = store
        self.options = options
        self.rebalances: list[tuple[int, Any]] = []
        self.column: KeyColumn | None = None
        self._lock = type(self).lock_type()
        self._request: SwapRequest | None = None
        self._rebalanced_through: int | None = None  # the last batch the rebalancer saw
        #: The key type of a state whose placement record holds none (an older release's),
        #: derived once from its stored keys (:func:`.placement.state_key_type`).
        self._derived_kind: tuple[str | None] | None = None
        #: the placement arguments of this start, recorded in the manifest (restart rule)
        self._arguments = {**started_arguments(options["strategy"], options["num_partitions"]),
                           "null_policy": options.get("null_policy")}
        self._restart_checked = False  # compared with the previous start's arguments yet?
        self._adaptive: tuple[str, int] | None = None  # the adaptive strategy's last choice
        self._picked_up = False  # read the stored swap request of an earlier runner yet?
        self._persisted: str | None = None  # id of the request stored on the state path

    @classmethod
    def from_fields(cls, store: KeyedStateStore, options: dict[str, Any],
                    fields: dict[str, Any]) -> Replanner:
        """The replanner of a runner pickled before it had one: its placement fields."""
        planner = cls(store, options)
        for old, new in _OLD_FIELDS.items():
            if old in fields:
                setattr(planner, new, fields[old])
        return planner

    # ------------------------------------------------------------------ requests
    @property
    def pending(self) -> SwapRequest | None:
        """The swap requested for the next batch, if any."""
        return self._request

    @property
    def started_with(self) -> dict[str, Any] | None:
        """This start's placement arguments once the restart rule has compared them (what
        the next restart compares with), else None."""
        return self._arguments if self._restart_checked else None

    def ask(self, request: SwapRequest, persist: bool) -> None:
        """Check ``request`` against the committed state and make it the pending one;
        ``persist``: also store it on the state path (a ``request_swap`` call). O(1) reads
        of the manifest, the newest plan and the placement record."""
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

    def cancel(self) -> SwapRequest | None:
        """Drop the pending request and its record on the state path; returns it."""
        with self._lock:
            request, self._request = self._request, None
            self.store.delete_record(SWAP_RECORD)
            self._persisted = None
        return request

    def done(self, request_id: str | None) -> None:
        """After the commit that recorded request ``request_id`` as done: delete its record."""
        if request_id is None:
            return
        with self._lock:
            if self._persisted == request_id:
                self.store.delete_record(SWAP_RECORD)
                self._persisted = None

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
        if self.column is None:
            return None, None
        return self.column.kind, None if self.column.kind else self.column.spark_type

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

    def _drop(self, request_id: str | None, request: SwapRequest | None = None) -> None:
        """Clear the pending request when it is ``request`` (or has the id ``request_id``)."""
        with self._lock:
            pending = self._request
            if pending is not None and (pending is request or (
                    request_id is not None and pending.request_id == request_id)):
                self._request = None

    # ------------------------------------------------------------------ the batch
    def place(self, batch_df: DataFrame, tagged: DataFrame, batch_id: int, prev: int | None,
              manifest: dict[str, Any],
              planning: Callable[[Partitioner], LocalSync | None] | None = None) -> Placed:
        """The placement of ``batch_id`` and its rows placed by it (:attr:`Placed.rows`).

        Parameters
        ----------
        batch_df : DataFrame
            The micro-batch as it arrived (its schema and, under Ahead KeyBy, its layout).
        tagged : DataFrame
            The batch's rows as the runner prepared them, to be placed.
        batch_id, prev : int
            The batch, and the committed version it starts from (None: no state yet).
        manifest : dict
            The manifest the runner claimed for this batch.
        planning : callable, optional
            ``planning(placement)``: the local copies a swap between block tables plans from
            (:mod:`.block_plan`); None, or returning None: by keys.

        Returns
        -------
        Placed
            ``strategy`` is None for a stream placed by its source. A new placement (the
            first batch's, or a swap's) is stored before any task runs, with the state's key
            type, and so is a swap's plan.

        Notes
        -----
        No Spark job but a swap's planning (and, on Spark Connect, the count of an Ahead
        KeyBy input's partitions); the rows are placed lazily (one exchange, or none).
        """
        o = self.options
        if self.column is None:
            self.column = KeyColumn.of(batch_df, o["key"])
        if not self._picked_up:
            self._pick_up(manifest)
        if is_keyed_by_source(batch_df, o["key"]):
            rows, partitions = source_placement(self.store, batch_df, o["key"], tagged, prev)
            self._restart_checked = True
            if prev is None:
                self.store.save_placement(batch_id, None, partitions)
            return Placed(None, partitions, None, None, prev is None, rows=rows)
        chosen = self._decide(batch_df, batch_id, prev, manifest, self.column, planning)
        strategy = cast(Partitioner, chosen.strategy)  # rules 2-6 always place by a strategy
        return replace(chosen, rows=place_rows(tagged, o["key"], strategy, fit="none",
                                               reuse=False))

    def _decide(self, batch_df: DataFrame, batch_id: int, prev: int | None,
                manifest: dict[str, Any], column: KeyColumn,
                planning: Callable[[Partitioner], LocalSync | None] | None) -> Placed:
        """:meth:`place` for a stream placed by a strategy (module docs, rules 2-6)."""
        o = self.options
        if prev is None:
            replayed = replayed_placement(self.store, batch_id, column.kind)
            if replayed is not None:
                return self._replayed(replayed)
            first = first_placement(self.store, batch_df, column, batch_id, o["strategy"],
                                    o["num_partitions"], o.get("null_policy"))
            self._restart_checked = True  # the state starts with this start's arguments
            self._adaptive = adaptive_choice(o["strategy"])
            return Placed(first, 0, None, None, True)
        start = self.store.placement_start(prev, manifest)
        cached = self.__dict__.get("_bound")
        if cached is not None and cached[0] == (start, manifest.get("path_id")):
            _, current, prev_partitions, recorded, kind = cached
            unfinished = unfinished_plan(self.store, prev)
        else:
            current, prev_partitions, recorded, unfinished = stored_placement(self.store, prev)
            kind = self._state_kind(prev, prev_partitions, recorded, column)
        replayed = replayed_placement(self.store, batch_id, kind)
        if replayed is not None:  # decided by an earlier attempt of this batch: never re-decide
            return self._replayed(replayed)
        if cached is None or cached[1] is not current:
            current = bound_placement(current, kind, recorded is not None)
            # bound once per placement version: the same object every batch, so the plan and
            # the table's broadcast frame built for it are reused (placement.plans)
            self._bound = ((start, manifest.get("path_id")), current, prev_partitions,
                           recorded, kind)
        if not self._restart_checked:  # a restart keeps the state's null policy, or is refused
            check_restart_null_policy(self.store, manifest, batch_df, o, current)
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
            request = self._pending(batch_df, batch_id, manifest, current)
            if request is None and over_bound(current) \
                    and not self.__dict__.get("_bounding_tried"):
                # a per-key table past its bound (written before tables were bounded):
                # made bounded once, by a minimal refit of the placement in force
                self._bounding_tried = True
                logger.info("state at %s: placement %s holds %d keys, past its bound of "
                            "%d; bounding it in batch %d", self.store.path,
                            type(current).__name__, len(current), current.max_keys, batch_id)
                request = SwapRequest(None, None, "minimal", "sync", None)
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
        """The state's key type (:func:`.placement.state_key_type`), checked against the key
        column; derived from the stored keys once per runner when the placement record holds
        none (an older release wrote it)."""
        if recorded is None and self._derived_kind is not None:
            return self._derived_kind[0]
        kind = state_key_type(self.store, prev, partitions, recorded, column)
        if recorded is None:
            self._derived_kind = (kind,)
        return kind

    def _pending(self, batch_df: DataFrame, batch_id: int, manifest: dict[str, Any],
                 current: Partitioner) -> SwapRequest | None:
        """The swap to run now: a request (an adaptive strategy's switch included), else, at
        the first batch of a restarted runner with no other swap to run, the one its
        arguments ask for (:func:`.placement.restart_request`)."""
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

    # ------------------------------------------------------------------ after the commit
    def judge(self, batch_id: int, current: Partitioner, partitions: int) -> None:
        """Show the rebalancer (if the run has one) this committed batch's figures; a
        decision with moves becomes a swap at the next batch (only the moved blocks' state
        travels).

        Each batch is shown once: a replayed batch (the same ``batch_id`` again) is not
        measured twice. A measurement never fails the batch, which is committed already:
        missing or malformed figures, and any error of the rebalancer, are logged and
        nothing is decided."""
        if self.options.get("rebalancer") is None:
            return
        if self._rebalanced_through is not None and batch_id <= self._rebalanced_through:
            logger.info("batch %d: replayed; the rebalancer saw it already", batch_id)
            return
        self._rebalanced_through = batch_id
        try:
            self._judge_batch(batch_id, current, partitions)
        except Exception as err:  # noqa: BLE001 - a measurement never fails the query
            logger.warning("batch %d: rebalancer skipped (%s: %s)", batch_id,
                           type(err).__name__, err)

    def _judge_batch(self, batch_id: int, current: Partitioner, partitions: int) -> None:
        """One judgement of the rebalancer (:meth:`judge`), kept in :attr:`rebalances`; a
        decision with moves becomes a swap request unless one is pending or under way."""
        rebalancer = self.options["rebalancer"]
        decision = rebalancer_decision(rebalancer, self.store, batch_id, current, partitions)
        if decision is None:
            return
        self.rebalances.append((batch_id, decision))
        logger.info("batch %d: rebalancer: %s", batch_id, decision.reason)
        target = rebalance_target(rebalancer, self.store, batch_id, current, decision,
                                  self._request is not None)
        if target is not None:  # this runner's measurement: not stored for a restart
            self.ask(SwapRequest.checked(target, None, "none", "sync", None), persist=False)

