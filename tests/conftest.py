"""Shared fixtures: one local SparkSession for the whole test session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("PYTHONHASHSEED", "0")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    import trilink_spark as tl

    session = tl.get_session(
        "local[2]",
        app_name="trilink-spark-tests",
        shuffle_partitions=4,
        extra_conf={
            "spark.default.parallelism": "2",
            "spark.executorEnv.PYTHONHASHSEED": "0",
        },
    )
    yield session
    session.stop()
