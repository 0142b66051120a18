"""Operators that time themselves: each task of a trilink operator writes what it did.

Spark's task metrics say how long a *stage* ran; a stage holds several operators (the scan,
``local_merge``, the shuffle write). When ``spark.trilink.operatorTiming`` names a directory
(a local path, or any ``pyarrow.fs`` URI the executors and the driver both reach), each task of
``local_merge``, ``global_merge`` and the keyed runtime writes one small JSON record there:
rows in and out, the milliseconds spent in the operator's own work (``busy_ms``) and those spent
waiting for its input (``wait_ms``). :func:`read_operator_timings` gathers them for the driver;
:class:`OperatorTimingReader` hands out only the records written since its last call, which is
what a per-batch consumer such as the bottleneck advisor wants.

Layout::

    <root>/<operator>/<run>/stage-<stage id>-part-<partition>-attempt-<attempt>.json

``run`` is fixed when the operator is planned (a ``foreachBatch`` call plans one per batch; a
streaming query plans one for all batches: the stage id tells the batches apart).

Records are JSON with a format marker; a file that is not one of them (foreign, truncated,
oversized) is skipped with a warning that names it, and listed in ``attrs["skipped"]``. Metrics
never fail a task: a write that fails is logged and the task goes on.

Examples
--------
>>> import tempfile
>>> root = tempfile.mkdtemp()
>>> timer = OperatorTimer(root, "local_merge", "r1")
>>> timer.write(rows_in=1000, rows_out=10, busy_ms=12.5, wait_ms=3.0, partition=0)
>>> t = read_operator_timings(root)
>>> t[["operator", "partition", "rows_in", "rows_out", "busy_ms"]].values.tolist()
[['local_merge', 0, 1000, 10, 12.5]]
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, TypeGuard

import pandas as pd

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .io.files import resolve_filesystem, write_atomic
from .spark.session import CONF_PREFIX
from .validation import INT64_MAX, is_count

__all__ = [
    "OPERATOR_TIMING_CONF", "OPERATOR_TIMING_COLUMNS", "OPERATOR_TIMING_FORMAT",
    "OperatorTimer", "OperatorTimingReader", "Stopwatch", "is_operator_name", "operator_timer",
    "read_operator_timings", "task_identity", "timing_root",
]

logger = logging.getLogger(__name__)

#: Spark conf key naming the directory operator timings go to; unset: operators do not time.
OPERATOR_TIMING_CONF = CONF_PREFIX + "operatorTiming"
#: The format marker of a timing record.
OPERATOR_TIMING_FORMAT = "trilink-operator-timing/1"
#: Columns of :func:`read_operator_timings`, in order.
OPERATOR_TIMING_COLUMNS: tuple[str, ...] = (
    "operator", "run", "stage_id", "partition", "attempt", "rows_in", "rows_out", "busy_ms",
    "wait_ms", "written_ms",
)
#: A record larger than this is not one of ours.
MAX_RECORD_BYTES = 4096
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_FILE = re.compile(r"^stage-(\d+)-part-(\d+)-attempt-(\d+)\.json$")
_INTS = ("stage_id", "partition", "attempt", "rows_in", "rows_out")
_FLOATS = ("busy_ms", "wait_ms", "written_ms")


def is_operator_name(value: Any) -> TypeGuard[str]:
    """Whether ``value`` is a valid operator (or run) name: 1-64 letters, digits, ``_``,
    ``.`` or ``-`` (no spaces, so never the name of a stage or exchange node)."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(f"{what} must be a str, got {type(value).__name__}")
    if not is_operator_name(value):
        raise InvalidArgumentError(
            f"{what} must be 1-64 characters of letters, digits, '_', '.' or '-', got "
            f"{value!r:.80}")
    return value


