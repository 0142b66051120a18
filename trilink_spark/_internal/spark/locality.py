"""Run each partition's task on the executor that ran it last: preferred locations for a stage.

A keyed partition's executor-local copy lives on the executor whose task ran it last. Spark
gives a task to whichever executor is free, so on a cluster a partition comes back to its copy
about once every E batches and catches up or rebuilds in the others. Spark's own state store
avoids this by asking for the executor that loaded the store as the task's preferred location
(``StateStoreRDD.getPreferredLocations``); a DataFrame has no such hook, and neither a cached
anchor nor a zip with one reaches the scheduler (a zip's preferences are the shuffle's hosts,
and the cache's locations are never consulted below it).

:func:`prefer` gives a frame that hook with the package's one piece of JVM code,
``trilinkspark.PreferredRDD`` (``jvm/src``, built into ``jars/trilink-spark-jvm.jar`` by
``make jar``): the frame's RDD, partition for partition, whose partition ``i`` asks for a given
executor (``executor_<host>_<id>``, PROCESS_LOCAL to Spark's scheduler, which waits up to
``spark.locality.wait`` for it while it is alive) and records where its task ran: in the
task's local property :data:`EXECUTOR_PROPERTY` (read by :func:`task_executor` in the Python
worker) and in an accumulator the driver reads after the job (:meth:`Preferred.ran`).

The class is loaded on the driver by a class loader of its own over the jar, and the jar is
added to the session (``SparkContext.addJar``) so that executors can deserialise the tasks:
once per SparkContext. Classic sessions only; on Spark Connect, and where the jar cannot be
loaded, :func:`prefer` returns None and the stage runs where Spark puts it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..validation import choice
from .compat import is_connect
from .session import conf_get

__all__ = ["JAR", "EXECUTOR_PROPERTY", "LOCALITY_MODES", "Where", "Preferred", "prefer",
           "locality_enabled", "task_executor", "live_executors", "new_counts"]

logger = logging.getLogger(__name__)

#: The package's JVM classes (built from ``jvm/src`` by ``tools/build_jar.py``).
JAR = Path(__file__).with_name("jars") / "trilink-spark-jvm.jar"
_CLASS = "trilinkspark.PreferredRDD"
#: The task local property that names the executor (``"<id>\t<host>"``) a task ran on.
EXECUTOR_PROPERTY = "spark.trilink.task.executor"
#: ``spark.trilink.state.locality``: ``auto`` (on for a cluster master on a classic session),
#: ``true`` (also in local mode) or ``false``.
LOCALITY_MODES = ("auto", "true", "false")

_LOCK = threading.Lock()
#: Per JVM SparkContext (by its Py4J object id): the class's constructor, or the reason the
#: jar could not be loaded (logged once).
_LOADED: dict[str, Any] = {}


@dataclass(frozen=True)
class Where:
    """The executor a task ran on: Spark's executor id and its host."""

    executor: str
    host: str

    @property
    def location(self) -> str:
        """The task location that asks for this executor (``executor_<host>_<id>``)."""
        return f"executor_{self.host}_{self.executor}"


class Preferred:
    """A frame whose partitions prefer given executors (:func:`prefer`), and where its tasks
    ran."""

    def __init__(self, frame: Any, accumulator: Any) -> None:
        self.frame = frame
        self._accumulator = accumulator

    def ran(self) -> dict[int, Where]:
        """Where each partition's last successful task ran, over every job run on
        :attr:`frame` so far (a partition run twice: its later run). One Py4J call and
        O(tasks)."""
        out: dict[int, Where] = {}
        for entry in list(self._accumulator.value()):
            parts = str(entry).split("\t")
            if len(parts) == 3 and parts[0].isdigit():
                out[int(parts[0])] = Where(parts[1], parts[2])
        return out


def locality_enabled(spark: Any, confs: Mapping[str, str] | None = None) -> bool:
    """Whether keyed stages ask for their copies' executors: ``spark.trilink.state.locality``
    (``auto``: on a classic session whose master is not ``local``). One conf read, none
    from ``confs`` (the session's, :func:`~trilink_spark._internal.spark.session.session_confs`).

    Raises
    ------
    InvalidArgumentError
        The conf is not one of :data:`LOCALITY_MODES`.
    """
    if is_connect(spark):
        return False
    mode = choice(conf_get(spark if confs is None else confs, "state.locality", "auto")
                  .strip().lower(),
                  "spark.trilink.state.locality", LOCALITY_MODES)
    if mode == "auto":
        return not str(spark.sparkContext.master).startswith("local")
    return mode == "true"


