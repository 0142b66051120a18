"""What a ``StreamingQueryProgress`` says about rates and backlog, read once, checked.

Spark reports each micro-batch of a Structured Streaming query as a ``StreamingQueryProgress``
(``query.lastProgress``, a listener's ``onQueryProgress``, or the JSON lines a user saved).
The advisors read the same few figures from it; this module is the one place that parses
them, from the object, a dict or its JSON, and refuses anything else with a typed error.

Backlog: for a source whose ``endOffset`` and ``latestOffset`` are Kafka-style JSON
(``{"topic": {"0": 120, "1": 98}}``), the rows still waiting are the sum of
``latest - end`` over partitions; other sources report none.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._internal.validation import INT64_MAX
from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["BatchProgress", "parse_progress", "MAX_PROGRESS_BYTES", "MAX_DURATION_MS", "RATE_CAP",
           "clip_rate"]

logger = logging.getLogger(__name__)

#: Largest progress JSON accepted (a progress event is a few KB).
MAX_PROGRESS_BYTES = 16 * 1024 * 1024
#: Spark counts batches, rows and offsets in 64-bit ``Long`` s: larger integers are refused
#: (batch id, row count) or make a source's backlog unknown (offsets).
_LONG_MAX = INT64_MAX
#: Largest rate (rows/s) the advisors work with: a figure beyond it (a batch timed at 1e-300
#: ms, a corrupt ``inputRowsPerSecond`` of 1e308) is taken as this, so that the flow network,
#: DS2, the reports and the advice stay finite. No real query comes within orders of magnitude.
RATE_CAP = 1e15
#: Longest ``durationMs`` entry accepted: a year, in milliseconds. Spark times each phase of a
#: micro-batch in ``Long`` milliseconds; a figure beyond a year is a corrupt event, refused by
#: name (an ``1e308`` would make every rate derived from it 0 and every sizing infinite).
MAX_DURATION_MS = 365.25 * 24 * 3600 * 1000


def clip_rate(value: float) -> float:
    """A measured rate clipped to ``[0, RATE_CAP]`` (NaN and negatives count 0). O(1).

    Examples
    --------
    >>> clip_rate(1e308), clip_rate(float("nan")), clip_rate(42.0)
    (1000000000000000.0, 0.0, 42.0)
    """
    return min(value, RATE_CAP) if value > 0 else 0.0


@dataclass(frozen=True)
class BatchProgress:
    """The figures of one micro-batch's progress the advisors use.

    Attributes
    ----------
    batch_id : int
    timestamp : str
        When the trigger started (ISO 8601, as Spark writes it).
    input_rows : int
        Rows read by the batch.
    input_rate : float
        ``inputRowsPerSecond``: rows arriving per second (the offered load).
    processed_rate : float
        ``processedRowsPerSecond``: rows processed per second of the batch.
    duration_ms : float
        ``durationMs.triggerExecution``: the whole batch.
    durations_ms : dict of str to float
        Every ``durationMs`` entry (``addBatch``, ``getBatch``, ``queryPlanning``, ...).
    backlog_rows : int or None
        Rows offered but not read yet (``latestOffset - endOffset``), when the sources say.
    """

    batch_id: int
    timestamp: str
    input_rows: int
    input_rate: float
    processed_rate: float
    duration_ms: float
    durations_ms: dict[str, float]
    backlog_rows: int | None


class _NamedTwice(Exception):
    """A JSON object of a progress event that names a field twice."""


def _one_value_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a field named twice (``json`` keeps the last)."""
    out = dict(pairs)
    if len(out) < len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _NamedTwice(name)
            seen.add(name)
    return out


