"""The history record a keyed run writes after each micro-batch, and the events beside it,
as the dashboard holds them, checked field by field first.

A record or event comes from a file or a listener the dashboard does not control: every field
is checked for its type and range, every list for its length, every text for its size, and
nothing is evaluated. A record is checked by
:func:`~trilink_spark.state.formats.check_history_record`, the one check of the layout (the run
that writes it runs the same one): :func:`parse_batch_record` turns a record given as a
mapping into a :class:`BatchRecord`, :func:`read_batch_record` one read from a state path.
:func:`parse_event` turns an event into a :class:`RequestEvent`, :class:`AdviceEvent` or
:class:`ProgressEvent`. A record or event given as an argument is refused with
:class:`~trilink_spark.errors.InvalidArgumentError` (or
:class:`~trilink_spark.errors.InvalidArgumentTypeError`) naming the field, what it held and
what is allowed; a record read from a state path with
:class:`~trilink_spark.errors.StateCorruptError` naming its file.

Examples
--------
>>> record = parse_batch_record({"v": 1, "batch": 3, "time": 1795000000.0, "seconds": 0.5,
...                              "strategy": "hash", "partitions": 2, "rows": [10, -1]})
>>> record.batch, record.run, record.rows.tolist()
(3, 'run', [10.0, -1.0])
>>> parse_batch_record({"v": 1, "batch": -2})
Traceback (most recent call last):
...
trilink_spark.errors.InvalidArgumentError: record.batch must be >= 0, got -2
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from .._internal.deprecation import warn_moved
from .._internal.validation import INT64_MAX, JsonKey, choice, count, key_text, number, text
from ..errors import InvalidArgumentTypeError
from ..keyed.records.history import record_name
from ..state import KeyedStateStore
from ..state.formats import (HISTORY_VERSION, MAX_HISTORY_PARTITIONS, MAX_HOT_KEYS,
                             MAX_NAME_CHARS, MAX_SAMPLE_KEYS, MAX_TEXT_CHARS,
                             check_history_record, check_swap_request)

__all__ = [
    "RECORD_VERSION",
    "MAX_RECORD_PARTITIONS",
    "MAX_HOT_KEYS",
    "MAX_SAMPLE_KEYS",
    "MAX_TEXT_CHARS",
    "ADVICE_SOURCES",
    "DEFAULT_RUN",
    "Key",
    "Swap",
    "SwapRequestView",
    "Rebalance",
    "BatchRecord",
    "RequestEvent",
    "AdviceEvent",
    "ProgressEvent",
    "Event",
    "parse_batch_record",
    "read_batch_record",
    "parse_event",
    "key_text",
]

#: The record format this module reads (a record's ``"v"``): the history's.
RECORD_VERSION = HISTORY_VERSION
#: The most partitions one record may describe: the history's own bound.
MAX_RECORD_PARTITIONS = MAX_HISTORY_PARTITIONS
#: Where advice comes from.
ADVICE_SOURCES = ("bottleneck", "ds2", "elasticity", "switching")
#: The run name of a record that names none.
DEFAULT_RUN = "run"
_SHOWN_CHARS = 500  # free texts (reasons, advice) are cut to this for display
#: Names this module had, and the names they have now (each still resolves, with a
#: DeprecationWarning, until the next minor release).
_RENAMED = {"parse_record": "parse_batch_record", "SwapRequest": "SwapRequestView"}

#: A key: the JSON scalars (``str``, ``int``, ``float``, ``bool``, ``None``).
Key: TypeAlias = JsonKey


@dataclass(frozen=True)
class Swap:
    """A strategy swap carried out (or refused) at the end of a batch."""

    mode: str | None
    partitions_before: int | None
    partitions_after: int | None
    keys_total: int | None
    moved_keys: int | None
    moved_bytes: int | None
    seconds: float | None
    complete: bool | None
    refused: str | None


@dataclass(frozen=True)
class SwapRequestView:
    """The dashboard's view of a swap request: pending (an event) or carried out by a batch
    (in its record). The request a run carries out is
    :class:`trilink_spark.keyed.swaps.plan.SwapRequest`."""

    request_id: str
    strategy: str | None
    num_partitions: int | None
    mode: str | None


@dataclass(frozen=True)
class Rebalance:
    """The load-aware rebalancer's judgement of one batch."""

    reason: str
    moves: int | None


