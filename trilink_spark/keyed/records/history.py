"""What each micro-batch of a keyed run did, kept on the state path for a live view and reports.

A :func:`~trilink_spark.keyed.keyed_foreach_batch` run writes one small **history record** per
committed batch, beside its state (``records/history-<batch>.json``: a sealed, checksummed
JSON record of the store, :meth:`~trilink_spark.state.KeyedStateStore.save_record`). It holds
what the batch's tasks measured and what the driver decided:

================== ==========================================================================
field              value
================== ==========================================================================
``v``              :data:`HISTORY_VERSION`
``batch``          the micro-batch id
``time``           the driver's clock at the commit (seconds since the epoch)
``seconds``        the driver's wall time of the batch
``strategy``       the strategy in force for the batch (its catalogue name)
``partitions``     partitions of the placement
``rows``           per partition, the rows its task processed (-1: no figure)
``task_ms``        per partition, the task's keyed work in milliseconds (-1: no figure)
``late``           per partition, rows late by the key watermark in this batch (-1: unknown)
``late_partition`` per partition, rows that a partition watermark would have called late
``hot_keys``       the batch's heaviest keys: ``[key, rows, partition]``, heaviest first
``sample``         ``{"keys": [...], "weights": [...]}``: a weighted key-count sample of the
                   batch (every task's heaviest keys exactly, and a uniform sample of the rest
                   scaled up), on which candidate strategies can be scored
``swap``           the swap carried out (or refused) at the batch, or null
``request``        the ``request_swap`` this batch carried out, or null
``rebalance``      the load-aware rebalancer's judgement of the batch, or null
================== ==========================================================================

Keys are shown as JSON scalars (:func:`display_key`): strings cut at :data:`MAX_KEY_CHARS`,
bytes as hex, other types as text.

A record is checked by :func:`~trilink_spark.state.formats.check_history_record`, the one check
of the layout: before it is written, when it is read back (:func:`check_record`), and by the
dashboard. A record one of them takes, the others take.

Costs: each task counts its keys once (Arrow ``value_counts``, O(rows)) and adds at most
:data:`HOT_KEYS` + :data:`SAMPLE_KEYS` keys to its timing record; the driver reads the
batch's timing records (O(partitions)), writes one record and deletes the one that fell out
of the kept window: a batch costs what it touches, whatever the run's age. The state path
keeps the newest ``spark.trilink.historyBatches`` records (default :data:`DEFAULT_KEEP`).
A record is an observation, not state: failing to write one is logged, never fails the batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..._internal.spark.session import conf_count
from ..._internal.validation import KEY_DISPLAY_CHARS, count, display_key
from ...errors import StateCorruptError, TrilinkError
from ...state import KeyedStateStore
from ...state.formats import HISTORY_VERSION, MAX_HISTORY_PARTITIONS, check_history_record

__all__ = [
    "HISTORY_VERSION", "HISTORY_CONF", "DEFAULT_KEEP", "HOT_KEYS", "SAMPLE_KEYS",
    "MAX_KEY_CHARS", "MAX_SAMPLE", "MAX_HISTORY_PARTITIONS", "bounded_sample", "display_key",
    "key_profile", "history_keep", "RunHistory", "record_batch",
    "check_record", "record_name", "history_batches", "read_history", "read_history_record",
]

logger = logging.getLogger(__name__)

#: The conf that sets how many batches' records the state path keeps.
HISTORY_CONF = "spark.trilink.historyBatches"
#: Records kept by default: a run of weeks keeps its newest 1,000 batches.
DEFAULT_KEEP = 1000
#: Heaviest keys each task records (and the record keeps over all partitions).
HOT_KEYS = 10
#: Keys each task samples among the rest, for scoring candidate strategies.
SAMPLE_KEYS = 64
#: A string key is shown up to this many characters (and "…"): the display limit of
#: :func:`display_key` (:data:`~trilink_spark._internal.validation.KEY_DISPLAY_CHARS`).
MAX_KEY_CHARS = KEY_DISPLAY_CHARS
#: Keys a batch's record samples at most, whatever the partition count (the heaviest half
#: exactly, a uniform sample of the rest scaled up).
MAX_SAMPLE = 4096
_PREFIX = "history-"


def key_profile(keys: Any, seed: int = 0) -> dict[str, Any]:
    """A task's keys, counted: its :data:`HOT_KEYS` heaviest and a weighted sample of the rest.

    Parameters
    ----------
    keys : pyarrow.Array or pyarrow.ChunkedArray
        The batch's key column in this task (nulls are a key of their own).
    seed : int
        Seeds the choice of the sampled keys (the partition and batch: repeatable).

    Returns
    -------
    dict
        ``{"hot": [[key, rows], ...], "sample": [[key, weight], ...], "keys": distinct}``:
        ``hot`` heaviest first (ties by first appearance); ``sample`` holds at most
        :data:`SAMPLE_KEYS` of the other keys, each weighted by its rows times (other keys /
        sampled keys), so the sample's weights add up to about the task's rows.

    Notes
    -----
    One ``value_counts`` over the column (O(rows), in Arrow) and a partial sort of the counts
    (O(distinct keys)); only the chosen keys become Python objects.

    Examples
    --------
    >>> import pyarrow as pa
    >>> key_profile(pa.array(["a", "b", "a", None]))["hot"]
    [['a', 2], ['b', 1], [None, 1]]
    """
    import pyarrow.compute as pc

    counted = pc.value_counts(keys)
    values = counted.field("values")
    counts = counted.field("counts").to_numpy(zero_copy_only=False).astype(np.int64)
    n = len(counts)
    if n == 0:
        return {"hot": [], "sample": [], "keys": 0}
    k = min(HOT_KEYS, n)
    top = np.argpartition(-counts, k - 1)[:k] if k < n else np.arange(n)
    top = top[np.lexsort((top, -counts[top]))]  # heaviest first, then first seen
    hot = [[display_key(v), int(c)] for v, c in zip(values.take(top).to_pylist(), counts[top])]
    rest = np.setdiff1d(np.arange(n), top, assume_unique=True)
    sample: list[list[Any]] = []
    if len(rest):
        chosen = rest if len(rest) <= SAMPLE_KEYS else np.sort(
            np.random.default_rng(seed).choice(rest, SAMPLE_KEYS, replace=False))
        scale = len(rest) / len(chosen)
        sample = [[display_key(v), round(float(c) * scale, 3)]
                  for v, c in zip(values.take(chosen).to_pylist(), counts[chosen])]
    return {"hot": hot, "sample": sample, "keys": int(n)}


def history_keep(spark: Any) -> int:
    """How many batches' records a run keeps: ``spark.trilink.historyBatches`` (default
    :data:`DEFAULT_KEEP`).

    Raises
    ------
    InvalidArgumentError
        The conf is not a whole number of at least 1.
    """
    return conf_count(spark, HISTORY_CONF.removeprefix("spark.trilink."), DEFAULT_KEEP)


def record_name(batch: int) -> str:
    """The store record name of batch ``batch``'s history record (``history-<12 digits>``;
    :meth:`~trilink_spark.state.KeyedStateStore.record_path` gives its file). O(1).

    Examples
    --------
    >>> record_name(41)
    'history-000000000041'
    """
    return f"{_PREFIX}{batch:012d}"


def _figures(store: KeyedStateStore, batch_id: int, partitions: int
             ) -> tuple[dict[str, list[Any]], list[list[Any]], dict[str, list[Any]]]:
    columns: dict[str, list[Any]] = {"rows": [], "task_ms": [], "late": [],
                                     "late_partition": [], "executor": [], "sync": []}
    hot: list[list[Any]] = []
    sample: dict[str, list[Any]] = {"keys": [], "weights": []}
    for p in range(partitions):
        t = store.timing(p, batch_id) or {}
        columns["rows"].append(int(t.get("rows", -1)))
        columns["task_ms"].append(float(t.get("process_ms", -1.0)))
        unknown = 0 if t.get("rows") == 0 else -1  # a task without rows judged none late
        columns["late"].append(int(t.get("late", unknown)))
        columns["late_partition"].append(int(t.get("late_partition", unknown)))
        columns["executor"].append(str(t.get("executor", "")))
        columns["sync"].append(str(t.get("sync", "")))
        profile = t.get("keys") or {}
        hot.extend([k, n, p] for k, n in profile.get("hot", ()))
        for k, w in [*profile.get("hot", ()), *profile.get("sample", ())]:
            sample["keys"].append(k)
            sample["weights"].append(w)
    hot.sort(key=lambda h: -h[1])  # stable: partition order among equals
    return columns, hot[:HOT_KEYS], bounded_sample(sample, seed=batch_id)


def bounded_sample(sample: dict[str, list[Any]], seed: int = 0) -> dict[str, list[Any]]:
    """``sample`` cut to :data:`MAX_SAMPLE` keys: the heaviest half kept exactly, a uniform
    sample of the others with their weights scaled by (others / sampled), so the weights
    still add up to about the batch's rows. O(keys).

    Examples
    --------
    >>> cut = bounded_sample({"keys": list(range(10_000)), "weights": [1.0] * 10_000})
    >>> len(cut["keys"]), round(sum(cut["weights"]))
    (4096, 10000)
    """
    n = len(sample["keys"])
    if n <= MAX_SAMPLE:
        return sample
    weights = np.asarray(sample["weights"], dtype=np.float64)
    half = MAX_SAMPLE // 2
    order = np.argsort(-weights, kind="stable")
    heavy, rest = order[:half], order[half:]
    chosen = np.sort(np.random.default_rng(seed).choice(rest, MAX_SAMPLE - half,
                                                        replace=False))
    scale = len(rest) / len(chosen)
    keys = sample["keys"]
    return {"keys": [keys[i] for i in heavy] + [keys[i] for i in chosen],
            "weights": [float(weights[i]) for i in heavy]
            + [round(float(weights[i]) * scale, 3) for i in chosen]}


def record_batch(store: KeyedStateStore, batch_id: int, partitions: int, strategy: str, *,
                 seconds: float, keep: int, swap: Mapping[str, Any] | None = None,
                 request: Mapping[str, Any] | None = None,
                 rebalance: Mapping[str, Any] | None = None,
                 clock: float | None = None) -> dict[str, Any] | None:
    """Write batch ``batch_id``'s history record (module docs) and drop the one that left the
    kept window. Called by the runner after the batch committed.

    Returns
    -------
    dict or None
        The record written; None when it could not be (logged: a record never fails a
        committed batch).

    Notes
    -----
    O(partitions) timing reads, one check of the record (O(partitions + sample keys)), one
    record written, one deleted.
    """
    try:
        columns, hot, sample = _figures(store, batch_id, partitions)
        body: dict[str, Any] = {
            "v": HISTORY_VERSION, "batch": int(batch_id),
            "time": round(time.time() if clock is None else clock, 3),
            "seconds": round(max(float(seconds), 0.0), 4), "strategy": str(strategy),
            "partitions": int(partitions), **columns, "hot_keys": hot, "sample": sample,
            "swap": None if swap is None else dict(swap),
            "request": None if request is None else dict(request),
            "rebalance": None if rebalance is None else dict(rebalance)}
        check_history_record(body, complete=True)  # what the view would refuse is not written
        store.save_record(record_name(batch_id), body)
        store.delete_record(record_name(batch_id - keep))
        if batch_id % keep == 0:  # ids that skipped (a restart elsewhere) leave none behind
            for old in history_batches(store):
                if old <= batch_id - keep:
                    store.delete_record(record_name(old))
        return body
    except (TrilinkError, OSError, ValueError, TypeError) as err:
        logger.warning("batch %d: history record not written (%s: %s)", batch_id,
                       type(err).__name__, err)
        return None


class RunHistory:
    """The history writer of one keyed run: the kept window, read once, and one record per
    committed batch (:func:`record_batch`). Picklable (two plain fields).

    Examples
    --------
    >>> history = RunHistory()
    >>> history.keep is None
    True
    """

    def __init__(self) -> None:
        #: ``spark.trilink.historyBatches``, read on the run's first batch (:meth:`start`).
        self.keep: int | None = None
        #: Whether the run was told once that it has too many partitions for a record.
        self.skipped = False

    def start(self, spark: Any) -> int:
        """:func:`history_keep`, read on the run's first batch and kept (the conf is not a
        per-batch setting). The runner asks before the batch does any work, so a malformed
        conf fails the batch before its commit, never after. O(1).

        Raises
        ------
        InvalidArgumentError
            The conf is not a whole number of at least 1.
        """
        if self.keep is None:
            self.keep = history_keep(spark)
        return self.keep

    def record(self, store: KeyedStateStore, spark: Any, batch_id: int, partitions: int,
               strategy: Any, started: float, request_id: str | None, swaps: Sequence[Any],
               rebalances: Sequence[tuple[int, Any]]) -> dict[str, Any] | None:
        """:func:`record_batch` for a run that has just committed ``batch_id``: its swap
        report (``swaps``) and rebalancer judgement (``rebalances``) of the batch, if any,
        and the strategy in force (None: placed by the source). O(partitions)."""
        from dataclasses import asdict

        keep = self.start(spark)
        if partitions > MAX_HISTORY_PARTITIONS:  # its record would not fit a store record
            if not self.skipped:
                self.skipped = True
                logger.warning("batch %d: %d partitions: no history record is kept beyond %d "
                               "partitions", batch_id, partitions, MAX_HISTORY_PARTITIONS)
            return None
        name = "keyed_by_source" if strategy is None else (
            getattr(strategy, "strategy_name", "") or type(strategy).__name__)
        swap = next((asdict(r) for r in reversed(swaps) if r.batch_id == batch_id), None)
        judged = next((d for b, d in reversed(rebalances) if b == batch_id), None)
        rebalance = None if judged is None else {
            "state": str(judged.state), "moves": len(judged.moves),
            "reason": str(judged.reason)}
        request = None if request_id is None else {
            "request_id": request_id, "strategy": name, "num_partitions": int(partitions),
            "mode": None if swap is None else swap.get("mode")}
        return record_batch(store, batch_id, partitions, name,
                            seconds=time.perf_counter() - started, keep=keep, swap=swap,
                            request=request, rebalance=rebalance)


def history_batches(store: KeyedStateStore) -> list[int]:
    """The batches whose history records the state path holds, ascending. One listing of the
    records directory (at most the kept window and a few other records)."""
    from pyarrow import fs

    folder = store.record_path("x").rsplit("/", 1)[0]
    try:
        infos = store.fs.get_file_info(fs.FileSelector(folder, allow_not_found=True))
    except OSError as err:
        logger.warning("%s: history not listed (%s)", folder, err)
        return []
    found = []
    for info in infos:
        name = info.base_name
        stem = name[len(_PREFIX):-len(".json")] if name.endswith(".json") else ""
        if name.startswith(_PREFIX) and len(stem) == 12 and stem.isdigit():
            found.append(int(stem))
    return sorted(found)


def read_history(store: KeyedStateStore | str, *, since: int | None = None,
                 last: int | None = None, skip_corrupt: bool = False
                 ) -> list[dict[str, Any]]:
    """The history records a run's state path holds, oldest first.

    Parameters
    ----------
    store : KeyedStateStore or str
        The run's store, or its state path.
    since : int, optional
        Only batches after this one (a live view's next poll).
    last : int, optional
        Only the newest ``last`` of them.
    skip_corrupt : bool
        False (default): a damaged or foreign record raises. True: it is logged and left out.

    Raises
    ------
    StateCorruptError
        A record fails its checksum, is not JSON, or is not a history record of this layout
        (the message names the file); only with ``skip_corrupt=False``.

    Notes
    -----
    One listing, then one read per record returned (at most the kept window).

    Examples
    --------
    >>> read_history("/tmp/state", last=20)  # doctest: +SKIP
    [{'v': 1, 'batch': 41, 'rows': [2000, 1990], ...}, ...]
    """
    if isinstance(store, str):
        store = KeyedStateStore(store)
    batches = [b for b in history_batches(store) if since is None or b > since]
    if last is not None:
        batches = batches[-count(last, "last"):] if last else []
    out = []
    for batch in batches:
        try:
            body = read_history_record(store, batch)
        except StateCorruptError as err:
            if not skip_corrupt:
                raise
            logger.warning("%s; left out", err)
            continue
        if body is not None:  # None: dropped since the listing
            out.append(body)
    return out


def read_history_record(store: KeyedStateStore, batch: int) -> dict[str, Any] | None:
    """Batch ``batch``'s history record (None when the state path holds none). One read.

    Raises
    ------
    StateCorruptError
        The record is damaged or foreign (:func:`check_record`); the message names the file.
    """
    body = store.load_record(record_name(batch))
    return None if body is None else check_record(body, store.record_path(record_name(batch)))


def check_record(body: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``body`` when it is a history record of this layout, every field present: the record
    as stored, checked by :func:`~trilink_spark.state.formats.check_history_record` (types,
    list lengths and the view's bounds). O(partitions + hot keys + sample keys).

    Raises
    ------
    StateCorruptError
        It is not: the message names ``where`` and the first field that is wrong.
    """
    check_history_record(body, where, complete=True)
    return dict(body)