def task_identity() -> tuple[int, int, int]:
    """``(stage id, partition, attempt)`` of the running Spark task; ``(0, 0, 0)`` outside one."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is an extra
        return 0, 0, 0
    context = TaskContext.get()
    if context is None:
        return 0, 0, 0
    return int(context.stageId()), int(context.partitionId()), int(context.attemptNumber())


@dataclass(frozen=True)
class OperatorTimer:
    """Where one planned operator's tasks write their timing (picklable configuration).

    Parameters
    ----------
    root : str
        The timing directory (:data:`OPERATOR_TIMING_CONF`).
    operator : str
        The operator's name (``"local_merge"``, ``"global_merge"``, ``"keyed"``).
    run : str
        Tells plannings of the same operator apart.

    Notes
    -----
    Cost per task: one small file written atomically (a rename). Never raises from
    :meth:`write`: a failed write is logged at WARNING.
    """

    root: str
    operator: str
    run: str

    def __post_init__(self) -> None:
        if not isinstance(self.root, str) or not self.root:
            raise InvalidArgumentTypeError(
                f"the timing directory must be a non-empty str, got {self.root!r:.80}")
        _check_name(self.operator, "operator")
        _check_name(self.run, "run")

    def write(self, *, rows_in: int, rows_out: int, busy_ms: float, wait_ms: float = 0.0,
              partition: int | None = None) -> None:
        """Record one task's work: its rows, the milliseconds of its own work and of waiting
        for input. The task's stage, partition and attempt come from Spark's ``TaskContext``
        (``partition`` overrides the partition, for callers outside a task)."""
        try:  # everything inside: a metric never fails the task, whatever it is given
            stage, pid, attempt = task_identity()
            if partition is not None:
                pid = int(partition)
            record = {
                "format": OPERATOR_TIMING_FORMAT, "operator": self.operator, "run": self.run,
                "stage_id": stage, "partition": pid, "attempt": attempt,
                "rows_in": int(rows_in), "rows_out": int(rows_out),
                "busy_ms": round(max(float(busy_ms), 0.0), 3),
                "wait_ms": round(max(float(wait_ms), 0.0), 3),
                "written_ms": round(time.time() * 1000.0, 3),
            }
            name = f"stage-{stage}-part-{pid}-attempt-{attempt}.json"
            fs, root = resolve_filesystem(self.root)
            directory = f"{root}/{self.operator}/{self.run}"
            fs.create_dir(directory, recursive=True)
            write_atomic(fs, f"{directory}/{name}",
                         json.dumps(record, separators=(",", ":"), allow_nan=False).encode())
        except Exception as err:  # noqa: BLE001 - a metric never fails the task
            logger.warning("operator timing not written to %s (%s: %s)", self.root,
                           type(err).__name__, err)


class Stopwatch:
    """Splits a task's time into waiting for input and its own work (used by the operators).

    Examples
    --------
    >>> watch = Stopwatch()
    >>> rows = list(watch.pull(iter([1, 2, 3])))
    >>> watch.busy_ms() >= 0.0 and watch.wait_ms >= 0.0
    True
    """

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.wait_ms = 0.0
        self.paused_ms = 0.0

    def pull(self, items: Any) -> Any:
        """Yield from ``items``, counting the time spent waiting for each as input wait."""
        iterator = iter(items)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                self.wait_ms += (time.perf_counter() - t0) * 1000.0
                return
            self.wait_ms += (time.perf_counter() - t0) * 1000.0
            yield item

    def pause(self, started: float) -> None:
        """Count the time since ``started`` (``time.perf_counter()``) as not the operator's
        (e.g. its output being consumed downstream)."""
        self.paused_ms += (time.perf_counter() - started) * 1000.0

    def emit(self, items: Any) -> Any:
        """Yield from ``items``, counting the time the consumer holds each item (downstream
        work) as not the operator's."""
        for item in items:
            t0 = time.perf_counter()
            yield item
            self.pause(t0)

    def busy_ms(self) -> float:
        """Milliseconds since the start that were neither input wait nor paused."""
        total = (time.perf_counter() - self.started) * 1000.0
        return max(total - self.wait_ms - self.paused_ms, 0.0)


def timing_root(spark: Any, confs: Mapping[str, str] | None = None) -> str | None:
    """The timing directory :data:`OPERATOR_TIMING_CONF` names (surrounding whitespace
    stripped), or None when it is unset, empty or cannot be read. The operators and
    :class:`~trilink_spark.advice.BottleneckListener` both read it here, so they agree on it.
    ``confs``: the session's confs, already read (no conf read then)."""
    try:
        root = (confs.get(OPERATOR_TIMING_CONF) if confs is not None
                else spark.conf.get(OPERATOR_TIMING_CONF, None))
    except Exception as err:  # noqa: BLE001 - a conf Spark cannot read means no timing
        logger.debug("operator timing conf not readable (%s: %s)", type(err).__name__, err)
        return None
    if root is None or not str(root).strip():
        return None
    return str(root).strip()