@dataclass(frozen=True, eq=False)
class BatchRecord:
    """One checked history record.

    Per-partition figures are float arrays of ``partitions`` entries, ``-1`` where the record
    had no figure (``None`` for a list the record left out). ``sample`` maps each sampled key to
    its summed weight (keys repeated in the record are added up).
    """

    run: str
    batch: int
    time: float
    seconds: float
    strategy: str
    partitions: int
    rows: npt.NDArray[np.float64]
    task_ms: npt.NDArray[np.float64] | None
    late: npt.NDArray[np.float64] | None
    late_partition: npt.NDArray[np.float64] | None
    hot_keys: tuple[tuple[Key, float, int], ...]
    sample: dict[Key, float] | None
    swap: Swap | None
    request: SwapRequestView | None
    rebalance: Rebalance | None
    #: Per partition, the executor its task ran on and what its local copy needed (``sync``),
    #: "" where unknown; None in a record written before these were kept.
    executor: tuple[str, ...] | None = None
    sync: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RequestEvent:
    """A swap request seen before the batch that carries it out."""

    time: float
    request: SwapRequestView
    run: str | None


@dataclass(frozen=True)
class AdviceEvent:
    """Advice of the bottleneck, DS2 or elasticity advisor, or an adaptive strategy's switching."""

    time: float
    batch: int | None
    source: str
    advice: str
    reason: str
    run: str | None


@dataclass(frozen=True)
class ProgressEvent:
    """One query progress report of Spark's ``StreamingQueryListener``."""

    time: float
    batch: int
    query: str
    input_rows: float
    duration_ms: float


Event: TypeAlias = RequestEvent | AdviceEvent | ProgressEvent


def _cut(value: str | None) -> str | None:
    """A free text as the page shows it: cut to :data:`_SHOWN_CHARS` (the check bounds it)."""
    if value is None or len(value) <= _SHOWN_CHARS:
        return value
    return value[: _SHOWN_CHARS - 1] + "\u2026"


def _view(checked: Mapping[str, Any], run: str | None) -> BatchRecord:
    """The dashboard's view of a record :func:`check_history_record` returned. O(partitions
    + hot keys + sample keys); nothing is checked again."""
    def figures(name: str) -> npt.NDArray[np.float64] | None:
        values = checked[name]
        return None if values is None else np.asarray(values, dtype=np.float64)

    sample: dict[Key, float] | None = None
    if checked["sample"] is not None:
        sample = {}
        for key, weight in zip(checked["sample"]["keys"], checked["sample"]["weights"]):
            sample[key] = sample.get(key, 0.0) + weight
    swap = checked["swap"]
    request = checked["request"]
    rebalance = checked["rebalance"]
    return BatchRecord(
        run=run or checked["run"] or DEFAULT_RUN,
        batch=checked["batch"],
        time=checked["time"],
        seconds=checked["seconds"],
        strategy=checked["strategy"],
        partitions=checked["partitions"],
        rows=np.asarray(checked["rows"], dtype=np.float64),
        task_ms=figures("task_ms"),
        late=figures("late"),
        late_partition=figures("late_partition"),
        hot_keys=tuple(checked["hot_keys"]),
        sample=sample,
        swap=None if swap is None else Swap(**{**swap, "refused": _cut(swap["refused"])}),
        request=None if request is None else SwapRequestView(**request),
        rebalance=None if rebalance is None else Rebalance(
            reason=_cut(rebalance["reason"]) or "", moves=rebalance["moves"]),
        executor=None if checked["executor"] is None else tuple(checked["executor"]),
        sync=None if checked["sync"] is None else tuple(checked["sync"]),
    )


def parse_batch_record(record: Any, where: str | None = None) -> BatchRecord:
    """Check one history record (:func:`~trilink_spark.state.formats.check_history_record`,
    the one check of the layout) and return the dashboard's view of it, a
    :class:`BatchRecord`.

    Parameters
    ----------
    record : mapping
        The record (format ``"v": 1``): ``batch``, ``time``, ``seconds``, ``strategy``,
        ``partitions`` and ``rows`` are required; ``task_ms``, ``late``, ``late_partition``,
        ``hot_keys``, ``sample``, ``swap``, ``request``, ``rebalance`` may be missing or null;
        ``run`` (added by the feed) defaults to :data:`DEFAULT_RUN`.
    where : str, optional
        The file the record was read from: a record that fails is then a
        :class:`~trilink_spark.errors.StateCorruptError` naming it (and every field of the
        layout is required, as a run writes them).

    Returns
    -------
    BatchRecord
        Free texts (a swap's refusal, a rebalancer's reason) cut to 500 characters for the
        page.

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError
        A field of the wrong type, out of range, a per-partition list whose length is not
        ``partitions``, a list beyond its limit (:data:`MAX_RECORD_PARTITIONS`,
        :data:`MAX_HOT_KEYS`, :data:`MAX_SAMPLE_KEYS`), a key that is not a JSON scalar or
        longer than a stored key, a text beyond :data:`MAX_TEXT_CHARS`; the message names the
        field.
    StateCorruptError
        The same, for a record read from ``where``.

    Notes
    -----
    Cost: O(partitions + hot keys + sample keys).

    Examples
    --------
    >>> r = parse_batch_record({"v": 1, "batch": 0, "time": 1.0, "seconds": 0.1,
    ...                         "strategy": "hash", "partitions": 1, "rows": [5],
    ...                         "hot_keys": [["a", 5, 0]]})
    >>> r.hot_keys
    (('a', 5.0, 0),)
    """
    checked = check_history_record(record, where, complete=where is not None)
    return _view(checked, None)


