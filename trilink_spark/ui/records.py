"""The history record a keyed run writes after each micro-batch, and the events beside it,
checked field by field before the dashboard holds them.

A record or event comes from a file or a listener the dashboard does not control: every field
is checked for its type and range, every list for its length, every text for its size, and
nothing is evaluated. :func:`parse_record` turns one record (a JSON-compatible mapping) into a
:class:`BatchRecord`; :func:`parse_event` an event into a :class:`RequestEvent`,
:class:`AdviceEvent` or :class:`ProgressEvent`. Both raise
:class:`~trilink_spark.errors.InvalidArgumentError` (or
:class:`~trilink_spark.errors.InvalidArgumentTypeError`) naming the field, what it held and
what is allowed.

Examples
--------
>>> record = parse_record({"v": 1, "batch": 3, "time": 1795000000.0, "seconds": 0.5,
...                        "strategy": "hash", "partitions": 2, "rows": [10, -1]})
>>> record.batch, record.run, record.rows.tolist()
(3, 'run', [10.0, -1.0])
>>> parse_record({"v": 1, "batch": -2})
Traceback (most recent call last):
...
trilink_spark.errors.InvalidArgumentError: record.batch must be >= 0, got -2
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from .._internal.validation import choice, count, number, short_repr
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..keyed.records.history import HISTORY_VERSION, MAX_HISTORY_PARTITIONS

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
    "SwapRequest",
    "Rebalance",
    "BatchRecord",
    "RequestEvent",
    "AdviceEvent",
    "ProgressEvent",
    "Event",
    "parse_record",
    "parse_event",
    "key_text",
]

#: The record format this module reads (a record's ``"v"``): the history's.
RECORD_VERSION = HISTORY_VERSION
#: The most partitions one record may describe: the history's own bound.
MAX_RECORD_PARTITIONS = MAX_HISTORY_PARTITIONS
#: The most hot keys one record may carry (the page shows the top 10).
MAX_HOT_KEYS = 100
#: The most keys a record's sample may hold (the candidates are fitted on it).
MAX_SAMPLE_KEYS = 20_000
#: The longest text a field may hold; longer texts are refused, not cut.
MAX_TEXT_CHARS = 10_000
#: Where advice comes from.
ADVICE_SOURCES = ("bottleneck", "ds2", "elasticity", "switching")
#: The run name of a record that names none.
DEFAULT_RUN = "run"
_NAME_CHARS = 200  # names (runs, strategies, ids, modes, queries) are refused beyond this
_SHOWN_CHARS = 500  # free texts (reasons, advice) are cut to this for display
_INT64_MAX = 2**63 - 1

#: A key: the JSON scalars (``str``, ``int``, ``float``, ``bool``, ``None``).
Key: TypeAlias = str | int | float | bool | None


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
class SwapRequest:
    """A swap request: pending (an event) or carried out by a batch (in its record)."""

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
    request: SwapRequest | None
    rebalance: Rebalance | None


@dataclass(frozen=True)
class RequestEvent:
    """A swap request seen before the batch that carries it out."""

    time: float
    request: SwapRequest
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


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgumentTypeError(
            f"{name} must be a mapping (a JSON object), got {type(value).__name__}")
    return value


def _int(value: Any, name: str, low: int = 0, high: int = _INT64_MAX) -> int:
    out = count(value, name, low, plain=True)
    if out > high:
        raise InvalidArgumentError(f"{name} must be at most {high:,}, got {short_repr(out)}")
    return out


def _opt_int(value: Any, name: str, low: int = 0) -> int | None:
    return None if value is None else _int(value, name, low)


def _real(value: Any, name: str, low: float | None = 0.0) -> float:
    return number(value, name, low=low)


def _opt_real(value: Any, name: str) -> float | None:
    return None if value is None else _real(value, name)


def _text(value: Any, name: str, *, limit: int = _NAME_CHARS, cut: bool = False) -> str:
    """A str of at most ``limit`` characters; with ``cut``, a longer one (up to
    :data:`MAX_TEXT_CHARS`) is shortened for display instead of refused."""
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(f"{name} must be a str, got {type(value).__name__}")
    if len(value) > (MAX_TEXT_CHARS if cut else limit):
        raise InvalidArgumentError(
            f"{name} is {len(value):,} characters long; at most "
            f"{MAX_TEXT_CHARS if cut else limit:,} are allowed")
    return value if len(value) <= limit else value[: limit - 1] + "\u2026"


def _opt_text(value: Any, name: str, *, limit: int = _NAME_CHARS, cut: bool = False) -> str | None:
    return None if value is None else _text(value, name, limit=limit, cut=cut)


def _run(value: Any, name: str) -> str:
    run = _text(value, name)
    if not run:
        raise InvalidArgumentError(f"{name} must be a non-empty str")
    return run


def _list(value: Any, name: str, limit: int) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise InvalidArgumentTypeError(
            f"{name} must be a list (a JSON array), got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidArgumentError(f"{name} holds {len(value):,} entries; at most {limit:,} "
                                   "are allowed")
    return value


def _figures(value: Any, name: str, partitions: int) -> npt.NDArray[np.float64]:
    """One figure per partition: finite numbers >= 0, or -1 for no figure."""
    items = _list(value, name, MAX_RECORD_PARTITIONS)
    if len(items) != partitions:
        raise InvalidArgumentError(
            f"{name} holds {len(items)} figures for {partitions} partitions; give one per "
            "partition (-1 where there is none)")
    out = np.empty(partitions, dtype=np.float64)
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, numbers.Real):
            raise InvalidArgumentTypeError(
                f"{name}[{i}] must be a number, got {type(item).__name__}")
        try:
            figure = float(item)
        except OverflowError:
            figure = math.inf
        if not math.isfinite(figure) or (figure < 0 and figure != -1):
            raise InvalidArgumentError(
                f"{name}[{i}] must be a finite number >= 0, or -1 for no figure, got "
                f"{short_repr(item)}")
        out[i] = figure
    return out


def _opt_figures(value: Any, name: str, partitions: int) -> npt.NDArray[np.float64] | None:
    return None if value is None else _figures(value, name, partitions)


def _key(value: Any, name: str) -> Key:
    """A JSON scalar key, checked (a str at most :data:`MAX_TEXT_CHARS` long, a 64-bit int,
    a finite float)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(value, name, limit=MAX_TEXT_CHARS)
    if isinstance(value, int):
        if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
            raise InvalidArgumentError(f"{name} must be a 64-bit integer, got "
                                       f"{short_repr(value)}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentError(f"{name} must be finite, got {value!r}")
        return value
    raise InvalidArgumentTypeError(
        f"{name} must be a JSON scalar (str, int, float, bool or null), got "
        f"{type(value).__name__}")


def key_text(key: Key, limit: int = 80) -> str:
    """A key as the page shows it: a str as it is, any other key as JSON, cut to ``limit``.
    O(len(key)).

    Examples
    --------
    >>> key_text("u1"), key_text(17), key_text(None), key_text(True)
    ('u1', '17', 'null', 'true')
    """
    if isinstance(key, str):
        text = key
    elif key is None:
        text = "null"
    elif isinstance(key, bool):
        text = "true" if key else "false"
    else:
        text = repr(key)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _hot_keys(value: Any, partitions: int) -> tuple[tuple[Key, float, int], ...]:
    out = []
    for i, item in enumerate(_list(value, "record.hot_keys", MAX_HOT_KEYS)):
        name = f"record.hot_keys[{i}]"
        entry = _list(item, name, 3)
        if len(entry) != 3:
            raise InvalidArgumentError(f"{name} must be [key, rows, partition], got "
                                       f"{len(entry)} entries")
        key = _key(entry[0], f"{name} key")
        rows = _real(entry[1], f"{name} rows")
        partition = _int(entry[2], f"{name} partition", 0, partitions - 1)
        out.append((key, rows, partition))
    return tuple(out)


def _sample(value: Any) -> dict[Key, float]:
    sample = _mapping(value, "record.sample")
    keys = _list(sample.get("keys"), "record.sample.keys", MAX_SAMPLE_KEYS)
    weights = _list(sample.get("weights"), "record.sample.weights", MAX_SAMPLE_KEYS)
    if len(keys) != len(weights):
        raise InvalidArgumentError(
            f"record.sample holds {len(keys)} keys and {len(weights)} weights; give one "
            "weight per key")
    out: dict[Key, float] = {}
    for i, (key, weight) in enumerate(zip(keys, weights)):
        checked = _key(key, f"record.sample.keys[{i}]")
        out[checked] = out.get(checked, 0.0) + _real(weight, f"record.sample.weights[{i}]")
    return out


def _swap(value: Any) -> Swap | None:
    if value is None:
        return None
    swap = _mapping(value, "record.swap")
    complete = swap.get("complete")
    if complete is not None and not isinstance(complete, bool):
        raise InvalidArgumentTypeError(
            f"record.swap.complete must be a bool, got {type(complete).__name__}")
    return Swap(
        mode=_opt_text(swap.get("mode"), "record.swap.mode"),
        partitions_before=_opt_int(swap.get("partitions_before"),
                                   "record.swap.partitions_before", 1),
        partitions_after=_opt_int(swap.get("partitions_after"),
                                  "record.swap.partitions_after", 1),
        keys_total=_opt_int(swap.get("keys_total"), "record.swap.keys_total"),
        moved_keys=_opt_int(swap.get("moved_keys"), "record.swap.moved_keys"),
        moved_bytes=_opt_int(swap.get("moved_bytes"), "record.swap.moved_bytes"),
        seconds=_opt_real(swap.get("seconds"), "record.swap.seconds"),
        complete=complete,
        refused=_opt_text(swap.get("refused"), "record.swap.refused", limit=_SHOWN_CHARS,
                          cut=True),
    )


def _request(value: Any, name: str) -> SwapRequest:
    request = _mapping(value, name)
    request_id = _text(request.get("request_id"), f"{name}.request_id")
    if not request_id:
        raise InvalidArgumentError(f"{name}.request_id must be a non-empty str")
    return SwapRequest(
        request_id=request_id,
        strategy=_opt_text(request.get("strategy"), f"{name}.strategy"),
        num_partitions=_opt_int(request.get("num_partitions"), f"{name}.num_partitions", 1),
        mode=_opt_text(request.get("mode"), f"{name}.mode"),
    )


def _rebalance(value: Any) -> Rebalance | None:
    if value is None:
        return None
    rebalance = _mapping(value, "record.rebalance")
    return Rebalance(
        reason=_text(rebalance.get("reason", ""), "record.rebalance.reason",
                     limit=_SHOWN_CHARS, cut=True),
        moves=_opt_int(rebalance.get("moves"), "record.rebalance.moves"))


def parse_record(record: Any) -> BatchRecord:
    """Check one history record and return it as a :class:`BatchRecord`.

    Parameters
    ----------
    record : mapping
        The record (format ``"v": 1``): ``batch``, ``time``, ``seconds``, ``strategy``,
        ``partitions`` and ``rows`` are required; ``task_ms``, ``late``, ``late_partition``,
        ``hot_keys``, ``sample``, ``swap``, ``request``, ``rebalance`` may be missing or null;
        ``run`` (added by the feed) defaults to :data:`DEFAULT_RUN`.

    Returns
    -------
    BatchRecord

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError
        A field of the wrong type, out of range, a per-partition list whose length is not
        ``partitions``, a list beyond its limit (:data:`MAX_RECORD_PARTITIONS`,
        :data:`MAX_HOT_KEYS`, :data:`MAX_SAMPLE_KEYS`), a key that is not a JSON scalar, a
        text beyond :data:`MAX_TEXT_CHARS`; the message names the field.

    Notes
    -----
    Cost: O(partitions + hot keys + sample keys).

    Examples
    --------
    >>> r = parse_record({"v": 1, "batch": 0, "time": 1.0, "seconds": 0.1, "strategy": "hash",
    ...                   "partitions": 1, "rows": [5], "hot_keys": [["a", 5, 0]]})
    >>> r.hot_keys
    (('a', 5.0, 0),)
    """
    rec = _mapping(record, "record")
    version = rec.get("v")
    if version != RECORD_VERSION or isinstance(version, bool):
        raise InvalidArgumentError(
            f"record.v must be {RECORD_VERSION} (the record format this dashboard reads), got "
            f"{short_repr(version)}")
    batch = _int(rec.get("batch"), "record.batch")
    time = _real(rec.get("time"), "record.time", low=None)
    seconds = _real(rec.get("seconds"), "record.seconds")
    strategy = _text(rec.get("strategy"), "record.strategy")
    partitions = _int(rec.get("partitions"), "record.partitions", 1, MAX_RECORD_PARTITIONS)
    sample = rec.get("sample")
    request = rec.get("request")
    return BatchRecord(
        run=_run(rec.get("run", DEFAULT_RUN), "record.run"),
        batch=batch,
        time=time,
        seconds=seconds,
        strategy=strategy,
        partitions=partitions,
        rows=_figures(rec.get("rows"), "record.rows", partitions),
        task_ms=_opt_figures(rec.get("task_ms"), "record.task_ms", partitions),
        late=_opt_figures(rec.get("late"), "record.late", partitions),
        late_partition=_opt_figures(rec.get("late_partition"), "record.late_partition",
                                    partitions),
        hot_keys=_hot_keys(rec.get("hot_keys") or [], partitions),
        sample=None if sample is None else _sample(sample),
        swap=_swap(rec.get("swap")),
        request=None if request is None else _request(request, "record.request"),
        rebalance=_rebalance(rec.get("rebalance")),
    )


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
    ev = _mapping(event, "event")
    kind = choice(ev.get("kind"), "event.kind", ("request", "advice", "progress"))
    time = _real(ev.get("time"), "event.time", low=None)
    run = ev.get("run")
    run_name = None if run is None else _run(run, "event.run")
    if kind == "request":
        return RequestEvent(time=time, request=_request(ev, "event"), run=run_name)
    if kind == "advice":
        return AdviceEvent(
            time=time,
            batch=_opt_int(ev.get("batch"), "event.batch"),
            source=choice(ev.get("source"), "event.source", ADVICE_SOURCES),
            advice=_text(ev.get("advice"), "event.advice", limit=_SHOWN_CHARS, cut=True),
            reason=_text(ev.get("reason", ""), "event.reason", limit=_SHOWN_CHARS, cut=True),
            run=run_name)
    query = ev.get("query")
    return ProgressEvent(
        time=time,
        batch=_int(ev.get("batch"), "event.batch"),
        query=_text(query if not isinstance(query, int) or isinstance(query, bool)
                    else str(query), "event.query"),
        input_rows=_real(ev.get("input_rows"), "event.input_rows"),
        duration_ms=_real(ev.get("duration_ms"), "event.duration_ms"))
