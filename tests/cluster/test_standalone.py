"""trilink-spark on a real Spark standalone cluster (a master and two workers on 127.0.0.1,
executors in JVMs of their own) whose executors' Python lacks the package: the typed error
before ``tl.ship``, exact results after it, a state path the executors cannot see, a keyed
stream rescaled mid-stream, and a second application whose executors' Python lacks pyarrow.
The driver runs in a subprocess (``cluster_driver.py``): the test session already holds a local
SparkSession."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

import trilink_spark
from trilink_spark.testing import SparkStandalone

pytestmark = pytest.mark.cluster

DRIVER = Path(__file__).with_name("cluster_driver.py")
#: Where this test's trilink_spark is imported from: the driver's PYTHONPATH, and only its.
SOURCE_ROOT = Path(trilink_spark.__file__).resolve().parent.parent


def java_missing() -> bool:
    home = os.environ.get("JAVA_HOME")
    return not ((home and Path(home, "bin", "java").is_file()) or shutil.which("java"))


def venv_naming(root: Path, places: list[str]) -> Path:
    """A virtual environment whose Python also imports from ``places`` (a ``.pth`` file
    naming them); its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    python = root / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    Path(site, "trilink-test-deps.pth").write_text("\n".join(places) + "\n")
    return python


def ours() -> list[str]:
    return list(dict.fromkeys([sysconfig.get_paths()["purelib"],
                               sysconfig.get_paths()["platlib"]]))


def bare_python(root: Path) -> Path:
    """A virtual environment whose Python imports this one's packages (a ``.pth`` file naming
    its site-packages) but not trilink_spark: a ``.pth`` line only adds a directory, so the
    editable install's own ``.pth`` hook in it never runs."""
    return venv_naming(root, ours())


def python_without_pyarrow(root: Path) -> Path:
    """A virtual environment whose Python imports this one's packages but pyarrow (and
    trilink_spark): a directory of links to every other entry of its site-packages."""
    shown = root / "site"
    shown.mkdir(parents=True)
    for place in ours():
        for entry in Path(place).iterdir():
            if (entry.name.startswith(("pyarrow", "trilink_spark", "__editable__"))
                    or entry.suffix == ".pth" or (shown / entry.name).exists()):
                continue
            (shown / entry.name).symlink_to(entry)
    return venv_naming(root / "env", [str(shown)])


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}


@pytest.mark.skipif(java_missing(), reason="a Spark standalone cluster needs Java "
                                           "(no java in JAVA_HOME or on PATH)")
class Leave(Exception):
    """Leaves the cluster's block the way a failing test does."""