def read_batch_record(store: KeyedStateStore, batch: int, run: str) -> BatchRecord | None:
    """Batch ``batch``'s history record on ``store``, as the dashboard's view of run ``run``;
    None when the state path holds none. One small read and one check of the record.

    Raises
    ------
    StateCorruptError
        The record is damaged or not a history record of this layout (the message names its
        file).

    Examples
    --------
    >>> read_batch_record(KeyedStateStore("/tmp/state"), 41, "clicks")  # doctest: +SKIP
    BatchRecord(run='clicks', batch=41, ...)
    """
    name = record_name(batch)
    body = store.load_record(name)
    if body is None:
        return None
    return _view(check_history_record(body, store.record_path(name), complete=True), run)


def parse_event(event: Any) -> Event:
    """Check one event (``kind`` ``"request"``, ``"advice"`` or ``"progress"``).

    Parameters
    ----------
    event : mapping
        ``{"kind": "request", "time", "request_id", "strategy", "num_partitions", "mode"}``,
        ``{"kind": "advice", "time", "batch", "source", "advice", "reason"}`` (source one of
        :data:`ADVICE_SOURCES`) or ``{"kind": "progress", "time", "batch", "query",
        "input_rows", "duration_ms"}``; requests and advice may name their ``run``.

    Returns
    -------
    RequestEvent, AdviceEvent or ProgressEvent

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError
        An unknown kind, or a field of the wrong type or out of range (the message names it).

    Notes
    -----
    Cost: O(1) (texts are checked for their length).

    Examples
    --------
    >>> parse_event({"kind": "progress", "time": 2.0, "batch": 4, "query": "q",
    ...              "input_rows": 10, "duration_ms": 80})
    ProgressEvent(time=2.0, batch=4, query='q', input_rows=10.0, duration_ms=80.0)
    """
    if not isinstance(event, Mapping):
        raise InvalidArgumentTypeError(
            f"event must be a mapping (a JSON object), got {type(event).__name__}")
    kind = choice(event.get("kind"), "event.kind", ("request", "advice", "progress"))
    time = number(event.get("time"), "event.time")
    run = event.get("run")
    run_name = None if run is None else text(run, "event.run", MAX_NAME_CHARS, empty=False)
    if kind == "request":
        return RequestEvent(time=time, request=SwapRequestView(**check_swap_request(event,
                                                                                  "event")),
                            run=run_name)
    if kind == "advice":
        batch = event.get("batch")
        return AdviceEvent(
            time=time,
            batch=None if batch is None else count(batch, "event.batch", 0, high=INT64_MAX,
                                                   plain=True),
            source=choice(event.get("source"), "event.source", ADVICE_SOURCES),
            advice=_shown(event.get("advice"), "event.advice"),
            reason=_shown(event.get("reason", ""), "event.reason"),
            run=run_name)
    query = event.get("query")
    return ProgressEvent(
        time=time,
        batch=count(event.get("batch"), "event.batch", 0, high=INT64_MAX, plain=True),
        query=text(query if not isinstance(query, int) or isinstance(query, bool)
                   else str(query), "event.query", MAX_NAME_CHARS),
        input_rows=number(event.get("input_rows"), "event.input_rows", low=0.0),
        duration_ms=number(event.get("duration_ms"), "event.duration_ms", low=0.0))


def _shown(value: Any, name: str) -> str:
    """A free text of an event, bounded as a record's are and cut for the page."""
    return _cut(text(value, name, MAX_TEXT_CHARS)) or ""


def __getattr__(name: str) -> Any:
    """The names :data:`_RENAMED` gave up: each resolves to its new name, with a
    :class:`DeprecationWarning`, until the next minor release."""
    if name not in _RENAMED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_moved(f"{__name__}.{name}", f"{__name__}.{_RENAMED[name]}")
    return globals()[_RENAMED[name]]
