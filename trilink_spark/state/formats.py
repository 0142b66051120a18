"""The JSON files of the keyed state store: what each holds, and how it is checked when read.

A :class:`~trilink_spark.state.KeyedStateStore` keeps these JSON files beside its Arrow
state versions (its module docstring has the layout): the manifest, the placement records,
the swap plans and small records such as a stored swap request or a batch's history record.
This module turns each into bytes and back, with no I/O: the store reads and writes the bytes.
It also holds the one check of a history record's fields (:func:`check_history_record`), which
the run that writes one, the reader of a state path and the dashboard call.

Every one is written the same way: a JSON object sealed with a checksum
(:func:`~trilink_spark._internal.io.sealed.seal`: ``trilink.sealed`` and
``trilink.checksum``, a CRC-32 of its canonical JSON), so a byte damaged after it was written
is refused with :class:`~trilink_spark.errors.StateCorruptError` naming the file, never read
as another value. The manifest, placement records and plans of releases before the seal are
still read (unchecked); a small record was never written without it, so an unsealed one is
refused.

Examples
--------
>>> import trilink_spark as tl
>>> data = placement_bytes(tl.HashPartitioner(4, key_type="int"), 4, "int")
>>> strategy, partitions, key_type = parse_placement(data, "placements/0.json")
>>> partitions, key_type
(4, 'int')
"""

from __future__ import annotations

import json
import logging
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from .._internal.deprecation import warn_moved
from .._internal.io.sealed import SEALED_KEY, seal, unseal
from .._internal.validation import (INT64_MAX, MAX_KEY_TEXT_CHARS, JsonKey, check_key, choice,
                                    count, is_count, number, short_repr, text)
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from ..partitioners import Partitioner
from ..partitioners.core.base import KEY_KINDS

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "MAX_RECORD_BYTES", "RECORD_FORMAT",
           "PLAN_FIELDS", "dump", "manifest_bytes", "parse_manifest", "placement_bytes",
           "parse_placement", "plan_bytes", "parse_plan", "record_bytes", "parse_small_record",
           "is_count", "parse_timing", "TIMING_SUFFIX", "MAX_TIMING_BYTES", "segment_index",
           "SEGMENT_INDEX", "MAX_PROFILE_KEYS", "MAX_PROFILE_KEY_CHARS", "HISTORY_VERSION",
           "MAX_HISTORY_PARTITIONS", "MAX_HOT_KEYS", "MAX_SAMPLE_KEYS", "MAX_NAME_CHARS",
           "MAX_TEXT_CHARS", "HISTORY_FIELDS", "check_history_record", "check_swap_request",
           "TABLES_FORMAT", "TABLES_VERSION", "MAX_TABLE_FILES", "tables_bytes", "parse_tables",
           "valid_table_files", "TASK_PHASES"]

MANIFEST_FORMAT = "trilink-keyed-state-manifest"
MANIFEST_VERSION = 1
#: Format tag of a small record (:func:`record_bytes`).
RECORD_FORMAT = "trilink-state-record"
#: Largest small record :func:`parse_small_record` reads (the store reads at most one byte more).
MAX_RECORD_BYTES = 1024 * 1024
#: Suffix of the file beside a state version holding what the task that wrote it measured of
#: its own work: JSON ``{"rows": int, "process_ms": float, "block_rows": {"blocks": [...],
#: "rows": [...]} or absent}``.
TIMING_SUFFIX = ".timing.json"
#: The steps of a task on the executor-local store, each timed in its timing record
#: (``phases_ms``): open (or take over) the local copy and bring it to the batch's version,
#: read the touched keys' state, run the processor's hooks, write the changes (log, copy
#: and commit).
TASK_PHASES: tuple[str, ...] = ("sync", "read", "hooks", "write")
#: Largest timing record read back (a block placement of 2**20 blocks fits).
MAX_TIMING_BYTES = 32 * 1024 * 1024
#: Schema metadata key of a segment file: JSON [[destination, rows], ...], one per batch.
SEGMENT_INDEX = b"trilink.segment_index"

logger = logging.getLogger(__name__)


def dump(body: Mapping[str, Any]) -> bytes:
    """``body`` as the store writes every JSON file: sealed with its checksum, keys sorted,
    UTF-8. O(size of the body).

    Raises
    ------
    InvalidArgumentTypeError
        ``body`` holds a value JSON cannot write.
    """
    return json.dumps(seal(body), sort_keys=True).encode("utf-8")


