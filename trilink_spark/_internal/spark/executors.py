"""Whether a cluster's executors can run the package's tasks, checked before any of them runs.

Most operators run functions of the package on the executors (Local Merge, keyed process
functions and their state, Global Merge into Redis, the trilink-kafka source): an executor's
Python that cannot import ``trilink_spark`` or one of its dependencies, or cannot see the
``state_path`` the driver writes to, would fail such a task deep in a traceback. So the entry
points call :func:`ensure_executors` first: on a cluster (a master that is not ``local``
or ``local[...]``; ``local-cluster[...]`` runs executors in JVMs of their own) and on every
Spark Connect session (its server's Python is never known to be the client's), once per
application (per session on Connect) and state path, it runs :func:`check_executors`, one
tiny Spark job whose tasks report what their Python imports and sees, and raises
:class:`~trilink_spark.errors.ExecutorEnvironmentError` naming what is missing, where, and
the fix. A local ``state_path`` on a cluster is warned about
(:class:`~trilink_spark.errors.TrilinkWarning`): on one host, or on a mount every host shares
at the same path, it works, and the check proves the executors see it.

The job's function is built from the standard library and its closure only (a nested
function, which cloudpickle ships by value), so it runs on executors that lack the package.

Examples
--------
>>> is_local_master("local[4]"), is_local_master("local-cluster[2,1,1024]")
(True, False)
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import threading
import uuid
import warnings
from collections.abc import Callable
from typing import Any

from ...errors import ExecutorEnvironmentError, StateStoreError, TrilinkWarning
from ..io.files import resolve_filesystem
from .compat import is_connect

__all__ = ["check_executors", "ensure_executors", "judge_reports", "is_local_master",
           "note_shipped", "shipped_packages",
           "executor_environment_key", "DEPENDENCIES", "OPTIONAL", "COMPILED",
           "README_SECTION"]

logger = logging.getLogger(__name__)

#: What an executor's Python must import besides the package: what ``import trilink_spark``
#: imports.
DEPENDENCIES = ("numpy", "pandas", "pyarrow", "mmh3", "sortedcontainers")
#: What only some tasks import, required where a caller names it (``needs``): rocksdict for
#: the executor-local copies of keyed state.
OPTIONAL = ("rocksdict",)
#: The dependencies with compiled code: no zip on the Python path can bring them.
COMPILED = ("numpy", "pandas", "pyarrow", "mmh3", "rocksdict")
#: Where the README explains it all.
README_SECTION = "the README section 'Running on a cluster'"
#: Rows of the check's job: spread over the session's default number of partitions, each
#: task reports once.
PROBE_ROWS = 4096
#: Name prefix of the file the driver writes under a state path for the executors to find.
MARKER_PREFIX = ".executor-check-"

_PACKAGE = "trilink_spark"
#: The module an import error names: the package that fails for a missing dependency is
#: there, and the dependency is what to fix.
_NO_MODULE = re.compile(r"No module named '([^'.]+)")
_passed: set[tuple[str, str | None, tuple[str, ...]]] = set()
_shipped: dict[str, set[str]] = {}  # session key -> the packages tl.ship added to it
_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def note_shipped(key: str, packages: list[str]) -> None:
    """Record that ``tl.ship`` added ``packages`` to the session ``key``
    (:func:`executor_environment_key`), so that a failed check never advises it again for
    them."""
    with _lock:
        _shipped.setdefault(key, set()).update(packages)


def shipped_packages(key: str) -> frozenset[str]:
    """The packages ``tl.ship`` added to the session ``key`` (empty: none). Read without
    the check's lock, which its caller may hold (one dictionary read)."""
    return frozenset(_shipped.get(key, ()))


def is_local_master(master: str | None) -> bool:
    """Whether ``master`` runs the executors inside the driver's JVM (``local``,
    ``local[N]``, ``local[*]``, ``local[N,F]``). ``local-cluster[...]`` starts executor JVMs
    of its own, so it is not local. Cost: none."""
    return master is not None and (master == "local" or master.startswith("local["))


def executor_environment_key(spark: Any) -> str:
    """What identifies the executors' Python environment of ``spark``, the key under which
    :func:`ensure_executors` remembers a passed check (and ``tl.ship`` what it shipped): the
    application id on a classic session (shared by its sessions: ``addPyFile`` is per
    SparkContext), the session id on Spark Connect (artifacts are per session). Not the key
    of the placement plan cache
    (:func:`~trilink_spark.placement.plans.plan_cache_session_key`, one per session). Cost:
    one Py4J call on classic, none on Connect."""
    if is_connect(spark):
        return f"connect:{spark.session_id}"
    return str(spark.sparkContext.applicationId)



