"""SparkSession helpers and the ``spark.trilink.*`` configuration keys.

Job-wide defaults can be set as Spark conf; keyword arguments always win:

==================================== ======= ====================================================
key                                  default meaning
==================================== ======= ====================================================
spark.trilink.sampleRate             0.01    fraction of rows ``strategy="auto"`` samples
spark.trilink.minSample              10000   fewer sampled rows than this: auto counts every row
spark.trilink.nullPolicy             group   null keys: ``group`` (a key of its own, as in
                                             ``groupBy``, on ``pmod(42, n)``), ``error`` or
                                             ``partition0``
spark.trilink.fit                    full    how table strategies learn keys in ``key_by``
spark.trilink.compactPartitions      auto    whether ``key_by`` runs no task for empty partitions
spark.trilink.operatorTiming         unset   directory where trilink operators' tasks time
                                             themselves (:mod:`trilink_spark._internal.optiming`)
spark.trilink.mergeEngine            auto    the engine of ``local_merge`` and ``global_merge``
                                             when the call gives none (``engine="auto"``):
                                             ``auto`` (Spark's aggregation in the JVM where
                                             the call allows it, else Python), ``python``
                                             (always Python) or ``spark`` (as ``auto``)
spark.trilink.keyedEngine            auto    ``keyed_process``'s engine for ``engine="auto"``:
                                             ``auto`` (a Spark plan for the built-in
                                             ``KeyedWindowAggregate``, else Python),
                                             ``python`` (always the Python runtime) or
                                             ``spark`` (as ``auto``)
spark.trilink.state.store            rocksdb ``keyed_foreach_batch``'s state store: ``rocksdb``
                                             (executor-local copies) or ``files``
spark.trilink.state.localDir         unset   where executors keep the local copies (default the
                                             executor's local directory)
spark.trilink.state.snapshotInterval 10      at least this many batches between two
                                             snapshots of a partition (and changelogs since
                                             that hold as many rows as it has keys)
spark.trilink.state.keepOpen         true    a task leaves its local copy open in its Python
                                             worker for the partition's next task there
spark.trilink.state.blockPlans       auto    plan swaps between block tables from the local
                                             copies by blocks (``true``, ``false``, ``auto``:
                                             a given table from 64 MiB of state, not a refit)
==================================== ======= ====================================================
"""

from __future__ import annotations

import json
import os
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, InvalidArgumentError
from ..validation import count
from .compat import is_connect
from .executors import is_local_master

#: The address local sessions bind.
LOOPBACK = "127.0.0.1"

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["get_session", "conf_get", "conf_count", "session_confs", "CONF_PREFIX"]

CONF_PREFIX = "spark.trilink."


def get_session(
    master: str = "local[*]",
    app_name: str = "trilink-spark",
    shuffle_partitions: int | None = None,
    extra_conf: dict[str, str] | None = None,
    *,
    remote: str | None = None,
) -> SparkSession:
    """The active SparkSession, or a new one: classic local with the UI off and Arrow on, or
    Spark Connect.

    Parameters
    ----------
    master : str
        Master of a new classic session.
    app_name : str
        Application name of a new classic session.
    shuffle_partitions : int, optional
        ``spark.sql.shuffle.partitions`` of a new session.
    extra_conf : dict of str to str, optional
        More settings of a new session. On Spark Connect only runtime settings (most
        ``spark.sql.*`` keys) can be set; others are refused by the server with a warning.
    remote : str, optional
        Start a Spark Connect session instead: ``"sc://host:15002"`` for a running Spark
        Connect server, or a master such as ``"local[2]"`` to start a local server in this
        process. The environment variable ``SPARK_REMOTE`` does the same when ``remote`` is
        not given. The server's own settings (UI, log level) are left as they are. A classic
        and a Connect session cannot run in the same Python process.

    Returns
    -------
    pyspark.sql.SparkSession
        The active session of either kind if there is one (the arguments are then ignored),
        else the new one.

    Notes
    -----
    Python workers use the running interpreter (``PYSPARK_PYTHON`` is set to it when unset),
    so a virtual environment's packages reach the tasks (on a local Connect server too). A
    local master binds the loopback address, 127.0.0.1 (``SPARK_LOCAL_IP`` is set to it when
    unset, and ``spark.driver.host`` and ``spark.driver.bindAddress`` to it unless
    ``extra_conf`` says otherwise), so that a local job opens no port on the machine's network
    and Spark does not warn that it picked another interface's address.
    Cost: starting a JVM (or connecting to a server) when no session is active.

    Examples
    --------
    >>> spark = get_session("local[2]", shuffle_partitions=4)  # doctest: +SKIP
    >>> connect = get_session(remote="local[2]")  # doctest: +SKIP
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    remote = remote if remote is not None else os.environ.get("SPARK_REMOTE") or None
    local = is_local_master(remote if remote is not None else master)
    if local:  # nothing leaves the machine: bind the loopback, not the first interface
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    if remote is not None:
        builder = SparkSession.builder.remote(remote)
    else:
        builder = (
            SparkSession.builder.master(master)
            .appName(app_name)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        )
        if local:
            builder = (builder.config("spark.driver.host", LOOPBACK)
                       .config("spark.driver.bindAddress", LOOPBACK))
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if remote is None:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


_MAPPER_LOCK = threading.Lock()
#: Per SparkContext: a JSON writer in its JVM (built once).
_MAPPERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def session_confs(spark: SparkSession) -> dict[str, str]:
    """Every conf set on ``spark`` (as ``spark.conf.getAll``), read at once: what
    :func:`conf_get` gives when passed the result instead of the session.

    Notes
    -----
    Cost: classic, three Py4J commands (PySpark's ``getAll`` sends one per conf); Spark
    Connect, one request.

    Examples
    --------
    >>> conf_get(session_confs(spark), "state.store", "rocksdb")  # doctest: +SKIP
    'rocksdb'
    """
    if is_connect(spark):
        return {str(k): str(v) for k, v in spark.conf.getAll.items() if v is not None}
    sc = spark.sparkContext
    with _MAPPER_LOCK:
        mapper = _MAPPERS.get(sc)
        if mapper is None:
            jvm: Any = sc._jvm
            mapper = _MAPPERS[sc] = jvm.com.fasterxml.jackson.databind.ObjectMapper()
    values = json.loads(mapper.writeValueAsString(spark._jsparkSession.conf().getAllAsJava()))
    if not isinstance(values, dict):
        raise ConfigError(f"the session's confs read as {type(values).__name__}, not a map "
                          "of strings")
    return {str(k): str(v) for k, v in values.items() if v is not None}


def conf_get(spark: SparkSession | Mapping[str, str], name: str, default: str) -> str:
    """``spark.trilink.<name>`` from the session conf (or from ``spark``, what
    :func:`session_confs` read of it), else ``default``."""
    value = (spark.get(CONF_PREFIX + name) if isinstance(spark, Mapping)
             else spark.conf.get(CONF_PREFIX + name, None))
    return default if value is None else str(value)


def conf_count(spark: SparkSession | Mapping[str, str], name: str, default: int,
               low: int = 1) -> int:
    """``spark.trilink.<name>`` as a whole number >= ``low`` (unset or blank: ``default``).

    Raises
    ------
    InvalidArgumentError
        Anything else is set (the message names the conf and the value).
    """
    raw = conf_get(spark, name, "").strip()
    if raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()):
        raise InvalidArgumentError(
            f"{CONF_PREFIX}{name} must be a whole number >= {low}, got {raw!r}")
    return count(int(raw), CONF_PREFIX + name, low, plain=True)
