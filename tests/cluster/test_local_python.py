"""On a local master whose tasks run in another Python than the driver's (no PYSPARK_PYTHON,
so PySpark starts ``python3``), the executor check runs and names the fix, instead of a raw
``ModuleNotFoundError`` in the first task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import trilink_spark
from trilink_spark._internal.spark.executors import other_worker_python

from test_standalone import clean_env, java_missing, python_without_pyarrow  # beside this file

SOURCE_ROOT = Path(trilink_spark.__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
import pandas as pd
from pyspark.sql import SparkSession
import trilink_spark as tl
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
class Count(tl.KeyedWatermarkProcessFunction):
    output_schema = "k string, n long"
    state_schema = "n long"
    def process_on_time(self, key, rows, ctx):
        return [(key, len(rows))]
run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", Count(), 10.0,
                             sys.argv[1], num_partitions=2)
try:
    run(spark.createDataFrame(pd.DataFrame({"k": ["a"], "t": [1.0]})), 0)
    print(json.dumps({"raised": None}))
except Exception as err:
    print(json.dumps({"raised": type(err).__name__, "message": str(err)}))
"""


def test_the_workers_python_is_compared_with_this_one() -> None:
    def session(python: object) -> object:
        return SimpleNamespace(sparkContext=SimpleNamespace(pythonExec=python))

    assert other_worker_python(session(sys.executable)) is None
    assert other_worker_python(session(None)) is None
    assert other_worker_python(session("/no/such/python")) == "/no/such/python"


@pytest.mark.spark
@pytest.mark.skipif(java_missing(), reason="needs Java")
def test_a_local_master_on_another_python_gets_the_typed_error_and_the_fix(
        tmp_path: Path) -> None:
    other = python_without_pyarrow(tmp_path / "other")
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**clean_env(), "PYTHONPATH": str(SOURCE_ROOT), "PYSPARK_PYTHON": str(other),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "state")], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    found = json.loads(lines[-1])
    assert found["raised"] == "ExecutorEnvironmentError", found
    assert "pyarrow" in found["message"]
    assert f"PYSPARK_PYTHON={sys.executable}" in found["message"]
    assert "Traceback" not in found["message"]