# ---------------------------------------------------------------------- manifest
def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """The manifest ``manifest`` as written, tagged with its format and version."""
    return dump({**manifest, "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION})


def parse_manifest(data: bytes, path: str) -> dict[str, Any]:
    """The manifest stored as ``data`` (at ``path``, for messages). O(its size).

    Raises
    ------
    StateCorruptError
        Not JSON, failing its checksum, not a manifest of this store, of another version,
        or with malformed committed or placements lists.
    """
    try:
        manifest = unseal(json.loads(data.decode("utf-8")), path)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        if isinstance(err, StateCorruptError):
            raise
        raise StateCorruptError(f"{path} is not JSON; it is not this store's manifest") \
            from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise StateCorruptError(f"{path} is not a trilink-spark keyed state manifest")
    if manifest.get("version") != MANIFEST_VERSION:
        raise StateCorruptError(
            f"{path} has manifest version {manifest.get('version')!r}; this trilink-spark "
            f"reads version {MANIFEST_VERSION}")
    committed = manifest.get("committed", [])
    placements = manifest.get("placements", [])
    if not (isinstance(committed, list) and all(is_count(c, 0) for c in committed)
            and isinstance(placements, list)
            and all(is_count(p, 0) for p in placements)):
        raise StateCorruptError(f"{path} has malformed committed or placements lists")
    return manifest


# ---------------------------------------------------------------------- placements
def placement_bytes(strategy: Partitioner | None, partitions: int,
                    key_type: str | None = None) -> bytes:
    """A placement record: the strategy (None: input partitions), its partition count, and
    ``key_type``, the kind of the key column the state is placed by (``"int"`` for tinyint,
    smallint and int, ``"long"``, ``"string"``, ``"binary"``; None: not recorded).
    O(the strategy's size).

    Raises
    ------
    InvalidArgumentError
        ``key_type`` is not one of those (nor None).
    InvalidArgumentTypeError
        ``key_type`` is not a str (nor None).
    """
    body: dict[str, Any] = {"partitions": int(partitions),
                            "strategy": None if strategy is None else strategy.to_dict()}
    if key_type is not None:
        body["key_type"] = choice(key_type, "key_type", KEY_KINDS, also=" or None")
    return dump(body)


def parse_placement(data: bytes, path: str) -> tuple[Partitioner | None, int, str | None]:
    """The placement record stored as ``data``: (strategy or None, partition count, key
    type; None in a record written before key types were recorded, and for a placement by
    input partitions). O(its size), a table strategy's table included.

    Raises
    ------
    StateCorruptError
        Not JSON, failing its checksum, not a placement, or inconsistent (naming ``path``
        and the field).
    """
    try:
        body = unseal(json.loads(data.decode("utf-8")), path)
        strategy = None if body["strategy"] is None else Partitioner.from_dict(body["strategy"])
        partitions = body["partitions"]
        key_type = body.get("key_type")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError,
            RecursionError) as err:
        if isinstance(err, StateCorruptError):
            raise
        raise StateCorruptError(
            f"{path} is not a placement record ({type(err).__name__}: {err})") from None
    if not is_count(partitions, 1):
        raise StateCorruptError(
            f"{path} has partitions={partitions!r}; a placement record holds an int >= 1")
    if strategy is not None and strategy.num_partitions != partitions:
        raise StateCorruptError(
            f"{path} records {partitions} partitions but its strategy places on "
            f"{strategy.num_partitions}; the record is inconsistent")
    if key_type is not None:
        choice(key_type, f"{path}: its key_type", KEY_KINDS, also=" (or none)",
               error=StateCorruptError, type_error=StateCorruptError)
    return strategy, int(partitions), key_type


# ---------------------------------------------------------------------- swap plans
#: What each field of a stored swap plan must be (checked by :func:`parse_plan`).
PLAN_FIELDS: dict[str, Callable[[Any], bool]] = {
    "prev": lambda v: is_count(v, 0),
    "mode": lambda v: isinstance(v, str),
    "partitions_before": lambda v: is_count(v, 1),
    "partitions_after": lambda v: is_count(v, 1),
    "keys_total": lambda v: is_count(v, 0),
    "moved_keys": lambda v: is_count(v, 0),
    "complete": lambda v: isinstance(v, bool),
    "placement": lambda v: isinstance(v, dict),
    "target": lambda v: isinstance(v, dict),
    # None for a sync swap; a resumed fluid swap moves this many keys per batch (0 would
    # never finish, a str fails in the planner)
    "max_keys_per_batch": lambda v: v is None or is_count(v, 1),
    # the request_swap call the plan carries out (None: the runner's own swap, or older plans)
    "request": lambda v: v is None or (isinstance(v, str) and 0 < len(v) <= 64),
    # the counters of the partitions the swap removes, which partition 0 takes over
    "carried_counters": lambda v: v is None or (isinstance(v, dict) and all(
        isinstance(k, str) and is_count(c, 0) for k, c in v.items())),
}


def plan_bytes(plan: Mapping[str, Any]) -> bytes:
    """A swap plan as written. O(its size)."""
    return dump(plan)


def parse_plan(data: bytes, path: str, batch: int) -> dict[str, Any]:
    """The swap plan of ``batch`` stored as ``data``, every field checked
    (:data:`PLAN_FIELDS`) and its two strategies rebuilt once. O(its size).

    Raises
    ------
    StateCorruptError
        Not JSON, failing its checksum, another batch's, incomplete or malformed.
    """
    try:
        plan = unseal(json.loads(data.decode("utf-8")), path)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        if isinstance(err, StateCorruptError):
            raise
        raise StateCorruptError(f"{path} is not a swap plan") from None
    if not isinstance(plan, dict) or not is_count(plan.get("batch_id"), 0) \
            or plan["batch_id"] != batch:
        raise StateCorruptError(f"{path} is not the swap plan of batch {batch}")
    problems = [name for name, ok in PLAN_FIELDS.items() if not ok(plan.get(name))]
    if problems:
        raise StateCorruptError(
            f"{path} is an incomplete or malformed swap plan (bad or missing: "
            f"{', '.join(problems)}); it is not a plan this release wrote")
    for name in ("placement", "target"):  # the runner rebuilds both: refuse them here
        try:
            Partitioner.from_dict(plan[name])
        except (ValueError, TypeError, KeyError, RecursionError) as err:
            raise StateCorruptError(
                f"{path}: its {name} is not a stored strategy ({type(err).__name__}: "
                f"{err})") from None
    return plan


# ---------------------------------------------------------------------- small records
def record_bytes(name: str, body: Mapping[str, Any]) -> bytes:
    """The small record ``name`` holding ``body``, as written. O(size of the body).

    Raises
    ------
    InvalidArgumentError
        ``body`` is not JSON (NaN and infinities included) or is over
        :data:`MAX_RECORD_BYTES`.
    """
    try:
        plain = json.loads(json.dumps(dict(body), allow_nan=False))
    except (TypeError, ValueError) as err:
        raise InvalidArgumentError(f"record {name!r} is not JSON ({err})") from None
    data = dump({"format": RECORD_FORMAT, "name": name, "body": plain})
    if len(data) > MAX_RECORD_BYTES:
        raise InvalidArgumentError(
            f"record {name!r} takes {len(data):,} bytes; at most {MAX_RECORD_BYTES:,}")
    return data


def parse_small_record(data: bytes, name: str, path: str) -> dict[str, Any]:
    """The body of the small record ``name`` stored as ``data``: its envelope (format, name,
    seal) checked, not what the body holds (a history record's fields are
    :func:`check_history_record`'s). O(its size).

    Raises
    ------
    StateCorruptError
        Too large, not JSON, not sealed, failing its checksum (a torn or edited file), not a
        record of this store, or another record; the message names ``path`` and says to
        delete the file to drop what it records.
    """
    problem = "it is larger than a record" if len(data) > MAX_RECORD_BYTES else None
    doc: Any = None
    if problem is None:
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            problem = "it is not JSON"
    if problem is None and (not isinstance(doc, dict) or SEALED_KEY not in doc):
        problem = "it is not sealed (records are written with their checksum)"
    if problem is None:
        try:
            doc = unseal(doc, path)
        except StateCorruptError as err:
            problem = str(err).removeprefix(f"{path} ")
    if problem is None and (doc.get("format") != RECORD_FORMAT or doc.get("name") != name
                            or not isinstance(doc.get("body"), dict)):
        problem = f"it is not a {name} record of this store"
    if problem is not None:
        raise StateCorruptError(f"{path}: {problem}; delete the file to drop what it records")
    out: dict[str, Any] = doc["body"]
    return out


def parse_timing(raw: bytes, where: str) -> dict[str, Any] | None:
    """A task's timing record (JSON, at most :data:`MAX_TIMING_BYTES`), checked field by
    field; None (and a warning naming ``where``) for anything else."""
    if len(raw) > MAX_TIMING_BYTES:
        logger.warning("%s: timing record of %d bytes ignored (at most %d)", where, len(raw),
                       MAX_TIMING_BYTES)
        return None
    try:
        value = unseal(json.loads(raw.decode("utf-8")), where)
    except StateCorruptError as err:
        logger.warning("%s; ignored", err)
        return None
    except (UnicodeDecodeError, ValueError, RecursionError):
        logger.warning("%s: timing record is not JSON; ignored", where)
        return None
    ok = (isinstance(value, dict) and _is_timed_count(value.get("rows"), 0)
          and _is_milliseconds(value.get("process_ms")))
    blocks = value.get("block_rows") if isinstance(value, dict) else None
    if ok and blocks is not None:
        ok = (isinstance(blocks, dict) and isinstance(blocks.get("blocks"), list)
              and isinstance(blocks.get("rows"), list)
              and len(blocks["blocks"]) == len(blocks["rows"])
              and all(_is_timed_count(b, 0) for b in blocks["blocks"])
              and all(_is_timed_count(r, 1) for r in blocks["rows"]))
    sync = value.get("sync") if isinstance(value, dict) else None
    keys_read = value.get("keys_read") if isinstance(value, dict) else None
    if ok and sync is not None:
        ok = sync in ("current", "undo", "catch-up", "rebuild")
    snapshot = value.get("snapshot") if isinstance(value, dict) else None
    if ok and keys_read is not None:
        ok = _is_timed_count(keys_read, 0)
    if ok and snapshot is not None:
        ok = isinstance(snapshot, bool)
    upkeep = value.get("upkeep_ms") if isinstance(value, dict) else None
    if ok and upkeep is not None:
        ok = _is_milliseconds(upkeep)
    phases = value.get("phases_ms") if isinstance(value, dict) else None
    if ok and phases is not None:
        ok = (isinstance(phases, dict) and set(phases) == set(TASK_PHASES)
              and all(_is_milliseconds(v) for v in phases.values()))
    ran_on = {name: value.get(name) for name in ("executor", "host")
              if isinstance(value, dict) and value.get(name) is not None}
    if ok:
        # the history record keeps them as names: the same bound (MAX_NAME_CHARS)
        ok = all(isinstance(v, str) and 0 < len(v) <= MAX_NAME_CHARS for v in ran_on.values())
    late = {name: value.get(name) for name in ("late", "late_partition")
            if isinstance(value, dict) and value.get(name) is not None}
    if ok:
        ok = all(_is_timed_count(v, 0) for v in late.values())
    profile = value.get("keys") if isinstance(value, dict) else None
    if ok and profile is not None and not _is_key_profile(profile):
        # the profile only feeds the run's history: the task's own figures still count
        logger.warning("%s: key profile is not well-formed; left out", where)
        profile = None
    if not ok:
        logger.warning("%s: timing record is not well-formed; ignored", where)
        return None
    out: dict[str, Any] = {**late, **ran_on,
        "rows": int(value["rows"]), "process_ms": float(value["process_ms"]),
        "block_rows": None if blocks is None else
        {"blocks": [int(b) for b in blocks["blocks"]], "rows": [int(r) for r in blocks["rows"]]}}
    if sync is not None:
        out["sync"] = str(sync)
    if keys_read is not None:
        out["keys_read"] = int(keys_read)
    if snapshot is not None:
        out["snapshot"] = snapshot
    if upkeep is not None:
        out["upkeep_ms"] = float(upkeep)
    if phases is not None:
        out["phases_ms"] = {name: float(phases[name]) for name in TASK_PHASES}
    if profile is not None:
        out["keys"] = profile
    return out


#: At most this many keys in each list of a timing record's key profile.
MAX_PROFILE_KEYS = 1024
#: The longest key text a profile (and a history record) holds: the stored-record bound of
#: :mod:`trilink_spark._internal.validation` (a key is shown cut by its display rule), so the
#: batch's history record stays within :data:`MAX_RECORD_BYTES` however long the keys are.
MAX_PROFILE_KEY_CHARS = MAX_KEY_TEXT_CHARS


def _is_profile_key(key: object) -> bool:
    """A key as :func:`~trilink_spark.keyed.records.history.display_key` writes it
    (:func:`~trilink_spark._internal.validation.check_key` takes it)."""
    try:
        check_key(key, "key")
    except (InvalidArgumentError, InvalidArgumentTypeError):
        return False
    return True


def _is_key_profile(value: object) -> bool:
    """A task's key profile (:func:`~trilink_spark.keyed.records.history.key_profile`): ``hot`` and
    ``sample`` lists of ``[key, weight]`` (:func:`_is_profile_key`; a weight is a finite
    number >= 0 within the int64 range), and a ``keys`` count."""
    if not isinstance(value, dict) or not _is_timed_count(value.get("keys"), 0):
        return False
    for name in ("hot", "sample"):
        pairs = value.get(name)
        if not isinstance(pairs, list) or len(pairs) > MAX_PROFILE_KEYS:
            return False
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2 and _is_profile_key(pair[0])
                    and _is_milliseconds(pair[1])):
                return False
    return True


