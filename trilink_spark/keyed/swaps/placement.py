"""Which placement a keyed micro-batch runs with, and the decisions that become swaps.

A micro-batch of :func:`~trilink_spark.keyed_foreach_batch` runs with the placement stored
with its state: the first batch's (:func:`first_placement`), the input's own under Ahead KeyBy
(:func:`source_placement`), or the one a swap (:mod:`trilink_spark.keyed.swaps.plan`) moves the
state to. A swap comes from :meth:`~trilink_spark.keyed.KeyedBatchFunction.request_swap`, from an
adaptive strategy's switch (:func:`adaptive_request`), from a restart with other arguments than
the job was last started with (:func:`restart_request`, :func:`started_arguments`), from a
rebalancer's decision (:func:`rebalancer_decision`, :func:`rebalance_target`), or goes on with
a fluid swap under way (:func:`resume_request`). A swap that cannot be planned is refused
(:func:`refusal_report`): the batch runs with the placement in force.

The placement in force (strategy, partition count, block table) is committed state: only a
swap changes it, and a restart changes it only when its arguments differ from the recorded
arguments of the previous start, never because they differ from the placement a run-time swap
made.

The adaptive strategy and the rebalancer are used by what they do (``unwrap`` and
``before_batch``; ``observe``, ``decide`` and ``apply``): keyed processing never imports the
control plane that defines :class:`~trilink_spark.AdaptivePartitioner` and
:class:`~trilink_spark.switching.LoadAwareRebalancer`.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from ..._internal.spark.compat import num_partitions
from ..._internal.validation import MAX_PARTITIONS
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from ...errors import TrilinkError
from ...partitioners import BlockPartitioner, HashPartitioner, Partitioner, TablePartitioner
from ...partitioners import WeightPartitioner
from ...partitioners.core.base import KEY_KINDS
from ...partitioners.tables.overlay import OverlayPartitioner
from ...placement.key_by import key_kind, null_policy_of, resolve_strategy
from ...state.store import KEY_FIELD, KeyedStateStore
from ...placement.source import in_place
from .plan import SwapReport, SwapRequest
from .units import from_units, unit_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Placed", "KeyColumn", "check_rebalancer", "first_placement", "source_placement",
           "replayed_placement", "stored_placement", "resume_request", "adaptive_choice",
           "adaptive_request", "started_arguments", "restart_request", "rebalancer_decision",
           "rebalance_target", "swap_report", "refusal_report", "stored_key_type",
           "state_key_type", "bound_placement", "check_restart_null_policy", "unfinished_plan", "over_bound"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placed:
    """The placement of one micro-batch (:meth:`~.replanner.Replanner.place`).

    Attributes
    ----------
    strategy : Partitioner or None
        The placement the batch's rows go by (None: placed by the source, Ahead KeyBy).
    prev_partitions : int
        Partitions at the version the batch starts from.
    plan : dict or None
        The swap plan, when the batch moves state.
    moves : pyarrow.Table or None
        Its moves (key, from, to).
    new : bool
        Whether the placement starts at this batch.
    refused : tuple of SwapReport
        The swaps asked for this batch and refused (the batch runs with the placement in
        force, or goes on with a fluid swap under way).
    request_id : str or None
        The ``request_swap`` call this batch planned or refused (recorded as done at the
        commit, so a stored request is never carried out twice).
    rows : DataFrame or None
        The batch's rows placed by it, with their partition id (set by the replanner).
    """

    strategy: Partitioner | None
    prev_partitions: int
    plan: dict[str, Any] | None
    moves: Any
    new: bool
    refused: tuple[SwapReport, ...] = ()
    request_id: str | None = None
    rows: Any = None

    @property
    def partitions(self) -> int:
        """The partitions the batch runs with (the source's count when it places)."""
        return self.prev_partitions if self.strategy is None else self.strategy.num_partitions


@dataclass(frozen=True)
class KeyColumn:
    """The key column of a keyed stream's micro-batches.

    Attributes
    ----------
    name : str
    kind : {"int", "long", "string", "binary"} or None
        How Spark hashes it (:func:`~trilink_spark.placement.key_by.key_kind`: tinyint,
        smallint and int as ``"int"``); None for a type no strategy hashes in Python.
    spark_type : str
        Its Spark type (``df.schema[name].dataType.simpleString()``), for messages.
    """

    name: str
    kind: str | None
    spark_type: str

    @staticmethod
    def of(df: DataFrame, key: str) -> KeyColumn:
        """The key column ``key`` of ``df`` (O(columns); one schema lookup)."""
        kind, dtype = key_kind(df, key)
        return KeyColumn(key, kind, dtype.simpleString())


def stored_key_type(arrow_type: Any) -> str | None:
    """The key kind a stored key column of Arrow type ``arrow_type`` was placed as: signed
    8-32-bit integers (Spark tinyint, smallint, int) ``"int"``, int64 ``"long"``, string
    ``"string"``, binary ``"binary"``; None for any other type. O(1).

    Examples
    --------
    >>> import pyarrow as pa
    >>> stored_key_type(pa.int16()), stored_key_type(pa.int64()), stored_key_type(pa.float64())
    ('int', 'long', None)
    """
    import pyarrow as pa

    if pa.types.is_signed_integer(arrow_type):
        return "int" if arrow_type.bit_width <= 32 else "long"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "binary"
    return None


def _derived_key_type(store: KeyedStateStore, prev: int, partitions: int) -> str | None:
    """The key kind of the keys stored at version ``prev``: that of the first partition
    whose key column is typed (a partition without keys may store it as Arrow null), or
    None when none is. Reads state files until one is typed: O(state) at worst."""
    import pyarrow as pa

    for p in range(partitions):
        table = store.load_table(p, prev)
        if KEY_FIELD in table.column_names:
            arrow_type = table.schema.field(KEY_FIELD).type
            if not pa.types.is_null(arrow_type):
                return stored_key_type(arrow_type)
    return None


def state_key_type(store: KeyedStateStore, prev: int, partitions: int,
                   recorded: str | None, column: KeyColumn) -> str | None:
    """The one key type the state of version ``prev`` is placed by, checked against this
    micro-batch's key column.

    Parameters
    ----------
    store : KeyedStateStore
    prev : int
        The committed version the batch starts from.
    partitions : int
        Its partition count.
    recorded : str or None
        The key type its placement record holds (None: written by a release before key
        types were recorded).
    column : KeyColumn

    Returns
    -------
    str or None
        ``recorded``; else the kind of the stored key column's Arrow type at ``prev`` (what
        the rows were placed as: the state's keys carry the key column's type); else, with
        no typed key stored, the column's kind.

    Raises
    ------
    InvalidArgumentError
        The key column's kind is not the state's (a restart with the key column retyped,
        say int to bigint): Spark would hash its values otherwise than the stored keys.

    Notes
    -----
    O(1) with a recorded type; else reads state files of ``prev`` until one holds a typed
    key column (O(state) at worst), once per runner (the runner keeps the answer).
    """
    kind = recorded if recorded is not None else _derived_key_type(store, prev, partitions)
    if kind is None:
        return column.kind
    if column.kind != kind:
        raise InvalidArgumentError(
            f"state at {store.path} holds keys placed as Spark {KEY_KINDS[kind]}, but key "
            f"column {column.name!r} is {column.spark_type} now: Spark hashes the two "
            "differently, so rows and their state would be placed apart; cast the key "
            f"column back to the type it had, or start from a new state_path")
    return kind


def bound_placement(strategy: Partitioner, kind: str | None, recorded: bool) -> Partitioner:
    """``strategy`` with its key type fixed to the one the JVM places a ``kind`` key column
    by (:meth:`~trilink_spark.Partitioner.for_column`), so that the driver's Python placement
    of stored keys equals the JVM's placement of rows.

    ``recorded``: whether the placement record holds a key type. A record an older release
    wrote (``False``) is read as that release placed rows: a HashPartitioner or hash-mode
    WeightPartitioner hashed the key column's own type in the JVM, whatever its
    ``key_type`` (it cast nothing), so it is bound to ``kind``. O(1), or O(table) for a table
    strategy (a copy).
    """
    if recorded or kind is None:
        return strategy.for_column(kind)
    if isinstance(strategy, OverlayPartitioner):
        return OverlayPartitioner(bound_placement(strategy.base, kind, False),
                                  strategy.overrides, strategy.num_partitions,
                                  null_policy=strategy.null_policy)
    if isinstance(strategy, HashPartitioner) or (isinstance(strategy, WeightPartitioner)
                                                 and strategy.mode == "hash"):
        return Partitioner.from_dict({**strategy.to_dict(), "key_type": kind})
    return strategy.for_column(kind)


def check_rebalancer(rebalancer: Any, strategy: Any) -> None:
    """Refuse a rebalancer without ``observe``, ``decide`` and ``apply``, or one given with a
    placement other than a :class:`~trilink_spark.BlockPartitioner` or a table strategy
    (:class:`~trilink_spark.TablePartitioner`, by object or by name), which the rebalancer
    moves once it is bounded (:mod:`~trilink_spark.keyed.swaps.units`).

    Raises
    ------
    InvalidArgumentTypeError
        A method is missing (they are named).
    InvalidArgumentError
        ``strategy`` is neither.
    """
    missing = [m for m in ("observe", "decide", "apply")
               if not callable(getattr(rebalancer, m, None))]
    if missing:
        raise InvalidArgumentTypeError(
            f"rebalancer must have observe, decide and apply (a switching.LoadAwareRebalancer); "
            f"{type(rebalancer).__name__} lacks {', '.join(missing)}")
    if isinstance(strategy, BlockPartitioner) or (
            isinstance(strategy, TablePartitioner) and strategy.is_stateful):
        return  # a hash-mode WeightPartitioner holds no table: nothing to move
    if isinstance(strategy, str) and strategy.strip().lower() != "auto":
        from ...partitioners.core.base import resolve_strategy_name

        # by name, as built: block, least_key, least_count (weight by name is hash-mode)
        if resolve_strategy_name(strategy) in ("block", "least_key", "least_count"):
            return  # (an unknown name is refused by resolve_strategy_name)
    raise InvalidArgumentError(
        "a rebalancer moves key blocks, or a bounded table's key groups and named keys: pass "
        "strategy=tl.BlockPartitioner(n) or a table strategy (tl.LeastCountPartitioner(n), "
        "'least_count', 'least_key', tl.WeightPartitioner(weights, mode='random')), got "
        f"{strategy if isinstance(strategy, str) else type(strategy).__name__!r}")


def first_placement(store: KeyedStateStore, batch_df: DataFrame, column: KeyColumn,
                    batch_id: int, configured: str | Partitioner,
                    partitions: int | None, null_policy: str | None = None) -> Partitioner:
    """The first batch's placement, stored before any task runs with the key column's kind
    (the key type every later placement hashes keys as), and bound to it
    (:func:`bound_placement`); decided once (an earlier attempt's is reused). An adaptive
    strategy decides on this batch first. ``null_policy``: as in
    :func:`~trilink_spark.key_by` (None: a strategy object's own, else the conf).

    Raises
    ------
    StateCorruptError
        The state path holds an older release's ``strategy.json`` without a manifest.
    InvalidKeyTypeError
        The strategy's key type cannot hold the key column's values.
    """
    key = column.name
    stored, _, recorded = store.placement_record(batch_id, missing_ok=True)
    if stored is not None:
        return bound_placement(stored, column.kind, recorded is not None)
    if store.load_strategy() is not None:
        raise StateCorruptError(
            f"state at {store.path} has a strategy.json but no manifest: it was "
            "written by an older trilink-spark; start from a new state_path")
    if isinstance(configured, Partitioner) and configured.unwrap() is not configured:
        configured.before_batch(batch_df, key, batch_id)  # adaptive: decide
        configured = configured.unwrap().copy()
    strategy = resolve_strategy(batch_df, key, configured, partitions,
                                null_policy=null_policy).partitioner
    strategy = strategy.for_column(column.kind)
    store.save_placement(batch_id, strategy, strategy.num_partitions, column.kind)
    return strategy


def source_placement(store: KeyedStateStore, batch_df: DataFrame, key: str,
                     tagged: DataFrame, prev: int | None) -> tuple[DataFrame, int]:
    """Ahead KeyBy: each input (Kafka) partition keeps its rows and its own state.

    Returns ``tagged`` placed where it was read, and the input's partition count (on Spark
    Connect one Spark job counts them).

    Raises
    ------
    InvalidArgumentError
        The state was placed by ``key_by``, or the input's partition count changed.
    """
    placed = in_place(batch_df, key, tagged)
    partitions = num_partitions(batch_df)  # Spark Connect: one Spark job
    if prev is None:
        return placed, partitions
    stored, stored_partitions = store.placement_at(prev)
    if stored is not None:
        raise InvalidArgumentError(
            f"state at {store.path} was placed by key_by; a keyed_by_source stream "
            "needs its own state_path"
        )
    if partitions != stored_partitions:
        raise InvalidArgumentError(
            f"state at {store.path} has {stored_partitions} partitions, but this "
            f"micro-batch has {partitions} input partitions; the topic's partition count "
            "changed, which would strand that state"
        )
    return placed, partitions


def replayed_placement(store: KeyedStateStore, batch_id: int,
                       kind: str | None) -> Placed | None:
    """The placement an earlier attempt of ``batch_id`` decided with a swap plan (a replay
    never decides again), bound to the state's key type ``kind``, or None."""
    plan = store.load_plan(batch_id)
    if plan is None:
        return None
    _, before = store.placement_at(int(plan["prev"]))
    _, _, recorded = store.placement_record(batch_id, missing_ok=True)
    placement = bound_placement(Partitioner.from_dict(plan["placement"]), kind,
                                recorded is not None)
    return Placed(placement, before, plan, store.load_moves(batch_id), True,
                  request_id=plan.get("request"))


def stored_placement(store: KeyedStateStore, prev: int
                     ) -> tuple[Partitioner, int, str | None, dict[str, Any] | None]:
    """The placement at version ``prev`` as stored, its partition count, the key type its
    record holds (None: an older release's record; :func:`state_key_type`), and the plan of
    a fluid swap still under way at ``prev`` (None when there is none).

    Raises
    ------
    InvalidArgumentError
        The state was placed by ``keyed_by_source``.
    """
    current, prev_partitions, recorded = store.placement_record_at(prev)
    if current is None:
        raise InvalidArgumentError(
            f"state at {store.path} was placed by keyed_by_source; a key_by stream "
            "needs its own state_path")
    return current, prev_partitions, recorded, unfinished_plan(store, prev)


def over_bound(strategy: Partitioner) -> TypeGuard[TablePartitioner]:
    """Whether ``strategy`` is a per-key table holding more keys than its ``max_keys`` (a
    placement stored before tables were bounded), which a keyed stream bounds at its next
    batch by a minimal refit. O(1).

    Examples
    --------
    >>> import trilink_spark as tl
    >>> over_bound(tl.LeastKeyPartitioner(2).fit(["a", "b"]))
    False
    """
    return (isinstance(strategy, TablePartitioner) and strategy.is_stateful
            and not strategy.bounded and len(strategy) > strategy.max_keys)


def unfinished_plan(store: KeyedStateStore, prev: int) -> dict[str, Any] | None:
    """The plan of a fluid swap still under way at version ``prev`` (None: none). One small
    read of the state path."""
    last = store.load_plan(prev)
    return last if last is not None and not last["complete"] else None


def resume_request(unfinished: dict[str, Any], kind: str | None
                   ) -> tuple[SwapRequest, Partitioner]:
    """The next step of the fluid swap ``unfinished`` plans, and the target it goes on to
    (bound to the state's key type ``kind``)."""
    resume = SwapRequest(None, None, "none", "fluid", unfinished.get("max_keys_per_batch"))
    return resume, Partitioner.from_dict(unfinished["target"]).for_column(kind)


def adaptive_choice(configured: Any) -> tuple[str, int] | None:
    """What an adaptive strategy wraps now, as (kind, partitions); None when ``configured``
    is not adaptive (a Partitioner whose ``unwrap()`` is another one)."""
    if not isinstance(configured, Partitioner) or configured.unwrap() is configured:
        return None
    wanted = configured.unwrap()
    return type(wanted).__name__, wanted.num_partitions


def adaptive_request(configured: Any, batch_df: DataFrame, key: str, batch_id: int,
                     current: Partitioner, previous: tuple[str, int] | None
                     ) -> tuple[SwapRequest | None, tuple[str, int] | None]:
    """An adaptive strategy decides before each new batch; a switch becomes a request.

    ``configured`` sees the batch (``before_batch``). A switch is a change of what it wraps
    since ``previous`` (its choice at the runner's previous batch; None at a runner's first
    batch: then its choice as it starts), so a restarted query's new adaptive strategy, which
    starts from its initial choice, never undoes the switches the state went through. Returns
    a request (a sync swap to a copy of what it wraps now) when it switched to another type
    or partition count than ``current``, else None; and its choice now (None: not adaptive).
    """
    before = previous if previous is not None else adaptive_choice(configured)
    if before is None:
        return None, None
    configured.before_batch(batch_df, key, batch_id)
    now = adaptive_choice(configured)
    if now == before or now is None:
        return None, now
    wanted = configured.unwrap()
    if type(wanted) is type(current) and wanted.num_partitions == current.num_partitions:
        return None, now
    logger.info("batch %d: the adaptive strategy switched to %s; swapping state",
                batch_id, type(wanted).__name__)
    return SwapRequest(wanted.copy(), None, "none", "sync", None), now


def started_arguments(strategy: Any, partitions: int | None) -> dict[str, Any]:
    """The placement arguments of a start (``strategy``, ``num_partitions``) as the manifest
    records them: JSON, equal for equal arguments in any process.

    A strategy name is kept as given (lower case); a Partitioner as its kind and a digest of
    its unfitted configuration (:meth:`~trilink_spark.Partitioner.fresh`, so what a first
    batch fits into it does not count); an adaptive strategy as ``"adaptive"`` (its switches
    are swaps of their own). O(the strategy's configuration).
    """
    if isinstance(strategy, str):
        described = strategy.strip().lower()
    elif isinstance(strategy, Partitioner) and strategy.unwrap() is not strategy:
        described = "adaptive"
    elif isinstance(strategy, Partitioner):
        try:
            config = strategy.fresh().to_json()
        except (TrilinkError, TypeError, ValueError):
            config = repr(strategy)
        described = (f"{strategy.strategy_name}:"
                     f"{hashlib.sha256(config.encode()).hexdigest()[:16]}")
    else:
        described = type(strategy).__name__
    return {"strategy": described, "num_partitions": partitions}


def restart_request(store: KeyedStateStore, manifest: dict[str, Any], strategy: Any,
                    partitions: int | None, current: Partitioner) -> SwapRequest | None:
    """The swap a restart asks for, or None.

    The rule: the manifest records the arguments the job was last started with
    (:func:`started_arguments`); a restart swaps only where its own differ from those, never
    because they differ from the placement in force (which a run-time swap may have changed).

    - ``strategy`` differs (a name or a Partitioner; never ``"auto"`` nor an adaptive
      strategy): a sync swap to it as given (``refit="none"``; a table strategy is fitted on
      the stored keys' counts), on ``num_partitions`` for a name.
    - else ``num_partitions`` is given and differs, and differs from the placement in force:
      a sync swap to it (``refit="minimal"``), as :meth:`request_swap` would.

    State written by a release that kept no record: the first placement's partition count
    stands for the arguments, and a strategy never swaps.

    Raises
    ------
    InvalidArgumentError
        The restart's arguments are not a swap request ``request_swap`` accepts.
    """
    recorded = manifest.get("started_with")
    if not isinstance(recorded, dict):
        starts = sorted(manifest.get("placements") or [])
        _, first = store.load_placement(starts[0], missing_ok=True) if starts else (None, 0)
        recorded = {"strategy": None, "num_partitions": first or None}
    given = started_arguments(strategy, partitions)
    changed = (recorded.get("strategy") is not None
               and given["strategy"] not in ("auto", "adaptive", recorded.get("strategy")))
    if changed:
        logger.info("state at %s: restarted with strategy %s (last started with %s): swapping",
                    store.path, given["strategy"], recorded.get("strategy"))
        if isinstance(strategy, str):
            return SwapRequest.checked(strategy, partitions, "none", "sync", None)
        return SwapRequest.checked(strategy.copy(), None, "none", "sync", None)
    if partitions is None or partitions == recorded.get("num_partitions") \
            or partitions == current.num_partitions:
        return None
    logger.info("state at %s has %d partitions; restarted with num_partitions=%d (last "
                "started with %s): swapping", store.path, current.num_partitions, partitions,
                recorded.get("num_partitions"))
    return SwapRequest.checked(None, partitions, "minimal", "sync", None)


def check_restart_null_policy(store: KeyedStateStore, manifest: dict[str, Any],
                              batch_df: DataFrame, options: dict[str, Any],
                              current: Partitioner) -> None:
    """At a restart's first batch: refuse a ``null_policy`` argument that differs from the
    null policy the state places its null key with, rather than ignore it (the state keeps
    one null policy, fixed with its placement; a swap changes it, moving the null key with
    its state). The arguments the job was last started with are accepted as they are, as
    for the strategy (:func:`restart_request`): a run-time swap may have changed the policy
    since. Without the argument the state's policy stands; a conf that says otherwise is
    logged. O(1) (one conf read).

    Raises
    ------
    InvalidArgumentError
        ``null_policy`` differs from the state's null policy and from the last start's.
    """
    given = options.get("null_policy")
    held = current.null_policy
    if given is None:
        if isinstance(options.get("strategy"), str):
            conf = null_policy_of(batch_df, None, None)
            if conf != held:
                logger.warning("state at %s places the null key with null_policy=%r, fixed "
                               "with its placement; spark.trilink.nullPolicy=%r is not used",
                               store.path, held, conf)
        return
    recorded = manifest.get("started_with")
    if given == held or (isinstance(recorded, dict) and recorded.get("null_policy") == given):
        return
    raise InvalidArgumentError(
        f"state at {store.path} places the null key with null_policy={held!r}, fixed with "
        f"its placement; this start passes null_policy={given!r}, which a restart does not "
        f"change. Restart with null_policy={held!r} (or without it), or change it at run "
        f"time with run.request_swap(<the strategy>.with_null_policy({given!r})), which "
        "moves the null key with its state")


def rebalancer_decision(rebalancer: Any, store: KeyedStateStore, batch_id: int,
                        current: Partitioner, partitions: int) -> Any:
    """Show ``rebalancer`` what each task of ``batch_id`` measured (its time, and its rows
    per block summed into block sizes) and return its decision.

    A bounded table is shown as its units (:func:`~trilink_spark.keyed.swaps.units.unit_table`:
    its key groups and named keys as the blocks of one block table; O(groups + entries)).

    None (logged; nothing decided) without a block placement or a bounded table, when a
    partition left no timing, or when a timing counts rows of a block the placement does not
    have.
    """
    if isinstance(current, TablePartitioner):
        units = unit_table(current)
        if units is None:
            logger.warning("batch %d: the rebalancer moves a table strategy's key groups once "
                           "it is bounded (more keys than max_keys=%d); nothing decided",
                           batch_id, current.max_keys)
            return None
        current = units
    if not isinstance(current, BlockPartitioner):
        logger.warning("batch %d: the rebalancer needs a BlockPartitioner placement or a "
                       "bounded table, the state is placed by %s; nothing decided", batch_id,
                       type(current).__name__)
        return None
    timings = [store.timing(p, batch_id) for p in range(partitions)]
    if any(t is None for t in timings):
        logger.warning("batch %d: no timing from partition(s) %s; nothing decided",
                       batch_id, [p for p, t in enumerate(timings) if t is None])
        return None
    latency = [float(t["process_ms"]) for t in timings if t is not None]
    sizes = np.zeros(current.num_blocks, dtype=np.float64)
    for p, t in enumerate(timings):
        per_block = None if t is None else t.get("block_rows")
        if per_block is None:
            continue
        blocks = np.asarray(per_block["blocks"], dtype=np.int64)
        if blocks.size and int(blocks.max()) >= current.num_blocks:
            logger.warning("batch %d: partition %d's timing counts rows of block %d, but "
                           "the placement has %d blocks (not this batch's record); "
                           "nothing decided", batch_id, p, int(blocks.max()),
                           current.num_blocks)
            return None
        np.add.at(sizes, blocks, np.asarray(per_block["rows"], dtype=np.float64))
    rebalancer.observe(latency, sizes, current)
    return rebalancer.decide()


def rebalance_target(rebalancer: Any, store: KeyedStateStore, batch_id: int,
                     current: Partitioner, decision: Any, pending: bool) -> Partitioner | None:
    """The placement a decision with moves swaps to at the next batch, or None: no moves,
    (logged) a swap ``pending`` or still under way, which the moves wait for, or (logged as
    refused) a target the state cannot be swapped to.

    An ``"overloaded"`` decision is advice for the user (``request_swap(num_partitions=...)``),
    never carried out here; its partition count is logged clipped to what the placement can
    take: at most its blocks and :data:`~trilink_spark._internal.validation.MAX_PARTITIONS`.
    """
    table = current if isinstance(current, TablePartitioner) else None
    if table is not None:  # the units the decision was made on (rebalancer_decision)
        units = unit_table(table)
        if units is None:
            return None
        current = units
    advised = getattr(decision, "partitions", None)
    if advised is not None and isinstance(current, BlockPartitioner):
        bound = min(current.num_blocks, MAX_PARTITIONS)
        clipped = _clip(advised, bound)
        logger.info("batch %d: the rebalancer advises %s partitions (at most %d: the "
                    "placement's %d blocks); run.request_swap(num_partitions=...) rescales",
                    batch_id, clipped, bound, current.num_blocks)
    if not decision.moves:
        return None
    last = store.load_plan(batch_id)
    if pending or (last is not None and not last["complete"]):
        logger.info("batch %d: a swap is pending or under way; the moves wait", batch_id)
        return None
    target = rebalancer.apply(current, decision)
    fits = (isinstance(target, BlockPartitioner) and isinstance(current, BlockPartitioner)
            and target.num_blocks == current.num_blocks
            and target.num_partitions <= min(current.num_blocks, MAX_PARTITIONS))
    if not fits:
        logger.warning("batch %d: the rebalancer's target (%r) is refused: moving blocks "
                       "keeps the placement's %s blocks", batch_id, target,
                       getattr(current, "num_blocks", "?"))
        return None
    if table is not None:
        return from_units(table, target)
    out: Partitioner = target
    return out


def _clip(advised: Any, bound: int) -> int | None:
    """``advised`` partitions within ``1 .. bound`` (None: not a finite number)."""
    try:
        value = float(advised)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(value):
        return None
    return max(1, min(int(value), bound))


def swap_report(plan: dict[str, Any], batch_id: int, moved_bytes: int,
                seconds: float) -> SwapReport:
    """The :class:`SwapReport` of a batch that ran ``plan``."""
    return SwapReport(
        batch_id=batch_id, mode=str(plan["mode"]),
        partitions_before=int(plan["partitions_before"]),
        partitions_after=int(plan["partitions_after"]),
        keys_total=int(plan["keys_total"]),
        moved_keys=int(plan["moved_keys"]), moved_bytes=moved_bytes,
        complete=bool(plan["complete"]), seconds=seconds)


def refusal_report(batch_id: int, request: SwapRequest, current: Partitioner, why: str,
                   seconds: float) -> SwapReport:
    """The :class:`SwapReport` of a swap refused at ``batch_id`` (logged as a warning): the
    batch ran with the placement ``current``, moving nothing."""
    logger.warning("batch %d: swap refused (%s); the batch runs with the placement in force "
                   "(%s, %d partitions)", batch_id, why, type(current).__name__,
                   current.num_partitions)
    return SwapReport(batch_id=batch_id, mode=request.mode,
                      partitions_before=current.num_partitions,
                      partitions_after=current.num_partitions, keys_total=0, moved_keys=0,
                      moved_bytes=0, complete=True, seconds=seconds, refused=why)
