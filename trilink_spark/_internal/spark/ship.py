"""``tl.ship(spark)``: make the installed package importable on a cluster's executors.

The package is pure Python, so a zip of its directory on the executors' Python path is enough
for it (PySpark puts ``.zip``, ``.egg`` and ``.jar`` files added with ``addPyFile`` or
``spark.submit.pyFiles`` on the path, not ``.whl`` files). :func:`ship` zips the directory it
was imported from, and the installed pure-Python packages it uses
(:data:`PURE_DEPENDENCIES`), and adds the zips to the session. The compiled dependencies
(numpy, pandas, pyarrow, mmh3, rocksdict) cannot come from a zip: they must be in the
executors' Python, for example a packed virtual environment given with ``spark.archives``.

Examples
--------
>>> zip_package("sortedcontainers").name.startswith("sortedcontainers-")
True
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import threading
import zipfile
import zipimport
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import ExecutorEnvironmentError, InvalidArgumentError
from ...errors import InvalidArgumentTypeError
from .compat import is_connect
from .executors import ensure_executors, executor_environment_key, note_shipped

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ship", "zip_package", "PURE_DEPENDENCIES", "SPARK_PACKAGES"]

logger = logging.getLogger(__name__)

#: Pure-Python packages shipped with the package when they are installed here: sortedcontainers
#: (timers of keyed process functions), redis (the tasks of a ``RedisStore`` merge) and kafka
#: (kafka-python, the tasks of the trilink-kafka source and sink).
PURE_DEPENDENCIES = ("sortedcontainers", "redis", "kafka")
#: Spark's own Python packages: every executor runs the copy of its Spark (on its path before
#: any shipped file), and the installed pyspark holds Spark's jars (hundreds of MB).
SPARK_PACKAGES = ("pyspark", "py4j")
#: File endings of compiled extension modules, which a zip on the Python path cannot load.
COMPILED_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")

_PACKAGE = "trilink_spark"
#: One fixed time for every zip entry, so the same files give the same bytes.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_lock = threading.Lock()
_shipped: dict[str, list[str]] = {}  # session key -> the zips added to it, in order
_workdir: list[str] = []  # this process's directory of zips, made at the first ship


def _spec(name: str) -> Any:
    """The module spec of ``name`` whose files to ship: the imported module's own (the code
    the driver runs) when its files can be read (a directory, a file, or a zip that still
    exists), else the first directory of ``sys.path`` that has it (not a zip: ``addPyFile``
    puts the shipped zips on the driver's path too), else whatever the import system finds
    (an import hook such as an editable install's, a zip or egg on the path)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise InvalidArgumentError(
            f"packages names top-level importable packages (such as 'sortedcontainers'), "
            f"got {name!r}")
    if name in sys.stdlib_module_names:
        raise InvalidArgumentError(
            f"{name!r} is in Python's standard library: the executors' Python has its own")
    if name in SPARK_PACKAGES:
        raise InvalidArgumentError(
            f"{name!r} is Spark's own Python package: each executor runs its Spark's copy (a "
            "zip of the installed one would carry Spark's jars, hundreds of MB)")
    spec = getattr(sys.modules.get(name), "__spec__", None)
    if spec is not None and _readable(spec):
        return spec
    directories = [p or os.getcwd() for p in sys.path if os.path.isdir(p or os.getcwd())]
    spec = importlib.machinery.PathFinder.find_spec(name, directories)
    if spec is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
    if spec is None or not _readable(spec):
        raise InvalidArgumentError(f"package {name!r} is not installed in the driver's Python")
    return spec


def _archive(spec: Any) -> tuple[str, str] | None:
    """``(zip file, prefix in it)`` of a spec that ``zipimport`` found (a zip or an egg on
    ``sys.path``, such as ``--py-files``), else None."""
    loader = spec.loader
    if isinstance(loader, zipimport.zipimporter) and os.path.isfile(loader.archive):
        return loader.archive, loader.prefix
    return None


def _readable(spec: Any) -> bool:
    """Whether a spec's files can be read here: its own directories or file, or the zip that
    ``zipimport`` reads them from."""
    if _archive(spec) is not None:
        return True
    places = list(spec.submodule_search_locations or [])
    if places:
        return all(os.path.isdir(p) for p in places)
    return spec.origin is not None and os.path.isfile(spec.origin)


def _shipped_file(arc: str) -> bool:
    """Whether a file of a package goes into its zip: caches (``__pycache__``, ``.pyc``,
    ``.pyo``) and directory entries stay out."""
    parts = arc.split("/")
    return (not arc.endswith("/") and "__pycache__" not in parts
            and not arc.endswith((".pyc", ".pyo")))


def _contents(name: str) -> list[tuple[str, bytes]]:
    """``(name in the zip, bytes)`` of every file of ``name`` that is shipped, sorted."""
    spec = _spec(name)
    places = spec.submodule_search_locations
    if places is not None and (spec.origin is None or len(list(places)) != 1):
        count = len(list(places))
        raise InvalidArgumentError(
            f"{name!r} is a namespace package (in {count} "
            f"director{'y' if count == 1 else 'ies'}); ship its subpackages' distributions as "
            "zips yourself")
    if places is None and (spec.origin is None or not spec.origin.endswith(".py")):
        raise InvalidArgumentError(
            f"{name!r} is not pure Python ({spec.origin}): install it in the executors' Python")
    found = _archive(spec)
    if found is not None:
        archive, prefix = found
        top = f"{prefix}{name}/" if places is not None else f"{prefix}{name}.py"
        with zipfile.ZipFile(archive) as source:
            out = [(entry[len(prefix):], source.read(entry)) for entry in source.namelist()
                   if (entry.startswith(top) if places is not None else entry == top)
                   and _shipped_file(entry)]
        return sorted(out)
    if places is None:
        origin = Path(spec.origin)
        return [(origin.name, origin.read_bytes())]
    root = Path(list(places)[0])
    out = []
    for path in root.rglob("*"):
        arc = path.relative_to(root.parent).as_posix()
        if path.is_file() and _shipped_file(arc):
            out.append((arc, path.read_bytes()))
    return sorted(out)


def zip_package(name: str) -> Path:
    """A zip of the installed pure-Python package ``name``, for an executor's Python path.

    Parameters
    ----------
    name : str
        A top-level import name (``"trilink_spark"``, ``"sortedcontainers"``): a package
        or module imported here (its files as imported: a directory, or the zip or egg it
        came from, such as a ``--py-files`` zip), else found on ``sys.path`` or through an
        import hook (an editable install).

    Returns
    -------
    pathlib.Path
        ``<temporary directory>/<name>-<content hash>.zip``. The same files give the same
        bytes (sorted entries, one fixed time and mode), and a zip already made for the same
        content in this process is returned as it is. The directory is this process's own,
        removed when it exits.

    Raises
    ------
    InvalidArgumentError
        ``name`` is not installed here, is in the standard library or Spark's own
        (:data:`SPARK_PACKAGES`), is a namespace package, or holds compiled extension modules (which a zip cannot load: they must be installed
        in the executors' Python).

    Notes
    -----
    Cost: every file of the package is read and hashed (O(package size), a few milliseconds
    for this one); the zip is written once per content.

    Examples
    --------
    >>> a, b = zip_package("sortedcontainers"), zip_package("sortedcontainers")
    >>> a == b and a.suffix == ".zip"
    True
    """
    contents = _contents(name)
    compiled = [arc for arc, _ in contents if arc.endswith(COMPILED_SUFFIXES)]
    if compiled:
        raise InvalidArgumentError(
            f"{name!r} holds compiled extension modules ({', '.join(compiled[:3])}), which a "
            "zip on the Python path cannot load: install it in the executors' Python, or ship "
            "a packed virtual environment with spark.archives")
    digest = hashlib.sha256()
    for arc, data in contents:
        digest.update(arc.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    with _lock:
        if not _workdir:
            made = tempfile.mkdtemp(prefix="trilink-ship-")
            atexit.register(shutil.rmtree, made, ignore_errors=True)
            _workdir.append(made)
        target = Path(_workdir[0]) / f"{name}-{digest.hexdigest()[:20]}.zip"
        if target.exists():
            return target
        partial = target.with_suffix(".zip.part")
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED,
                             compresslevel=6) as archive:
            for arc, data in contents:
                info = zipfile.ZipInfo(arc, date_time=_EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.create_system = 3  # the same header on every platform
                info.external_attr = 0o644 << 16
                archive.writestr(info, data)
        os.replace(partial, target)
    return target


def _refuse_changed(key: str, have: list[str], new: list[str]) -> None:
    """Raise when a zip in ``new`` is another content of a package whose zip ``have``
    (the session's) holds already."""
    shipped = {os.path.basename(z).rsplit("-", 1)[0]: os.path.basename(z) for z in have}
    for path in new:
        name = os.path.basename(path).rsplit("-", 1)[0]
        if name in shipped:
            raise ExecutorEnvironmentError(
                f"{name} changed since tl.ship added it to {key} ({shipped[name]}; now "
                f"{os.path.basename(path)}): the executors' Python workers keep the modules "
                "they imported, so some tasks would run the old files and some the new. "
                "Nothing was added: undo the change, or stop this session (spark.stop()) and "
                "call tl.ship on a new one")


def ship(spark: SparkSession, *, packages: Sequence[str] = (), check: bool = True) -> list[str]:
    """Make this installed trilink-spark importable on the session's executors, in one call.

    Zips the package as imported here (its directory, or the zip it came from; caches left
    out) and the installed pure-Python packages it uses (:data:`PURE_DEPENDENCIES`:
    sortedcontainers, and redis and kafka-python where installed), and adds each zip to the executors' Python path:
    ``spark.sparkContext.addPyFile`` on a classic session, ``spark.addArtifacts(...,
    pyfile=True)`` on Spark Connect. Calling it again on the same session (classic: the same
    application) adds nothing that is there already.

    Parameters
    ----------
    spark : pyspark.sql.SparkSession
        Classic or Spark Connect.
    packages : sequence of str
        More installed pure-Python packages to ship, by top-level import name.
    check : bool
        Then run one tiny Spark job that imports the package and its dependencies on the
        executors (:func:`~trilink_spark._internal.spark.executors.check_executors`), so
        that what a zip cannot bring (compiled dependencies) is reported now.

    Returns
    -------
    list of str
        The zips added to this session so far, this call's included (also logged).

    Raises
    ------
    InvalidArgumentError
        A name in ``packages`` is not installed here, holds compiled code, or is Python's
        or Spark's own (pyspark, py4j).
    ExecutorEnvironmentError
        A package shipped to this session before has changed on disk since (an edit, an
        upgrade): its Python workers keep the modules they imported, so some tasks would run
        the old files and some the new; nothing is added, and the message says to start a
        new session. With ``check``: an executor's Python still cannot import the package
        or one of its dependencies; the message names them, the host and the fix.

    Notes
    -----
    The zips take precedence over what the executors' Python has installed (PySpark puts
    them first on the path). numpy, pandas, pyarrow, mmh3 and rocksdict hold compiled code
    and cannot come from a zip: they must be in the executors' Python, for example a packed
    virtual environment (venv-pack, conda-pack) given with ``spark.archives`` and
    ``spark.pyspark.python`` (README, "Running on a cluster"). Executors that start later
    (dynamic allocation) fetch the zips too. The package is compiled from source on each
    executor's first import (a zip holds no bytecode cache): about a second per Python
    worker.

    Cost: reading and hashing the packages (a few milliseconds), each zip written once per
    content and process, one ``addPyFile`` (Connect: one upload) per new zip; with
    ``check``, one Spark job once per application (Connect: session).

    Examples
    --------
    >>> import trilink_spark as tl
    >>> spark = tl.get_session("spark://10.0.0.5:7077")  # doctest: +SKIP
    >>> tl.ship(spark)  # doctest: +SKIP
    ['/tmp/trilink-ship-k2a9/trilink_spark-3f9c....zip', '/tmp/.../sortedcontainers-....zip', ...]
    """
    if isinstance(packages, str):
        packages = (packages,)
    if not isinstance(packages, (list, tuple)) or not all(isinstance(n, str) for n in packages):
        raise InvalidArgumentTypeError(
            f"packages must be a list or tuple of package names (str), got {packages!r:.80}")
    zips = [str(zip_package(_PACKAGE))]
    for name in PURE_DEPENDENCIES:
        if name not in packages:
            try:
                zips.append(str(zip_package(name)))
            except InvalidArgumentError as err:  # not installed here, or not pure Python
                logger.debug("not shipping %s: %s", name, err)
    zips += [str(zip_package(name)) for name in dict.fromkeys(packages) if name != _PACKAGE]
    key = executor_environment_key(spark)
    with _lock:
        have = _shipped.setdefault(key, [])
        new = [z for z in zips if z not in have]
        _refuse_changed(key, have, new)
        for path in new:
            if is_connect(spark):
                spark.addArtifacts(path, pyfile=True)
            else:
                spark.sparkContext.addPyFile(path)
            have.append(path)
        shipped = list(have)
    note_shipped(key, [os.path.basename(z).rsplit("-", 1)[0] for z in shipped])
    if new:
        logger.info("shipped to the executors of %s: %s", key,
                    ", ".join(os.path.basename(z) for z in new))
    else:
        logger.info("already shipped to the executors of %s: %s", key,
                    ", ".join(os.path.basename(z) for z in shipped))
    if check:
        ensure_executors(spark, always=True)
    return shipped