class _ManyDigits:
    """A JSON integer longer than Python converts (``sys.get_int_max_str_digits``): far
    beyond any ``Long`` of Spark, kept as its length so that the field is named."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def _integer(text: str) -> int | _ManyDigits:
    limit = sys.get_int_max_str_digits()
    digits = len(text.lstrip("-"))
    return _ManyDigits(digits) if limit and digits > limit else int(text)


def _field_number(value: Any, name: str, default: float = 0.0, *, high: float = math.inf,
                  unit: str = "", nan: bool = True) -> float:
    """A number field of a progress event: ``default`` when absent (``None``), or NaN where
    ``nan`` (Spark writes NaN rates for an empty first batch), else finite, >= 0 and <=
    ``high``. A parser of the event's JSON, not an argument check: its errors name the
    progress field and the range allowed."""
    allowed = "finite and >= 0" if high == math.inf else f"in [0, {high:.0f}]{unit}"
    if value is None:
        return default
    if isinstance(value, _ManyDigits):
        raise InvalidArgumentError(f"progress field {name:.80} must be {allowed}, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(
            f"progress field {name:.80} must be a number {allowed}, got {value!r:.60}")
    try:
        out = float(value)
    except OverflowError:  # an int of hundreds of digits
        raise InvalidArgumentError(
            f"progress field {name:.80} must be {allowed}, got an integer of "
            f"{value.bit_length() if isinstance(value, int) else '?'} bits") from None
    if math.isnan(out) and nan:  # Spark writes NaN rates for an empty first batch
        return default
    if not (math.isfinite(out) and 0 <= out <= high):  # NaN, infinities, negatives, too big
        raise InvalidArgumentError(
            f"progress field {name:.80} must be {allowed}, got {value!r:.60}")
    return out


def _rows(value: Any) -> int:
    """``numInputRows``: an exact count (a float is truncated), 0 when absent."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= _LONG_MAX:
            raise InvalidArgumentError(
                "progress field numInputRows must be an integer in [0, 2**63 - 1], got "
                f"{'a negative number' if value < 0 else 'a larger one'}")
        return value
    rows = _field_number(value, "numInputRows", nan=False)
    if rows > _LONG_MAX:
        raise InvalidArgumentError(
            f"progress field numInputRows must be in [0, 2**63 - 1], got {rows!r}")
    return int(rows)


def _sources(sources: Any) -> list[Mapping[str, Any]]:
    return [s for s in sources if isinstance(s, Mapping)] if isinstance(sources, list) else []


def _source_rows(sources: Any) -> int:
    """``numInputRows`` summed over the sources: the progress of a Spark Connect query
    (``query.lastProgress.json`` there) carries the figures per source only, as Spark's
    ``StreamingQueryProgress.numInputRows`` sums them. 0 without sources."""
    total = sum(_rows(s.get("numInputRows")) for s in _sources(sources))
    if total > _LONG_MAX:
        raise InvalidArgumentError(
            "progress field sources[].numInputRows must sum to at most 2**63 - 1, got a "
            "larger sum")
    return total


def _rate(data: Mapping[str, Any], name: str) -> float:
    """A rate of the event, else (absent, as in a Spark Connect progress) the sum of its
    sources' rates, as Spark's ``StreamingQueryProgress`` computes it."""
    if data.get(name) is not None:
        return _field_number(data.get(name), name)
    return sum(min(_field_number(s.get(name), f"sources[].{name}"), RATE_CAP)
               for s in _sources(data.get("sources")))


