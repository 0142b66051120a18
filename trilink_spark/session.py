"""SparkSession helpers and the ``spark.trilink.*`` configuration keys.

Job-wide defaults can be set as Spark conf; keyword arguments always win:

========================== ======= =====================================================
key                        default meaning
========================== ======= =====================================================
spark.trilink.sampleRate   0.01    fraction of rows ``strategy="auto"`` samples
spark.trilink.minSample    10000   fewer sampled rows than this: auto counts every row
spark.trilink.nullPolicy   error   ``error`` or ``partition0`` for null keys
spark.trilink.fit          full    how table strategies learn keys in ``key_by``
========================== ======= =====================================================
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["get_session", "conf_get", "CONF_PREFIX"]

CONF_PREFIX = "spark.trilink."


def get_session(
    master: str = "local[*]",
    app_name: str = "trilink-spark",
    shuffle_partitions: int | None = None,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """The active SparkSession, or a new local one with the UI off and Arrow on.

    Python workers use the running interpreter (``PYSPARK_PYTHON`` is set to it when unset), so
    a virtual environment's packages reach the tasks.

    Examples
    --------
    >>> spark = get_session("local[2]", shuffle_partitions=4)  # doctest: +SKIP
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def conf_get(spark: SparkSession, name: str, default: str) -> str:
    """``spark.trilink.<name>`` from the session conf, else ``default``."""
    value = spark.conf.get(CONF_PREFIX + name, None)
    return default if value is None else str(value)