def operator_timer(spark: Any, operator: str, confs: Mapping[str, str] | None = None
                   ) -> OperatorTimer | None:
    """The timer for a new planning of ``operator``, or None when
    :data:`OPERATOR_TIMING_CONF` is unset (or empty). Reads the session conf on the driver
    (classic or Spark Connect), or ``confs`` (:func:`timing_root`); O(1)."""
    root = timing_root(spark, confs)
    if root is None:
        return None
    return OperatorTimer(root, operator, uuid.uuid4().hex[:16])


def _parse(raw: bytes, where: str) -> dict[str, Any] | None:
    if len(raw) > MAX_RECORD_BYTES:
        logger.warning("%s: %d bytes is not an operator timing record; skipped", where, len(raw))
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        logger.warning("%s: not JSON; skipped", where)
        return None
    if not isinstance(value, dict) or value.get("format") != OPERATOR_TIMING_FORMAT:
        logger.warning("%s: not a %s record; skipped", where, OPERATOR_TIMING_FORMAT)
        return None
    out: dict[str, Any] = {}
    for name in ("operator", "run"):
        v = value.get(name)
        if not is_operator_name(v):
            logger.warning("%s: field %r is not a name; skipped", where, name)
            return None
        out[name] = v
    for name in _INTS:
        v = value.get(name)
        if not is_count(v, 0, INT64_MAX):
            logger.warning("%s: field %r is not a count; skipped", where, name)
            return None
        out[name] = v
    for name in _FLOATS:
        v = value.get(name)
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                or v < 0 or v > 1e18):
            logger.warning("%s: field %r is not a duration; skipped", where, name)
            return None
        out[name] = float(v)
    return out


def _empty() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series([], dtype="object" if c in ("operator", "run") else
                                       "int64" if c in _INTS else "float64")
                          for c in OPERATOR_TIMING_COLUMNS})
    return frame


def _frame(records: list[dict[str, Any]], skipped: list[str]) -> pd.DataFrame:
    if not records:
        frame = _empty()
    else:
        frame = pd.DataFrame(records, columns=list(OPERATOR_TIMING_COLUMNS))
        # a task that ran twice (a retry, a speculative copy) counts once: its last attempt
        frame = frame.sort_values(["operator", "run", "stage_id", "partition", "attempt"],
                                  kind="stable")
        frame = frame.drop_duplicates(["operator", "run", "stage_id", "partition"], keep="last")
        frame = frame.reset_index(drop=True)
        for c in _INTS:
            frame[c] = frame[c].astype("int64")
    frame.attrs["skipped"] = skipped
    return frame