def _offsets(value: Any) -> dict[tuple[str, str], int] | None:
    """Kafka-style offsets ``{topic: {partition: offset}}`` (or their JSON), else None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if not isinstance(value, Mapping):
        return None
    out: dict[tuple[str, str], int] = {}
    for topic, parts in value.items():
        if not isinstance(parts, Mapping):
            return None
        for part, offset in parts.items():
            if isinstance(offset, bool) or not isinstance(offset, int):
                return None
            if not -_LONG_MAX - 1 <= offset <= _LONG_MAX:
                logger.debug("offset of %s/%s is beyond 64 bits: backlog unknown", topic, part)
                return None
            out[(str(topic), str(part))] = offset
    return out


def _backlog(sources: Any) -> int | None:
    if not isinstance(sources, list):
        return None
    total = 0
    known = False
    for source in sources:
        if not isinstance(source, Mapping):
            continue
        end = _offsets(source.get("endOffset"))
        latest = _offsets(source.get("latestOffset"))
        if end is None or latest is None:
            continue
        known = True
        total += sum(max(0, latest[k] - end.get(k, latest[k])) for k in latest)
    return total if known else None


def parse_progress(progress: Any) -> BatchProgress:
    """The advisors' figures of one progress event.

    Parameters
    ----------
    progress : StreamingQueryProgress, dict or str
        ``query.lastProgress``, a listener event's ``progress``, its ``json`` or a parsed dict.

    Returns
    -------
    BatchProgress

    Raises
    ------
    InvalidArgumentTypeError
        Not a progress object, a mapping or a string.
    InvalidArgumentError
        JSON that does not parse (or is larger than :data:`MAX_PROGRESS_BYTES`), no
        ``batchId`` (an integer in ``[0, 2**63 - 1]``), a row count outside that range or NaN,
        a ``durationMs`` entry outside ``[0, MAX_DURATION_MS]`` (NaN included), or a rate
        that is negative, infinite or too large for a float; each message names the field.
        NaN rates (an empty batch) count 0, and rates above :data:`RATE_CAP` are taken as
        it by the advisors. Offsets beyond 64 bits make the backlog unknown (``None``). An
        object naming a field twice is refused (Spark writes each once); an integer longer
        than Python converts (``sys.get_int_max_str_digits()``) is refused naming its field.
        A UTF-8 byte order mark before the JSON is skipped. ``numInputRows`` and the rates,
        when absent (a Spark Connect query's progress carries them per source only), are the
        sums over ``sources``, as Spark's ``StreamingQueryProgress`` computes them.

    Notes
    -----
    O(size of the event). JSON only: nothing is evaluated or unpickled.

    Examples
    --------
    >>> p = parse_progress('{"batchId": 3, "numInputRows": 500, "inputRowsPerSecond": 100.0,'
    ...                    ' "processedRowsPerSecond": 250.0, "durationMs": {"triggerExecution": 2000}}')
    >>> p.batch_id, p.input_rate, p.duration_ms
    (3, 100.0, 2000.0)
    """
    data: Any = progress
    text = getattr(progress, "json", None)
    if not isinstance(progress, Mapping) and isinstance(text, str):
        data = text  # a progress object that is not a dict (older PySpark)
    if isinstance(data, (bytes, bytearray)):
        if len(data) > MAX_PROGRESS_BYTES:
            raise InvalidArgumentError(
                f"progress JSON of {len(data)} bytes is larger than {MAX_PROGRESS_BYTES}")
        data = bytes(data).decode("utf-8", errors="replace")
    if isinstance(data, str):
        if len(data) > MAX_PROGRESS_BYTES:
            raise InvalidArgumentError(
                f"progress JSON of {len(data)} characters is larger than {MAX_PROGRESS_BYTES}")
        try:
            data = json.loads(data.removeprefix("\ufeff"), object_pairs_hook=_one_value_each,
                              parse_int=_integer)
        except _NamedTwice as err:
            raise InvalidArgumentError(
                f"progress names field {str(err)[:80]!r} twice in one object; Spark writes each "
                "once, and which value counts would be a guess") from None
        except (ValueError, RecursionError) as err:
            raise InvalidArgumentError(f"progress is not JSON ({str(err)[:80]})") from None
    if not isinstance(data, Mapping):
        what = (f"JSON of a {type(data).__name__}" if data is not progress
                else type(progress).__name__)
        raise InvalidArgumentTypeError(
            f"progress must be a StreamingQueryProgress, a dict or its JSON object, got {what}")
    batch = data.get("batchId")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 0 <= batch <= _LONG_MAX:
        shown = (repr(batch)[:40] if not isinstance(batch, int) or batch.bit_length() < 200
                 else f"an integer of {batch.bit_length()} bits")
        raise InvalidArgumentError(
            f"progress has no valid batchId: an integer in [0, 2**63 - 1] is required, got "
            f"{shown}")
    durations_raw = data.get("durationMs") or {}
    if not isinstance(durations_raw, Mapping):
        raise InvalidArgumentError("progress field durationMs must be an object")
    durations = {str(k): _field_number(v, f"durationMs.{k}", high=MAX_DURATION_MS, unit=" ms "
                                       "(a year)", nan=False)
                 for k, v in durations_raw.items()}
    sources = data.get("sources")
    rows = _rows(data.get("numInputRows")) if data.get("numInputRows") is not None else \
        _source_rows(sources)
    stamp = data.get("timestamp")
    return BatchProgress(
        batch_id=batch,
        timestamp=stamp[:64] if isinstance(stamp, str) else "",
        input_rows=rows,
        input_rate=_rate(data, "inputRowsPerSecond"),
        processed_rate=_rate(data, "processedRowsPerSecond"),
        duration_ms=durations.get("triggerExecution", 0.0),
        durations_ms=durations,
        backlog_rows=_backlog(sources),
    )
