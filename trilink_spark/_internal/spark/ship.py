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
import logging
import os
import shutil
import sys
import tempfile
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from .compat import is_connect
from .executors import ensure_executors, session_key

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ship", "zip_package", "PURE_DEPENDENCIES"]

logger = logging.getLogger(__name__)

#: Pure-Python packages shipped with the package when they are installed here: sortedcontainers
#: (timers of keyed process functions), redis (the tasks of a ``RedisStore`` merge) and kafka
#: (kafka-python, the tasks of the trilink-kafka source and sink).
PURE_DEPENDENCIES = ("sortedcontainers", "redis", "kafka")
#: File endings of compiled extension modules, which a zip on the Python path cannot load.
COMPILED_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")

_PACKAGE = "trilink_spark"
#: One fixed time for every zip entry, so the same files give the same bytes.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_lock = threading.Lock()
_shipped: dict[str, list[str]] = {}  # session key -> the zips added to it, in order
_workdir: list[str] = []  # this process's directory of zips, made at the first ship


def _source(name: str) -> Path:
    """The directory (a package) or file (a module) ``name`` is imported from here: the
    imported module's own, else the first directory of ``sys.path`` that has it (not a zip:
    ``addPyFile`` puts the shipped zips on the driver's path too)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise InvalidArgumentError(
            f"packages names top-level importable packages (such as 'sortedcontainers'), "
            f"got {name!r}")
    if name in sys.stdlib_module_names:
        raise InvalidArgumentError(
            f"{name!r} is in Python's standard library: the executors' Python has its own")
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    if spec is None or not _on_disk(spec):
        directories = [p or os.getcwd() for p in sys.path if os.path.isdir(p or os.getcwd())]
        spec = importlib.machinery.PathFinder.find_spec(name, directories)
    if spec is None:
        raise InvalidArgumentError(f"package {name!r} is not installed in the driver's Python")
    if spec.submodule_search_locations is not None:
        places = list(spec.submodule_search_locations)
        if spec.origin is None or len(places) != 1:
            raise InvalidArgumentError(
                f"{name!r} is a namespace package (in {len(places)} directories); ship its "
                "subpackages' distributions as zips yourself")
        return Path(places[0])
    if spec.origin is None or not spec.origin.endswith(".py"):
        raise InvalidArgumentError(
            f"{name!r} is not pure Python ({spec.origin}): install it in the executors' Python")
    return Path(spec.origin)


def _on_disk(spec: Any) -> bool:
    """Whether a module spec's files are a directory or file of their own (not in a zip)."""
    places = list(spec.submodule_search_locations or [])
    if places:
        return all(os.path.isdir(p) for p in places)
    return spec.origin is not None and os.path.isfile(spec.origin)


def _files(source: Path) -> list[tuple[str, Path]]:
    """``(name in the zip, file)``, sorted; caches (``__pycache__``, ``.pyc``) left out."""
    if source.is_file():
        return [(source.name, source)]
    out = []
    for path in source.rglob("*"):
        relative = path.relative_to(source.parent)
        if (not path.is_file() or "__pycache__" in relative.parts
                or path.suffix in (".pyc", ".pyo")):
            continue
        out.append((relative.as_posix(), path))
    return sorted(out)


def zip_package(name: str) -> Path:
    """A zip of the installed pure-Python package ``name``, for an executor's Python path.

    Parameters
    ----------
    name : str
        A top-level import name (``"trilink_spark"``, ``"sortedcontainers"``).

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
        ``name`` is not installed here, is in the standard library, is a namespace package,
        or holds compiled extension modules (which a zip cannot load: they must be installed
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
    source = _source(name)
    files = _files(source)
    compiled = [arc for arc, _ in files if arc.endswith(COMPILED_SUFFIXES)]
    if compiled:
        raise InvalidArgumentError(
            f"{name!r} holds compiled extension modules ({', '.join(compiled[:3])}), which a "
            "zip on the Python path cannot load: install it in the executors' Python, or ship "
            "a packed virtual environment with spark.archives")
    digest = hashlib.sha256()
    contents = []
    for arc, path in files:
        data = path.read_bytes()
        digest.update(arc.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        contents.append((arc, data))
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


def ship(spark: SparkSession, *, packages: Sequence[str] = (), check: bool = True) -> list[str]:
    """Make this installed trilink-spark importable on the session's executors, in one call.

    Zips the package's directory (as imported here, caches left out) and the installed
    pure-Python packages it uses (:data:`PURE_DEPENDENCIES`: sortedcontainers, and redis and
    kafka-python where installed), and adds each zip to the executors' Python path:
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
        A name in ``packages`` is not installed here or holds compiled code.
    ExecutorEnvironmentError
        With ``check``: an executor's Python still cannot import the package or one of its
        dependencies; the message names them, the host and the fix.

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
    key = session_key(spark)
    with _lock:
        have = _shipped.setdefault(key, [])
        new = [z for z in zips if z not in have]
        for path in new:
            if is_connect(spark):
                spark.addArtifacts(path, pyfile=True)
            else:
                spark.sparkContext.addPyFile(path)
            have.append(path)
        shipped = list(have)
    if new:
        logger.info("shipped to the executors of %s: %s", key,
                    ", ".join(os.path.basename(z) for z in new))
    else:
        logger.info("already shipped to the executors of %s: %s", key,
                    ", ".join(os.path.basename(z) for z in shipped))
    if check:
        ensure_executors(spark, always=True)
    return shipped

