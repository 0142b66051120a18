"""Keyed tasks find their local copies on a standalone cluster (two workers, one core each):
with ``spark.trilink.state.locality=true`` every task after the first batches runs on the
executor that ran its partition last and finds its copy ``current``; without it, Spark's own
placement leaves tasks catching up; an executor killed mid-run hands its partitions to the
other, which rebuild (from incremental snapshots' table files) or catch up from the state
path, with exact counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import trilink_spark
from trilink_spark.testing import SparkStandalone

from test_standalone import clean_env, java_missing  # beside this file

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(java_missing(), reason="a Spark standalone cluster needs Java")]

DRIVER = Path(__file__).with_name("locality_driver.py")
SOURCE_ROOT = Path(trilink_spark.__file__).resolve().parent.parent


def drive(tmp_path: Path, locality: str, kill_after: int = 0) -> dict:
    work = tmp_path / f"work-{locality}-{kill_after}"
    work.mkdir()
    with SparkStandalone(workers=2, cores=1, memory="1g", workdir=work / "cluster") as cluster:
        env = {**clean_env(), "PYTHONPATH": str(SOURCE_ROOT), "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        done = subprocess.run([sys.executable, str(DRIVER), cluster.master_url, str(work),
                               locality, str(kill_after)], env=env, capture_output=True,
                              text=True, timeout=400)
        logs = cluster.log_tails(lines=20) if done.returncode else {}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert done.returncode == 0 and lines, (done.stdout[-3000:], done.stderr[-6000:], logs)
    return json.loads(lines[-1])


def test_tasks_run_where_their_copies_are(tmp_path: Path) -> None:
    found = drive(tmp_path, "true")
    assert found["exact"] and found["keys"] == 2000
    batches = found["batches"]
    # every task names the executor it ran on; both executors take part
    assert all(len(b["executors"]) == 4 and all(b["executors"]) for b in batches)
    assert len({e for b in batches for e in b["executors"]}) == 2
    # after the first two batches every partition stays on its executor, and finds its copy
    steady = batches[2:]
    assert all(b["executors"] == steady[0]["executors"] for b in steady), batches
    assert all(s == "current" for b in steady for s in b["sync"]), batches
    assert found["locality"]["stayed"] >= 4 * len(steady)
    assert found["locality"]["lost"] == 0


def test_a_lost_executor_hands_its_partitions_on(tmp_path: Path) -> None:
    found = drive(tmp_path, "true", kill_after=3)
    assert found["killed"] is not None
    assert found["exact"] and found["keys"] == 2000
    batches = found["batches"]
    victim = found["killed"]
    assert victim in batches[3]["executors"]
    # the batches after the kill never run on the dead executor, and the partitions it held
    # caught up or rebuilt on another one
    after = batches[4:]
    assert all(victim not in b["executors"] for b in after), batches
    moved = [p for p, e in enumerate(batches[3]["executors"]) if e == victim]
    assert {after[0]["sync"][p] for p in moved} <= {"catch-up", "rebuild"}, batches
    # snapshots are incremental on the cluster too (every partition took one, written off the
    # task at the lowest priority: seen once the writers are done), and pruning kept every
    # file a snapshot lists
    assert all(t is not None for t in found["tables_final"]), (found["tables_final"], batches)
    assert found["referenced_present"]
    assert found["locality"]["moved"] >= len(moved) and found["locality"]["lost"] >= len(moved)