def _is_timed_count(value: object, least: int) -> bool:
    """:func:`~trilink_spark._internal.validation.is_count` within the int64 range (a timing
    record's figures fit an int64, so a forged 400-digit number is refused, never overflows a
    conversion)."""
    return is_count(value, least, INT64_MAX)


def _is_milliseconds(value: object) -> bool:
    """Whether ``value`` is a finite number of milliseconds >= 0 within the int64 range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):  # compared exactly: a 400-digit int has no float
        return 0 <= value <= INT64_MAX
    return math.isfinite(value) and 0 <= value <= INT64_MAX


def segment_index(raw: bytes | None, path: str, batches: int) -> list[tuple[int, int]]:
    """The ``[[destination, rows], ...]`` index of a segment file, checked against its
    record batches; StateCorruptError for anything else."""
    try:
        index = json.loads(raw.decode("utf-8")) if raw is not None else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        index = None
    ok = (isinstance(index, list) and len(index) == batches
          and all(isinstance(e, list) and len(e) == 2
                  and all(is_count(v, 0) for v in e)
                  for e in index)
          and len({e[0] for e in index}) == len(index))
    if not ok or index is None:
        raise StateCorruptError(
            f"{path} has no valid segment index ({SEGMENT_INDEX.decode()}: one "
            f"[destination, rows] pair per record batch, {batches} batches); it is not a "
            "segment file this release wrote")
    return [(int(d), int(r)) for d, r in index]


# ---------------------------------------------------------------------- history records
#: Version of the history record's layout (``"v"``): the one
#: :mod:`trilink_spark.keyed.records.history` writes and the dashboard reads.
HISTORY_VERSION = 1
#: Partitions a history record describes at most (a record of more would not fit the store's
#: 1 MiB record): a run on more partitions keeps no history.
MAX_HISTORY_PARTITIONS = 16_384
#: Hot keys a history record holds at most (a run's record keeps 10; the page shows 10).
MAX_HOT_KEYS = 100
#: Keys a history record's sample holds at most (a run's record keeps at most 4,096).
MAX_SAMPLE_KEYS = 20_000
#: The longest name a history record holds (a strategy, a run, a request id, a mode); a
#: longer one is refused.
MAX_NAME_CHARS = 200
#: The longest free text a history record holds (a swap's refusal, a rebalancer's reason); a
#: longer one is refused (the page shows the first few hundred characters).
MAX_TEXT_CHARS = 10_000
#: The fields of the layout, as a run writes every one of them (``complete=True`` requires
#: each; a record given to the dashboard may leave out those after ``rows``). A record may
#: also hold ``executor`` and ``sync``, one text per partition (where each task ran, what
#: its local copy needed), which records written before them lack.
HISTORY_FIELDS = ("v", "batch", "time", "seconds", "strategy", "partitions", "rows",
                  "task_ms", "late", "late_partition", "hot_keys", "sample", "swap",
                  "request", "rebalance")
_FIGURES = ("rows", "task_ms", "late", "late_partition")


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgumentTypeError(
            f"{name} must be a mapping (a JSON object), got {type(value).__name__}")
    return value


def _list(value: Any, name: str, limit: int) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise InvalidArgumentTypeError(
            f"{name} must be a list (a JSON array), got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidArgumentError(f"{name} holds {len(value):,} entries; at most {limit:,} "
                                   "are allowed")
    return value


def _int(value: Any, name: str, low: int = 0, high: int = INT64_MAX) -> int:
    return count(value, name, low, high=high, plain=True)


def _opt_int(value: Any, name: str, low: int = 0) -> int | None:
    return None if value is None else _int(value, name, low)


def _opt_real(value: Any, name: str) -> float | None:
    return None if value is None else number(value, name, low=0.0)


def _opt_name(value: Any, name: str) -> str | None:
    return None if value is None else text(value, name, MAX_NAME_CHARS)


def _figures(value: Any, name: str, partitions: int) -> list[float]:
    """One figure per partition: finite numbers >= 0, or -1 for no figure."""
    items = _list(value, name, MAX_HISTORY_PARTITIONS)
    if len(items) != partitions:
        raise InvalidArgumentError(
            f"{name} holds {len(items)} figures for {partitions} partitions; give one per "
            "partition (-1 where there is none)")
    out = []
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
        out.append(figure)
    return out


def _labels(value: Any, name: str, partitions: int) -> list[str] | None:
    """One short text per partition ("" where there is none), or None (left out: a record
    written before the field existed)."""
    if value is None:
        return None
    items = _list(value, name, MAX_HISTORY_PARTITIONS)
    if len(items) != partitions:
        raise InvalidArgumentError(
            f"{name} holds {len(items)} entries for {partitions} partitions; give one per "
            'partition ("" where there is none)')
    return [text(item, f"{name}[{i}]", MAX_NAME_CHARS) for i, item in enumerate(items)]


def _hot_keys(value: Any, partitions: int) -> list[tuple[JsonKey, float, int]]:
    out = []
    for i, item in enumerate(_list(value, "record.hot_keys", MAX_HOT_KEYS)):
        name = f"record.hot_keys[{i}]"
        entry = _list(item, name, 3)
        if len(entry) != 3:
            raise InvalidArgumentError(f"{name} must be [key, rows, partition], got "
                                       f"{len(entry)} entries")
        out.append((check_key(entry[0], f"{name} key"),
                    number(entry[1], f"{name} rows", low=0.0),
                    _int(entry[2], f"{name} partition", 0, partitions - 1)))
    return out


def _sample(value: Any) -> dict[str, list[Any]]:
    sample = _mapping(value, "record.sample")
    keys = _list(sample.get("keys"), "record.sample.keys", MAX_SAMPLE_KEYS)
    weights = _list(sample.get("weights"), "record.sample.weights", MAX_SAMPLE_KEYS)
    if len(keys) != len(weights):
        raise InvalidArgumentError(
            f"record.sample holds {len(keys)} keys and {len(weights)} weights; give one "
            "weight per key")
    return {"keys": [check_key(k, f"record.sample.keys[{i}]") for i, k in enumerate(keys)],
            "weights": [number(w, f"record.sample.weights[{i}]", low=0.0)
                        for i, w in enumerate(weights)]}


def _swap(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    swap = _mapping(value, "record.swap")
    complete = swap.get("complete")
    if complete is not None and not isinstance(complete, bool):
        raise InvalidArgumentTypeError(
            f"record.swap.complete must be a bool, got {type(complete).__name__}")
    refused = swap.get("refused")
    return {
        "mode": _opt_name(swap.get("mode"), "record.swap.mode"),
        "partitions_before": _opt_int(swap.get("partitions_before"),
                                      "record.swap.partitions_before", 1),
        "partitions_after": _opt_int(swap.get("partitions_after"),
                                     "record.swap.partitions_after", 1),
        "keys_total": _opt_int(swap.get("keys_total"), "record.swap.keys_total"),
        "moved_keys": _opt_int(swap.get("moved_keys"), "record.swap.moved_keys"),
        "moved_bytes": _opt_int(swap.get("moved_bytes"), "record.swap.moved_bytes"),
        "seconds": _opt_real(swap.get("seconds"), "record.swap.seconds"),
        "complete": complete,
        "refused": None if refused is None else text(refused, "record.swap.refused",
                                                     MAX_TEXT_CHARS)}


def check_swap_request(value: Any, name: str) -> dict[str, Any]:
    """A swap request as a history record (``record.request``) or a dashboard event holds it:
    ``request_id`` (a non-empty name), and ``strategy``, ``num_partitions`` (>= 1) and
    ``mode``, each optional. Returns those four fields, checked. O(1).

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError
        A field of the wrong type or out of range; the message names it (``name.field``).

    Examples
    --------
    >>> check_swap_request({"request_id": "r1", "strategy": "hash"}, "event")
    {'request_id': 'r1', 'strategy': 'hash', 'num_partitions': None, 'mode': None}
    """
    request = _mapping(value, name)
    return {
        "request_id": text(request.get("request_id"), f"{name}.request_id", MAX_NAME_CHARS,
                           empty=False),
        "strategy": _opt_name(request.get("strategy"), f"{name}.strategy"),
        "num_partitions": _opt_int(request.get("num_partitions"), f"{name}.num_partitions", 1),
        "mode": _opt_name(request.get("mode"), f"{name}.mode")}


def _rebalance(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    rebalance = _mapping(value, "record.rebalance")
    return {"reason": text(rebalance.get("reason", ""), "record.rebalance.reason",
                           MAX_TEXT_CHARS),
            "moves": _opt_int(rebalance.get("moves"), "record.rebalance.moves")}


def _checked_history(record: Any, complete: bool) -> dict[str, Any]:
    rec = _mapping(record, "record")
    if complete:
        missing = [name for name in HISTORY_FIELDS if name not in rec]
        if missing:
            raise InvalidArgumentError(
                f"record lacks {', '.join(missing)} (a run's record holds every field of "
                f"version {HISTORY_VERSION})")
    version = rec.get("v")
    if version != HISTORY_VERSION or isinstance(version, bool):
        raise InvalidArgumentError(
            f"record.v must be {HISTORY_VERSION} (the layout this release reads), got "
            f"{short_repr(version)}")
    batch = _int(rec.get("batch"), "record.batch")
    time = number(rec.get("time"), "record.time")
    seconds = number(rec.get("seconds"), "record.seconds", low=0.0)
    strategy = text(rec.get("strategy"), "record.strategy", MAX_NAME_CHARS)
    partitions = _int(rec.get("partitions"), "record.partitions", 1, MAX_HISTORY_PARTITIONS)
    run = rec.get("run")
    sample = rec.get("sample")
    request = rec.get("request")
    return {
        "v": HISTORY_VERSION, "batch": batch, "time": time, "seconds": seconds,
        "strategy": strategy, "partitions": partitions,
        "run": None if run is None else text(run, "record.run", MAX_NAME_CHARS, empty=False),
        "rows": _figures(rec.get("rows"), "record.rows", partitions),
        **{name: None if rec.get(name) is None else
           _figures(rec.get(name), f"record.{name}", partitions) for name in _FIGURES[1:]},
        "executor": _labels(rec.get("executor"), "record.executor", partitions),
        "sync": _labels(rec.get("sync"), "record.sync", partitions),
        "hot_keys": _hot_keys(rec.get("hot_keys") or [], partitions),
        "sample": None if sample is None else _sample(sample),
        "swap": _swap(rec.get("swap")),
        "request": None if request is None else check_swap_request(request, "record.request"),
        "rebalance": _rebalance(rec.get("rebalance")),
    }


def check_history_record(record: Any, where: str | None = None, *,
                         complete: bool = False) -> dict[str, Any]:
    """The one check of a history record: its fields, their types and the bounds of the
    view (:data:`MAX_HISTORY_PARTITIONS`, :data:`MAX_HOT_KEYS`, :data:`MAX_SAMPLE_KEYS`,
    keys as :func:`~trilink_spark._internal.validation.check_key` takes them, names up to
    :data:`MAX_NAME_CHARS`, texts up to :data:`MAX_TEXT_CHARS`).

    The run that writes a record checks it before it writes it, the reader of a state path
    when it reads it, and the dashboard when it is given one: a record one of them takes,
    the others take.

    Parameters
    ----------
    record : mapping
        The record (layout ``"v": 1``, fields :data:`HISTORY_FIELDS`): ``batch``, ``time``,
        ``seconds``, ``strategy``, ``partitions`` and ``rows`` are required; the others may be
        missing or null unless ``complete``. ``run`` (a name the dashboard adds) is checked
        when present.
    where : str, optional
        The file the record was read from. Given, a record that fails is a
        :class:`~trilink_spark.errors.StateCorruptError` naming it; None (a record passed as
        an argument): an :class:`~trilink_spark.errors.InvalidArgumentError` or
        :class:`~trilink_spark.errors.InvalidArgumentTypeError`.
    complete : bool
        Require every field of :data:`HISTORY_FIELDS` (what a run writes; a null is allowed
        where the layout allows one).

    Returns
    -------
    dict
        Every field of the layout and ``run`` (None where left out), checked: figures as
        lists of floats (``-1``: no figure), ``hot_keys`` as ``(key, rows, partition)``
        tuples, ``sample`` as ``{"keys", "weights"}`` lists, and ``swap``, ``request``
        (:func:`check_swap_request`) and ``rebalance`` holding the fields the layout gives
        them (others are left out).

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError
        Without ``where``: a field missing (``complete``), of the wrong type or out of range,
        a per-partition list whose length is not ``partitions``, a list beyond its bound;
        the message names the field.
    StateCorruptError
        With ``where``: the same, the message naming the file and the field.

    Notes
    -----
    Cost: O(partitions + hot keys + sample keys).

    Examples
    --------
    >>> checked = check_history_record({"v": 1, "batch": 3, "time": 1.0, "seconds": 0.5,
    ...                                 "strategy": "hash", "partitions": 2, "rows": [10, -1]})
    >>> checked["rows"], checked["task_ms"]
    ([10.0, -1.0], None)
    >>> check_history_record({"v": 1, "batch": -2, "partitions": 1})
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: record.batch must be >= 0, got -2
    >>> check_history_record({"v": 2}, "h.json")
    Traceback (most recent call last):
    ...
    trilink_spark.errors.StateCorruptError: h.json: not a history record of version 1 (record.v ...
    """
    try:
        return _checked_history(record, complete)
    except (InvalidArgumentError, InvalidArgumentTypeError) as err:
        if where is None:
            raise
        raise StateCorruptError(
            f"{where}: not a history record of version {HISTORY_VERSION} ({err})") from None


# ---------------------------------------------------------------------- table snapshots
#: Format tag of an incremental snapshot's record (:mod:`trilink_spark.state.incremental`).
TABLES_FORMAT = "trilink-table-snapshot"
#: Its version.
TABLES_VERSION = 1
#: The most files one snapshot record may list.
MAX_TABLE_FILES = 100_000
_FILE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_HEX = frozenset("0123456789abcdef")
_TABLES_FIX = ("restore the file from a copy of the state path, or start over with a new state "
               "path")


def tables_bytes(record: Mapping[str, Any]) -> bytes:
    """An incremental snapshot's record as written (sealed, tagged with its format)."""
    return dump({**record, "format": TABLES_FORMAT, "format_version": TABLES_VERSION})


def _file_name(value: Any) -> bool:
    return (isinstance(value, str) and 0 < len(value) <= 200 and value not in (".", "..")
            and set(value) <= _FILE_NAME_CHARS)


def parse_tables(data: bytes, path: str, partition: int, version: int) -> dict[str, Any]:
    """The record of ``partition``'s incremental snapshot ``version`` stored as ``data``:
    ``lineage``, ``files`` (each ``name``, ``blob``, ``size``, ``sha256``), ``uploaded``,
    ``schema`` (base64 Arrow IPC) and ``meta``. O(its size).

    Raises
    ------
    StateCorruptError
        Not JSON, failing its checksum, not such a record, another partition's or version's,
        or a field out of its bounds (a file name that could leave its directory included).
    """
    try:
        doc = unseal(json.loads(data.decode("utf-8")), path)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        if isinstance(err, StateCorruptError):
            raise
        raise StateCorruptError(f"{path} is not JSON: not a snapshot record of this store; "
                                f"{_TABLES_FIX}") from None
    problem = None
    if not isinstance(doc, dict) or doc.get("format") != TABLES_FORMAT:
        problem = "not a table snapshot record of this store"
    elif doc.get("format_version") != TABLES_VERSION:
        problem = (f"table snapshot version {doc.get('format_version')!r}; this trilink-spark "
                   f"reads version {TABLES_VERSION}")
    elif type(doc.get("partition")) is not int or type(doc.get("version")) is not int \
            or doc["partition"] != partition or doc["version"] != version:
        problem = (f"it records partition {doc.get('partition')!r} version "
                   f"{doc.get('version')!r}, not partition {partition} version {version}")
    elif not _tables_fields(doc):
        problem = "malformed lineage, files, schema or meta"
    if problem is not None:
        raise StateCorruptError(f"{path}: {problem}; {_TABLES_FIX}")
    out: dict[str, Any] = doc
    return out


def _tables_fields(doc: dict[str, Any]) -> bool:
    """Whether a table snapshot record's fields are within their bounds."""
    meta, line = doc.get("meta"), doc.get("lineage")
    return (isinstance(line, str) and len(line) == 32 and set(line) <= _HEX
            and is_count(doc.get("uploaded"), 0) and isinstance(doc.get("schema"), str)
            and isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())
            and valid_table_files(doc.get("files")))


def valid_table_files(files: Any) -> bool:
    """Whether ``files`` is a list of table file entries (``name``, ``blob``: plain file
    names; ``size``; ``sha256``: 64 hex digits) with no name twice, at most
    :data:`MAX_TABLE_FILES` of them."""
    if not isinstance(files, list) or len(files) > MAX_TABLE_FILES:
        return False
    for f in files:
        if not (isinstance(f, dict) and _file_name(f.get("name")) and _file_name(f.get("blob"))
                and is_count(f.get("size"), 0) and isinstance(f.get("sha256"), str)
                and len(f["sha256"]) == 64 and set(f["sha256"]) <= _HEX):
            return False
    return len({f["name"] for f in files}) == len(files)


def __getattr__(name: str) -> Any:
    """``parse_record``, the name :func:`parse_small_record` had before (the dashboard's
    ``parse_batch_record`` had it too): it still resolves, with a :class:`DeprecationWarning`,
    until the next minor release."""
    if name != "parse_record":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_moved(f"{__name__}.parse_record", f"{__name__}.parse_small_record")
    return parse_small_record