def _master(spark: Any) -> str | None:
    if is_connect(spark):
        value = spark.conf.get("spark.master", None)
        return None if value is None else str(value)
    return str(spark.sparkContext.master)


def ensure_executors(spark: Any, state_path: str | None = None, filesystem: Any = None, *,
                     needs: tuple[str, ...] = (), always: bool = False) -> bool:
    """Run :func:`check_executors` where the executors may lack what the driver has, once.

    Parameters
    ----------
    spark : pyspark.sql.SparkSession
        The session whose executors run the caller's tasks (classic or Spark Connect).
    state_path : str, optional
        A state path the tasks read and write (with ``filesystem``, as the state store has
        it): the executors must see a file the driver writes there.
    filesystem : pyarrow.fs.FileSystem, optional
        The filesystem of ``state_path``; default inferred from it.
    needs : tuple of str
        Modules of :data:`OPTIONAL` the caller's tasks import too.
    always : bool
        Check on a local master too (``tl.ship`` asks for it).

    Returns
    -------
    bool
        True when a check ran (and passed), False when none was needed.

    Raises
    ------
    ExecutorEnvironmentError
        As :func:`check_executors`. A failed check is not remembered: the next call checks
        again (after ``tl.ship(spark)``, say).

    Warns
    -----
    TrilinkWarning
        Once per application and path: ``state_path`` is on the driver's local filesystem
        (a ``SubTreeFileSystem`` of it included) and the master is not local (also logged).

    Notes
    -----
    Cost: nothing on a local classic master (one attribute read); elsewhere one Py4J call
    per call on classic (none on Connect), and once per application (Connect: session)
    and state path the check's Spark job (and a conf read on Connect).
    """
    connect = is_connect(spark)
    local_python = None
    if not always and not connect and is_local_master(_master(spark)):
        local_python = other_worker_python(spark)
        if local_python is None:
            return False
    key = (executor_environment_key(spark), state_path, tuple(sorted(needs)))
    if local_python is not None:  # one filesystem: the workers' imports only, once per app
        state_path = filesystem = None
        key = (key[0], None, key[2])
    with _lock:
        if key in _passed:
            return False
        master = _master(spark)
        if state_path is not None and not is_local_master(master):
            _warn_local_path(key[0], master, state_path, filesystem)
        try:
            check_executors(spark, state_path, filesystem, needs=needs)
        except ExecutorEnvironmentError as err:
            if local_python is None:
                raise
            raise ExecutorEnvironmentError(
                f"{err} On this local master the tasks run in {local_python!r} (PySpark's "
                f"PYSPARK_PYTHON, or python3), not in this Python ({sys.executable}): set "
                f"PYSPARK_PYTHON={sys.executable} (or spark.pyspark.python) before the "
                "SparkSession starts") from None
        _passed.add(key)
        return True


def other_worker_python(spark: Any) -> str | None:
    """On a local classic master: the Python that runs the session's tasks when it is not
    this interpreter (PySpark starts ``PYSPARK_PYTHON``, else ``python3`` from ``PATH``, which
    may lack what this one imports); None when it is this one. O(1): a ``PATH`` lookup."""
    worker = str(getattr(spark.sparkContext, "pythonExec", "") or "")
    if not worker:
        return None
    found = shutil.which(worker) or worker
    if os.path.abspath(found) == os.path.abspath(sys.executable):
        return None
    return worker


def _warn_local_path(key: str, master: str | None, state_path: str, filesystem: Any) -> None:
    from pyarrow import fs

    found, path = resolve_filesystem(state_path, filesystem)
    while isinstance(found, fs.SubTreeFileSystem):  # a directory of another filesystem
        path = f"{found.base_path.rstrip('/')}/{path.lstrip('/')}"
        found = found.base_fs
    if not isinstance(found, fs.LocalFileSystem) or (key, path) in _warned:
        return
    _warned.add((key, path))
    message = (
        f"state_path {path} is on the driver's local filesystem and the master is {master}: "
        "every executor must see this directory at the same path (one host, or a mount "
        "all hosts share, such as NFS); otherwise give shared storage (hdfs://, s3://, gs:// "
        "through pyarrow.fs). The check that follows fails if an executor cannot see it; "
        f"see {README_SECTION}")
    logger.warning(message)
    warnings.warn(message, TrilinkWarning, stacklevel=3)


