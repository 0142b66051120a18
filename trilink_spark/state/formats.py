"""The JSON files of the keyed state store: what each holds, and how it is checked when read.

A :class:`~trilink_spark.state.KeyedStateStore` keeps these JSON files beside its Arrow
state versions (its module docstring has the layout): the manifest, the placement records,
the swap plans and small records such as a stored swap request. This module turns each into
bytes and back, with no I/O: the store reads and writes the bytes.

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
from collections.abc import Callable, Mapping
from typing import Any

from .._internal.io.sealed import SEALED_KEY, seal, unseal
from ..errors import InvalidArgumentError, StateCorruptError
from ..partitioners import Partitioner
from ..partitioners.base import KEY_KINDS

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "MAX_RECORD_BYTES", "RECORD_FORMAT",
           "PLAN_FIELDS", "dump", "manifest_bytes", "parse_manifest", "placement_bytes",
           "parse_placement", "plan_bytes", "parse_plan", "record_bytes", "parse_record",
           "is_count", "parse_timing", "TIMING_SUFFIX", "MAX_TIMING_BYTES", "segment_index", "SEGMENT_INDEX"]

MANIFEST_FORMAT = "trilink-keyed-state-manifest"
MANIFEST_VERSION = 1
#: Format tag of a small record (:func:`record_bytes`).
RECORD_FORMAT = "trilink-state-record"
#: Largest small record :func:`parse_record` reads (the store reads at most one byte more).
MAX_RECORD_BYTES = 1024 * 1024
#: Suffix of the file beside a state version holding what the task that wrote it measured of
#: its own work: JSON ``{"rows": int, "process_ms": float, "block_rows": {"blocks": [...],
#: "rows": [...]} or absent}``.
TIMING_SUFFIX = ".timing.json"
#: Largest timing record read back (a block placement of 2**20 blocks fits).
MAX_TIMING_BYTES = 32 * 1024 * 1024
#: Schema metadata key of a segment file: JSON [[destination, rows], ...], one per batch.
SEGMENT_INDEX = b"trilink.segment_index"

logger = logging.getLogger(__name__)


def is_count(value: object, least: int) -> bool:
    """Whether ``value`` is an int (not a bool) of at least ``least``. O(1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


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
    """
    body: dict[str, Any] = {"partitions": int(partitions),
                            "strategy": None if strategy is None else strategy.to_dict()}
    if key_type is not None:
        if key_type not in KEY_KINDS:
            raise InvalidArgumentError(
                f"key_type must be one of {', '.join(KEY_KINDS)} or None, got {key_type!r}")
        body["key_type"] = key_type
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
    if key_type is not None and (not isinstance(key_type, str) or key_type not in KEY_KINDS):
        raise StateCorruptError(
            f"{path} records key_type={key_type!r}; a placement record holds one of "
            f"{', '.join(KEY_KINDS)} (or none)")
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


def parse_record(data: bytes, name: str, path: str) -> dict[str, Any]:
    """The body of the small record ``name`` stored as ``data``. O(its size).

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
    out: dict[str, Any] = {**late, 
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
    if profile is not None:
        out["keys"] = profile
    return out


#: At most this many keys in each list of a timing record's key profile.
MAX_PROFILE_KEYS = 1024
#: The longest key text a profile holds (a key is shown cut to 80 characters, bytes as
#: ``0x`` and 80 hex digits, and "…"): the batch's history record stays within
#: :data:`MAX_RECORD_BYTES` however long the keys are.
MAX_PROFILE_KEY_CHARS = 100


def _is_profile_key(key: object) -> bool:
    """A key as :func:`~trilink_spark.keyed.records.history.display_key` writes it: null, a bool, an
    int64, a finite float or a text of at most :data:`MAX_PROFILE_KEY_CHARS`."""
    if key is None or isinstance(key, bool):
        return True
    if isinstance(key, int):
        return -_COUNT_LIMIT <= key < _COUNT_LIMIT
    if isinstance(key, float):
        return math.isfinite(key)
    return isinstance(key, str) and len(key) <= MAX_PROFILE_KEY_CHARS


def _is_key_profile(value: object) -> bool:
    """A task's key profile (:func:`~trilink_spark.keyed.records.history.key_profile`): ``hot`` and
    ``sample`` lists of ``[key, weight]`` (:func:`_is_profile_key`; a weight is a finite
    number >= 0 below 2**63), and a ``keys`` count."""
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
    """:func:`~trilink_spark.state.formats.is_count`, and below 2**63 (a timing record's figures fit an int64)."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and least <= value < _COUNT_LIMIT)


#: Counts and milliseconds a timing record may hold: below 2**63 (an int64), so a forged
#: 400-digit number is refused, never overflows a conversion.
_COUNT_LIMIT = 2**63


def _is_milliseconds(value: object) -> bool:
    """Whether ``value`` is a finite, non-negative number of milliseconds below 2**63."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return 0 <= value < _COUNT_LIMIT
    return math.isfinite(value) and 0 <= value < _COUNT_LIMIT


def segment_index(raw: bytes | None, path: str, batches: int) -> list[tuple[int, int]]:
    """The ``[[destination, rows], ...]`` index of a segment file, checked against its
    record batches; StateCorruptError for anything else."""
    try:
        index = json.loads(raw.decode("utf-8")) if raw is not None else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        index = None
    ok = (isinstance(index, list) and len(index) == batches
          and all(isinstance(e, list) and len(e) == 2
                  and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in e)
                  for e in index)
          and len({e[0] for e in index}) == len(index))
    if not ok or index is None:
        raise StateCorruptError(
            f"{path} has no valid segment index ({SEGMENT_INDEX.decode()}: one "
            f"[destination, rows] pair per record batch, {batches} batches); it is not a "
            "segment file this release wrote")
    return [(int(d), int(r)) for d, r in index]