def _constructor(spark: Any) -> Any:
    """``PreferredRDD``'s constructor in this session's JVM, loaded once per SparkContext;
    None (logged once) where the jar cannot be loaded."""
    sc = spark.sparkContext
    jsc = sc._jsc.sc()
    key = str(jsc.applicationId()) + ":" + str(jsc.startTime())
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        ctor = None
        try:
            if not JAR.is_file():
                raise FileNotFoundError(str(JAR))
            jvm = sc._jvm
            urls = sc._gateway.new_array(jvm.java.net.URL, 1)
            urls[0] = jvm.java.io.File(str(JAR)).toURI().toURL()
            parent = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
            loader = jvm.java.net.URLClassLoader(urls, parent)
            ctor = loader.loadClass(_CLASS).getConstructors()[0]
            sc._jsc.addJar(str(JAR))  # the executors deserialise the class from it
        except Exception as err:  # noqa: BLE001 - any failure leaves Spark's own placement
            logger.warning("keyed tasks run where Spark puts them: the locality helper %s "
                           "could not be loaded (%s)", JAR, err)
            ctor = None
        _LOADED[key] = ctor
        return ctor


def prefer(df: Any, locations: Sequence[Where | None]) -> Preferred | None:
    """``df``, partition for partition, with partition ``i`` preferring ``locations[i]``.

    Parameters
    ----------
    df : DataFrame
        A classic DataFrame; its plan is executed up to its last exchange now (as
        ``df.rdd`` does), the rest when the returned frame runs.
    locations : sequence of Where or None
        One per partition (shorter: the rest prefer nothing).

    Returns
    -------
    Preferred or None
        The frame and where its tasks ran; None on Spark Connect or where the helper jar
        cannot be loaded (logged once), and the caller keeps ``df``.

    Notes
    -----
    Cost: about 10 Py4J calls and O(partitions) strings on the driver; no stage, no shuffle
    and no copy of the rows (a one-to-one dependency). The scheduler waits up to
    ``spark.locality.wait`` (3 s by default) for a preferred executor that is alive and busy.

    Examples
    --------
    >>> seen = prefer(df, [None] * 4)  # doctest: +SKIP
    >>> seen.frame.count(); seen.ran()[0].executor  # doctest: +SKIP
    """
    from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

    spark = df.sparkSession
    if is_connect(spark):
        return None
    ctor = _constructor(spark)
    if ctor is None:
        return None
    sc = spark.sparkContext
    rows = df._jdf.queryExecution().toRdd()  # a task's error here is the batch's own
    try:
        gateway = sc._gateway
        jvm = sc._jvm
        names = gateway.new_array(jvm.java.lang.String, len(locations))
        for i, where in enumerate(locations):
            if where is not None:
                names[i] = where.location
        accumulator = sc._jsc.sc().collectionAccumulator("trilink.locality")
        args = gateway.new_array(jvm.java.lang.Object, 4)
        args[0] = rows
        args[1] = names
        args[2] = accumulator
        args[3] = EXECUTOR_PROPERTY
        rdd = ctor.newInstance(args)
        jdf = spark._jsparkSession.internalCreateDataFrame(rdd, df._jdf.schema(), False)
    except Exception as err:  # noqa: BLE001 - a JVM without the hooks: Spark places the tasks
        key = "unusable:" + str(sc._jsc.sc().applicationId())
        with _LOCK:
            told = key in _LOADED
            _LOADED[key] = True
        if not told:
            logger.warning("keyed tasks run where Spark puts them: this Spark does not take "
                           "the locality helper (%s: %s)", type(err).__name__, err)
        return None
    return Preferred(ClassicFrame(jdf, spark), accumulator)


def task_executor() -> Where | None:
    """In a Python task below :func:`prefer`'s frame: the executor it runs on (None
    elsewhere). O(1)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    raw = None if context is None else context.getLocalProperty(EXECUTOR_PROPERTY)
    if not raw or "\t" not in raw:
        return None
    executor, host = raw.split("\t", 1)
    return Where(executor, host)


def live_executors(spark: Any) -> set[str] | None:
    """The ids of the session's live executors (None where they cannot be read: Spark
    Connect, or a JVM without the call). One Py4J call."""
    try:
        ids = spark.sparkContext._jsc.sc().getExecutorIds().mkString("\t")
    except Exception:  # noqa: BLE001 - callers only name lost executors with it
        return None
    return {i for i in str(ids).split("\t") if i}


def new_counts() -> dict[str, int]:
    """A runner's locality counts: tasks that ran where their copy was (``stayed``), that ran
    elsewhere (``moved``), and of those, away from an executor that was gone (``lost``)."""
    return {"stayed": 0, "moved": 0, "lost": 0}