def check_executors(spark: Any, state_path: str | None = None, filesystem: Any = None, *,
                    needs: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Ask the executors whether their Python imports the package and its dependencies (and
    sees ``state_path``); raise if one does not.

    Parameters
    ----------
    spark : pyspark.sql.SparkSession
        Classic or Spark Connect.
    state_path : str, optional
        A directory the driver can write to (a local path or a ``pyarrow.fs`` URI; made if
        missing): the driver writes a small file there, each task looks for it, the driver
        deletes it.
    filesystem : pyarrow.fs.FileSystem, optional
        The filesystem of ``state_path``; default inferred from it.
    needs : tuple of str
        Modules of :data:`OPTIONAL` that must be importable too (each task tries them all;
        only these count).

    Returns
    -------
    list of dict
        One report per task: ``host``, ``python`` (the executor's interpreter), ``pid``,
        ``missing`` (module -> error), ``version`` and ``file`` of the package it imported,
        ``seen`` (``"yes"``, ``"no"``, an error, or None without ``state_path`` or when
        an executor lacks what the check of another filesystem than the local one needs).

    Raises
    ------
    ExecutorEnvironmentError
        A task's Python cannot import the package, a dependency (:data:`DEPENDENCIES`) or
        one of ``needs``, or
        imports another version of the package than the driver's, or cannot see
        ``state_path``; or the job failed before its tasks could report (an executor's
        Python that does not start, another Python version than the driver's). The
        message names the modules or the path, the host and Python, and the fix.
    StateStoreError
        The driver cannot write its file under ``state_path``.

    Notes
    -----
    Cost: one Spark job of :data:`PROBE_ROWS` rows over the session's default number of
    partitions (a plain Python UDF: no Arrow needed on the executors), each task importing
    the package once (its Python worker keeps it for the tasks that follow), one report per
    task to the driver; with ``state_path``, one small file written and deleted, and one
    metadata read per task. It cannot reach executors that start after it (dynamic
    allocation) or that no task of the job ran on.

    Examples
    --------
    >>> check_executors(spark)[0]["missing"]  # doctest: +SKIP
    {}
    """
    import sys

    from pyspark.sql import functions as F

    version = str(sys.modules[_PACKAGE].__version__)
    marker = shown = None
    fs = remote = None
    if state_path is not None:
        fs, inner = resolve_filesystem(state_path, filesystem)
        shown = inner.rstrip("/") or "/"
        marker = f"{inner.rstrip('/')}/{MARKER_PREFIX}{uuid.uuid4().hex}"
        try:
            fs.create_dir(inner, recursive=True)  # as the state store does
            with fs.open_output_stream(marker) as out:
                out.write(b"written by the driver for the executors to find\n")
        except OSError as err:
            raise StateStoreError(f"state path {shown} cannot be written ({type(err).__name__}:"
                                  f" {err}); give a writable directory") from None
        from pyarrow import fs as pafs

        # a local path is looked up with os (no pyarrow needed); another filesystem object
        # goes into the closure of a second job, run once the first showed that every
        # executor imports pyarrow (in the first job's closure it would fail the job before
        # any task could report a missing pyarrow)
        remote = None if isinstance(fs, pafs.LocalFileSystem) else fs
    try:
        rows = _run_probe(spark, _probe(version, None if remote is not None else marker, None))
        if remote is not None and judge_reports(
                [json.loads(row[0]) for row in rows], version, None, needs) is None:
            rows = _run_probe(spark, _probe(version, marker, remote))
    except Exception as err:
        detail = " ".join(str(err).split())[:800]
        raise ExecutorEnvironmentError(
            "the executors could not run the check of their Python environment (a Python "
            "that does not start, or another Python version than the driver's "
            f"{_python_version()}?): {type(err).__name__}: {detail}. Set the executors' "
            f"Python with spark.pyspark.python or PYSPARK_PYTHON; see {README_SECTION}"
        ) from err
    finally:
        if marker is not None and fs is not None:
            try:
                fs.delete_file(marker)
            except OSError:
                logger.warning("could not delete the check's file %s", marker)
    reports = [json.loads(row[0]) for row in rows]
    message = judge_reports(reports, version, shown, needs,
                            shipped_packages(executor_environment_key(spark)))
    if message is not None:
        raise ExecutorEnvironmentError(message)
    hosts = sorted({f"{r['host']} ({r['python']})" for r in reports})
    logger.info("executors checked: %d task(s) on %s import trilink_spark %s%s", len(reports),
                ", ".join(hosts), version,
                "" if shown is None else f" and see {shown}")
    return reports


def _run_probe(spark: Any, probe_function: Callable[[int], str | None]) -> list[Any]:
    """The rows with a report of one run of the check's job."""
    from pyspark.sql import functions as F

    probe = F.udf(probe_function, "string", useArrow=False).asNondeterministic()
    frame = spark.range(0, PROBE_ROWS).select(probe(F.col("id")).alias("report"))
    return list(frame.where(F.col("report").isNotNull()).collect())


def _python_version() -> str:
    import sys

    return "%d.%d" % sys.version_info[:2]


def judge_reports(reports: list[dict[str, Any]], version: str,
                  state_path: str | None = None, needs: tuple[str, ...] = (),
                  shipped: frozenset[str] = frozenset()) -> str | None:
    """The message of the :class:`~trilink_spark.errors.ExecutorEnvironmentError` that the
    tasks' reports (:func:`check_executors`) call for, or None when every task is fine.

    Parameters
    ----------
    reports : list of dict
        As :func:`check_executors` returns them.
    version : str
        The driver's version of the package.
    state_path : str, optional
        The state path the tasks looked for the driver's file in, as the message shows it.
    needs : tuple of str
        The modules of :data:`OPTIONAL` that count (a report's other optional ones do not).
    shipped : frozenset of str
        The packages ``tl.ship`` already added to this session: for them, and once it was
        called for any, the fix is never ``tl.ship`` again.

    Notes
    -----
    The fixes follow the cause: a package that fails to import for a missing dependency
    (``No module named 'pyarrow'``) is there, so the fix is the dependency's (for a compiled
    one, a packed environment), not ``tl.ship``.

    Cost: O(reports); one line per distinct host, Python and finding (at most 10 shown),
    then the fixes the findings call for.

    Examples
    --------
    >>> report = {"host": "h1", "python": "/env/bin/python", "pid": 7, "version": None,
    ...           "file": None, "seen": None,
    ...           "missing": {"trilink_spark": "ModuleNotFoundError: No module named 'x'"}}
    >>> print(judge_reports([report], "0.1.0"))  # doctest: +ELLIPSIS
    trilink-spark's tasks cannot run on the executors: on h1 (Python /env/bin/python) cannot import trilink_spark (...). Fix: call tl.ship(spark) ...
    >>> judge_reports([dict(report, missing={}, version="0.1.0")], "0.1.0") is None
    True
    """
    shown = state_path
    counted = {"trilink_spark", *DEPENDENCIES, *needs}
    lines: list[str] = []
    missing: set[str] = set()
    other_version = unseen = False
    for report in _distinct(reports):
        where = f"on {report['host']} (Python {report['python']})"
        found = {m: e for m, e in report["missing"].items() if m in counted}
        if found:
            cause = _NO_MODULE.search(found.get(_PACKAGE, ""))
            if cause is not None and cause.group(1) != _PACKAGE:
                # the package is there; it fails for a dependency, which is what to fix
                missing |= (set(found) - {_PACKAGE}) | {cause.group(1)}
            else:
                missing |= set(found)
            what = "; ".join(f"{m} ({e})" for m, e in sorted(found.items()))
            lines.append(f"{where} cannot import {what}")
        elif report["version"] != version:
            other_version = True
            lines.append(f"{where} imports trilink_spark {report['version']} from "
                         f"{report['file']}, not the driver's {version}")
        if report["seen"] not in (None, "yes"):
            unseen = True
            seen = "" if report["seen"] == "no" else f" ({report['seen']})"
            lines.append(f"{where} cannot see state_path {shown}: the file the driver wrote "
                         f"there is not found{seen}")
    if not lines:
        return None
    fixes = []
    compiled = sorted(missing & set(COMPILED))
    pure = missing - set(COMPILED)
    again = sorted(pure & shipped)
    if again or (other_version and _PACKAGE in shipped):
        names = ", ".join(again) or _PACKAGE
        fixes.append(
            f"tl.ship(spark) already added {names} to this session, and the executors still "
            "do not import it from there: an older copy in the executors' own Python comes "
            "first, or they dropped the files (an executor started since: call tl.ship on a "
            f"new session). Remove that copy there, or pip install {names} in the executors' "
            "Python")
    unshippable = sorted(pure - shipped) if shipped else []
    if unshippable:
        fixes.append(
            f"tl.ship(spark) was called but could not bring {', '.join(unshippable)}: it is "
            "not installed in this (the driver's) Python, and ship carries only what is "
            f"installed here: pip install {' '.join(unshippable)} here and call tl.ship(spark) "
            "again, or install it in the executors' Python")
    if not shipped and (pure or other_version):
        fixes.append(
            "call tl.ship(spark) before the first operator: it adds the package and its "
            "pure-Python dependencies to the executors' Python path (or pass the package as a "
            ".zip in spark.submit.pyFiles / --py-files: a .whl there is not put on the path)")
    if compiled:
        fixes.append(
            f"{', '.join(compiled)} {'holds' if len(compiled) == 1 else 'hold'} compiled code, "
            "which no zip can bring: install it in the executors' Python, or ship a packed "
            "virtual environment with spark.archives (venv-pack or conda-pack) and set "
            "spark.pyspark.python (PYSPARK_PYTHON) to ./environment/bin/python")
    if unseen:
        relative = shown is not None and "://" not in shown and not shown.startswith("/")
        fixes.append(
            "state_path must be storage the driver and every executor share, at the same "
            "path: HDFS, S3 or GCS through pyarrow.fs (hdfs://, s3://, gs://), or a shared "
            "mount such as NFS" + (" (and absolute: a relative path is relative to each "
                                   "process's working directory)" if relative else ""))
    shown_lines = lines[:10] + ([f"and {len(lines) - 10} more"] if len(lines) > 10 else [])
    return ("trilink-spark's tasks cannot run on the executors: " + "; ".join(shown_lines)
            + ". Fix: " + "; ".join(fixes) + f". See {README_SECTION}.")


def _distinct(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One report per host, Python and finding (the tasks of one executor say the same)."""
    out: dict[str, dict[str, Any]] = {}
    for report in reports:
        shape = {k: v for k, v in report.items() if k != "pid"}
        out.setdefault(json.dumps(shape, sort_keys=True), report)
    return [out[k] for k in sorted(out)]


def _probe(driver_version: str, marker: str | None,
           filesystem: Any) -> Callable[[int], str | None]:
    """The check's UDF: the first row of each task reports, the others give None. Nested,
    so cloudpickle ships it by value; it reads nothing of this module (only its closure).
    A Python worker that imported another version of the package than the driver's forgets
    it again, so that the version ``tl.ship`` adds is the one its next task imports. The
    driver's ``marker`` file is looked up in ``filesystem`` (a ``pyarrow.fs`` one, given only
    once every executor was seen to import pyarrow), or, when that is None, as a path of the
    executor's own filesystem."""
    reported: list[bool] = []

    def probe(_: int) -> str | None:
        import json
        import os
        import socket
        import sys

        if reported:
            return None
        reported.append(True)
        missing: dict[str, str] = {}

        def why(err: BaseException) -> str:
            return f"{type(err).__name__}: {err}"[:300]

        # one import statement each: the check must be what a task's unpickling does
        try:
            import numpy  # noqa: F401
        except Exception as err:
            missing["numpy"] = why(err)
        try:
            import pandas  # noqa: F401
        except Exception as err:
            missing["pandas"] = why(err)
        try:
            import pyarrow  # noqa: F401
        except Exception as err:
            missing["pyarrow"] = why(err)
        try:
            import mmh3  # noqa: F401
        except Exception as err:
            missing["mmh3"] = why(err)
        try:
            import sortedcontainers  # noqa: F401
        except Exception as err:
            missing["sortedcontainers"] = why(err)
        try:
            import rocksdict  # noqa: F401
        except Exception as err:
            missing["rocksdict"] = why(err)
        version = path = None
        try:
            import trilink_spark.errors  # noqa: F401  (the whole package, as a task's would)

            package = sys.modules["trilink_spark"]
            version = getattr(package, "__version__", None)
            path = getattr(package, "__file__", None)
            if version != driver_version:
                for name in [m for m in sys.modules
                             if m == "trilink_spark" or m.startswith("trilink_spark.")]:
                    del sys.modules[name]
        except Exception as err:
            missing["trilink_spark"] = why(err)
        seen = None
        if marker is not None and filesystem is None:
            seen = "yes" if os.path.isfile(marker) else "no"
        elif marker is not None and filesystem is not None:
            try:
                from pyarrow import fs

                kind = filesystem.get_file_info(marker).type
                seen = "yes" if kind == fs.FileType.File else "no"
            except Exception as err:
                seen = why(err)
        return json.dumps({"host": socket.gethostname(), "python": sys.executable,
                           "pid": os.getpid(), "missing": missing, "version": version,
                           "file": path, "seen": seen})

    return probe