def test_standalone_cluster_without_the_package_on_the_executors(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    started = time.monotonic()
    python = bare_python(tmp_path / "bare")
    probe = subprocess.run(
        [str(python), "-c", "import numpy, pandas, pyarrow, mmh3, rocksdict, pyspark\n"
                            "import trilink_spark"],
        env=clean_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 1 and "No module named 'trilink_spark'" in probe.stderr, (
        probe.stderr[-2000:])

    no_pyarrow = python_without_pyarrow(tmp_path / "no-pyarrow")
    work = tmp_path / "work"
    work.mkdir()
    cluster = SparkStandalone(workers=2, cores=1, memory="1g", workdir=tmp_path / "cluster")
    with caplog.at_level(logging.ERROR, "trilink_spark.testing"), pytest.raises(Leave):
        with cluster:
            assert cluster.state()["aliveworkers"] == 2
            env = {**clean_env(), "PYTHONPATH": str(SOURCE_ROOT),
                   "PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": sys.executable,
                   "SPARK_LOCAL_IP": "127.0.0.1"}
            done = subprocess.run([sys.executable, str(DRIVER), cluster.master_url, str(work),
                                   str(no_pyarrow)],
                                  env=env, capture_output=True, text=True, timeout=400)
            daemons = cluster.processes()
            logs = cluster.log_tails(lines=10)
            raise Leave  # a block that fails logs the end of the cluster's logs
    dumped = [r.getMessage() for r in caplog.records if "the end of its logs" in r.getMessage()]
    assert len(dumped) == 1 and "ends with Leave" in dumped[0]
    assert "== logs/master.log ==" in dumped[0] and "/stderr ==" in dumped[0]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert done.returncode == 0 and lines, (done.stdout[-3000:], done.stderr[-6000:], logs)
    # the cluster's own logs, for a failure's message: the daemons' and each executor's
    assert {"logs/master.log", "logs/worker-0.log", "logs/worker-1.log"} <= set(logs)
    executors = [name for name in logs if name.endswith("/stderr")]
    assert {name.split("/")[0] for name in executors} == {"worker-0", "worker-1"}
    assert any("Executor" in logs[name] for name in executors), executors
    found = json.loads(lines[-1])
    assert not cluster.processes(), "the cluster left processes behind"
    assert len(daemons) >= 3  # the master and the workers, seen while they ran

    # (a) before tl.ship: the typed error, from the call itself, naming the fix
    unshipped = found["unshipped"]
    assert unshipped is not None and unshipped["type"] == "ExecutorEnvironmentError"
    message = unshipped["message"]
    assert "No module named 'trilink_spark'" in message
    assert str(python) in message and "tl.ship(spark)" in message
    assert "Running on a cluster" in message and "Traceback" not in message

    # (b) tl.ship, once per session; then every operator equals plain Spark
    assert found["shipped"][0].startswith("trilink_spark-") and found["shipped"][0].endswith(
        ".zip")
    assert any(name.startswith("sortedcontainers-") for name in found["shipped"])
    assert found["shipped_again"] == found["shipped"]
    assert found["key_by"] == {"counts": True, "one_partition_per_key": True,
                               "where_the_strategy_says": True}
    assert found["keyed_agg"] is True
    assert found["local_merge"]["exact"] is True
    assert found["local_merge"]["partial_rows"] < found["local_merge"]["rows"]
    assert found["global_merge"] is True

    # (c) a state path the executors do not see: the typed error, naming the storage rule
    unseen = found["unseen"]
    assert unseen is not None and unseen["type"] == "ExecutorEnvironmentError"
    assert "cannot see state_path relative-state" in unseen["message"]
    assert "storage the driver and every executor share" in unseen["message"]
    assert "relative to each process's working directory" in unseen["message"]

    # (d) the stream, rescaled 4 -> 8 mid-stream: exact running counts, batch by batch
    stream = found["stream"]
    assert stream["batches"] == [0, 1, 2, 3, 4]
    assert stream["each_batch_exact"] == [True] * 5
    assert stream["final_state_exact"] is True
    assert stream["partitions_after"] == 8 and stream["swaps"] == [2]
    assert len(stream["local_path_warning"]) == 1  # once per application and path

    # (d2) a shipped package changed on disk, shipped again: refused, naming both zips and
    # the fix; the executors still run the first version everywhere
    changed = found["changed"]
    assert changed["first"] == [1]
    again = changed["again"]
    assert isinstance(again, dict) and again["type"] == "ExecutorEnvironmentError", again
    assert "tl_changed_package changed since tl.ship" in again["message"]
    assert "spark.stop()" in again["message"]
    assert changed["after"] == [1]

    # (e) executors whose Python lacks pyarrow: the typed error names it and its fix, not
    # tl.ship (the package is shipped; it fails to import for pyarrow alone), also when the
    # state path's filesystem object travels with the check's tasks
    no_arrow = found["no_pyarrow"]
    shipped = no_arrow["ship"]
    assert shipped is not None and shipped["type"] == "ExecutorEnvironmentError"
    assert f"(Python {no_pyarrow}) cannot import pyarrow" in shipped["message"]
    assert "pyarrow holds compiled code" in shipped["message"]
    assert "tl.ship" not in shipped["message"]
    remote = no_arrow["subtree"]
    assert remote is not None and remote["type"] == "ExecutorEnvironmentError"
    assert "could not run the check" not in remote["message"], remote["message"]
    assert "cannot import pyarrow" in remote["message"]
    assert "pyarrow holds compiled code" in remote["message"]
    assert "every executor share" not in remote["message"]  # not a storage problem
    # a directory of the local filesystem (SubTreeFileSystem) is local too: warned about
    assert len(no_arrow["subtree_warnings"]) == 1
    assert "subtree/state is on the driver's local filesystem" in no_arrow["subtree_warnings"][0]
    elapsed = time.monotonic() - started
    print(f"standalone cluster test: {elapsed:.1f} s, steps {found['seconds']}\n"
          f"before tl.ship: {message}\nunseen state path: {unseen['message']}\n"
          f"without pyarrow: {shipped['message']}\nand a pyarrow state filesystem: "
          f"{remote['message']}")