class OperatorTimingReader:
    """Reads the records under a timing directory, each once.

    Parameters
    ----------
    root : str
        The timing directory (:data:`OPERATOR_TIMING_CONF`).
    delete : bool
        Delete each record once read (default False), so the directory stays small on a
        long-running query.

    Notes
    -----
    Thread-safe: calls of :meth:`new` from several threads run one at a time, so each record
    is handed out once. Each task is handed out once: a later attempt of a task whose record
    was already handed out (a retry that wrote after the first attempt was read, a
    speculative copy finishing late) is not handed out again, as it would count the task
    twice (with ``delete``, the tasks are not remembered and such a late attempt is handed
    out). Cost of :meth:`new`: one listing of the directory tree, one read per new record;
    memory O(records seen) for the names and tasks read (none kept when ``delete``).

    Examples
    --------
    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> reader = OperatorTimingReader(root)
    >>> OperatorTimer(root, "keyed", "r").write(rows_in=5, rows_out=5, busy_ms=1.0)
    >>> len(reader.new()), len(reader.new())
    (1, 0)
    """

    def __init__(self, root: str, *, delete: bool = False) -> None:
        if not isinstance(root, str) or not root:
            raise InvalidArgumentTypeError(
                f"root must be a non-empty str (a directory), got {root!r:.80}")
        if not isinstance(delete, bool):
            raise InvalidArgumentTypeError(f"delete must be a bool, got {type(delete).__name__}")
        self.root = root
        self.delete = delete
        self._seen: set[str] = set()
        self._tasks: set[tuple[str, str, int, int]] = set()  # tasks handed out (no delete)
        self._lock = threading.Lock()

    def new(self) -> pd.DataFrame:
        """The records written since the last call (all of them on the first), as
        :func:`read_operator_timings` frames them.

        Raises
        ------
        InvalidArgumentError
            The root is neither a path nor a URI of a filesystem pyarrow knows. A directory
            that cannot be listed gives an empty frame (logged).
        """
        with self._lock:
            frame = self._read(only_new=True)
            if self.delete or not len(frame):
                return frame
            keys = list(zip(frame["operator"], frame["run"], frame["stage_id"].astype(int),
                            frame["partition"].astype(int)))
            fresh = [k not in self._tasks for k in keys]
            self._tasks.update(keys)
            if all(fresh):
                return frame
            logger.debug("%d later attempt(s) of tasks already handed out left out",
                         len(fresh) - sum(fresh))
            out = frame[fresh].reset_index(drop=True)
            out.attrs["skipped"] = frame.attrs["skipped"]
            return out

    def _read(self, only_new: bool) -> pd.DataFrame:
        from pyarrow import fs as pafs

        try:
            filesystem, root = resolve_filesystem(self.root)
        except ValueError as err:  # pyarrow's ArrowInvalid: not a URI it knows
            raise InvalidArgumentError(
                f"operator timing root {self.root!r:.200} is not a path or a filesystem URI "
                f"pyarrow knows ({err})") from None
        except Exception as err:  # noqa: BLE001 - e.g. a filesystem not reachable right now
            logger.warning("operator timings under %s not listed (%s: %s)", self.root,
                           type(err).__name__, err)
            return _frame([], [])
        records: list[dict[str, Any]] = []
        skipped: list[str] = []
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True,
                                                               allow_not_found=True))
        except OSError as err:
            logger.warning("operator timings under %s not listed (%s: %s)", self.root,
                           type(err).__name__, err)
            return _frame([], [])
        for info in sorted(infos, key=lambda i: i.path):
            if info.type != pafs.FileType.File or not _FILE.match(info.base_name):
                continue  # temporaries being written, directories, foreign names
            if only_new and info.path in self._seen:
                continue
            try:
                with filesystem.open_input_stream(info.path) as f:
                    raw: bytes = f.read(MAX_RECORD_BYTES + 1)
            except OSError as err:
                logger.warning("%s: not read (%s: %s)", info.path, type(err).__name__, err)
                continue  # maybe being replaced: read it next time
            record = _parse(raw, info.path)
            if only_new and not self.delete:
                self._seen.add(info.path)
            if record is None:
                skipped.append(info.path)
            else:
                records.append(record)
            if self.delete:
                try:
                    filesystem.delete_file(info.path)
                except OSError as err:
                    logger.warning("%s: not deleted (%s: %s)", info.path, type(err).__name__,
                                   err)
                    self._seen.add(info.path)
        return _frame(records, skipped)


def read_operator_timings(root: str) -> pd.DataFrame:
    """Every operator timing record under ``root``.

    Parameters
    ----------
    root : str
        The timing directory (:data:`OPERATOR_TIMING_CONF`).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`OPERATOR_TIMING_COLUMNS`: ``operator``, ``run``, ``stage_id``,
        ``partition``, ``attempt``, ``rows_in``, ``rows_out``, ``busy_ms`` (the operator's own
        work), ``wait_ms`` (waiting for its input: the operators upstream in its stage),
        ``written_ms`` (epoch milliseconds). One row per task: a retried task's last attempt.
        ``attrs["skipped"]`` lists files that are not timing records (each also logged). A
        missing directory, or one that cannot be listed (logged), gives an empty frame.

    Raises
    ------
    InvalidArgumentTypeError
        ``root`` is not a non-empty str.
    InvalidArgumentError
        ``root`` is neither a path nor a URI of a filesystem pyarrow knows.

    Notes
    -----
    Cost: one recursive listing and one small read per record, on the driver; no Spark job.

    Examples
    --------
    >>> measurement.read_operator_timings("/tmp/timings").groupby("operator").busy_ms.sum()  # doctest: +SKIP
    """
    return OperatorTimingReader(root)._read(only_new=False)
