"""``tl.ship``'s zips, the executors' check on the test session, and the messages of its
typed error. The real cluster is ``test_standalone.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import trilink_spark as tl
from trilink_spark._internal.spark.executors import check_executors, ensure_executors
from trilink_spark._internal.spark.executors import is_local_master, judge_reports
from trilink_spark._internal.spark.ship import zip_package
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import StateStoreError
from trilink_spark.testing import SparkStandalone


def test_a_package_zip_holds_its_sources_only_and_the_same_bytes_in_another_process():
    import sortedcontainers

    path = zip_package("sortedcontainers")
    assert path.name.startswith("sortedcontainers-") and path.suffix == ".zip"
    root = Path(sortedcontainers.__file__).parent
    wanted = sorted(p.relative_to(root.parent).as_posix() for p in root.rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        assert [i.filename for i in infos] == wanted
        assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
        assert {i.external_attr >> 16 for i in infos} == {0o644}
        assert archive.read("sortedcontainers/__init__.py") == (root / "__init__.py").read_bytes()
    other = subprocess.run(
        [sys.executable, "-c", "from trilink_spark._internal.spark.ship import zip_package\n"
                               "print(zip_package('sortedcontainers').read_bytes().hex())"],
        capture_output=True, text=True, timeout=120, check=True)
    assert bytes.fromhex(other.stdout.strip()) == path.read_bytes()
    assert zip_package("sortedcontainers") == path  # made once per content and process


def test_the_package_zip_is_importable_and_is_this_package():
    path = zip_package("trilink_spark")
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    assert "trilink_spark/__init__.py" in names and "trilink_spark/py.typed" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import trilink_spark as tl; "
            "print(tl.__file__, tl.__version__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=env, cwd=path.parent,
                          capture_output=True, text=True, timeout=120, check=True)
    where, version = done.stdout.split()
    assert where.startswith(str(path)) and version == tl.__version__


@pytest.mark.parametrize("name,why", [
    ("numpy", "holds compiled extension modules"),
    ("mmh3", "is not pure Python"),
    ("os", "standard library"),
    ("no_such_package_here", "is not installed"),
    ("a.b", "top-level importable packages"),
])
def test_what_a_zip_cannot_bring_is_refused(name, why):
    with pytest.raises(InvalidArgumentError, match=why):
        zip_package(name)


def test_ship_refuses_bad_packages_before_adding_anything(spark):
    with pytest.raises(InvalidArgumentError, match="compiled"):
        tl.ship(spark, packages=["numpy"], check=False)
    with pytest.raises(InvalidArgumentTypeError, match="list or tuple"):
        tl.ship(spark, packages=3, check=False)
    with pytest.raises(InvalidArgumentTypeError, match="list or tuple"):
        tl.ship(spark, packages=[["sortedcontainers"]], check=False)


@pytest.mark.parametrize("master,local", [
    ("local", True), ("local[2]", True), ("local[*]", True), ("local[2,3]", True),
    ("local-cluster[2,1,1024]", False), ("spark://10.0.0.5:7077", False), ("yarn", False),
    ("k8s://https://host:443", False), (None, False),
])
def test_which_masters_are_local(master, local):
    assert is_local_master(master) is local


def test_no_check_on_a_local_master(spark):
    assert ensure_executors(spark) is False


@pytest.mark.connect
def test_the_check_reports_each_task_and_runs_once_per_application(spark, tmp_path):
    reports = check_executors(spark)
    assert reports and all(r["missing"] == {} and r["version"] == tl.__version__
                           and r["seen"] is None for r in reports)
    assert all(r["file"].endswith("__init__.py") for r in reports)
    seen = check_executors(spark, str(tmp_path))
    assert seen and {r["seen"] for r in seen} == {"yes"}
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".executor-check-")]
    assert ensure_executors(spark, str(tmp_path / "once"), always=True) is True
    assert ensure_executors(spark, str(tmp_path / "once"), always=True) is False


@pytest.mark.connect
def test_a_state_path_on_another_pyarrow_filesystem_travels_with_the_tasks(spark, tmp_path):
    from pyarrow import fs

    subtree = fs.SubTreeFileSystem(str(tmp_path), fs.LocalFileSystem())
    reports = check_executors(spark, "state", filesystem=subtree)
    assert reports and {r["seen"] for r in reports} == {"yes"}
    assert os.listdir(tmp_path / "state") == []  # the driver's file is gone again


def test_a_state_path_the_driver_cannot_write_is_a_state_store_error(spark, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StateStoreError, match="cannot be written"):
        check_executors(spark, str(blocker / "state"))


REPORT = {"host": "h1", "python": "/env/bin/python", "pid": 7, "missing": {},
          "version": "0.1.0", "file": "/env/site/trilink_spark/__init__.py", "seen": None}


def test_the_message_names_what_is_missing_where_and_the_fix():
    compiled = dict(REPORT, missing={"numpy": "ModuleNotFoundError: No module named 'numpy'",
                                     "trilink_spark": "ModuleNotFoundError: numpy"})
    message = judge_reports([compiled, dict(compiled, pid=8)], "0.1.0")
    assert message is not None
    assert message.count("on h1 (Python /env/bin/python) cannot import numpy") == 1  # one line
    assert "tl.ship(spark)" in message  # for trilink_spark itself
    assert "numpy holds compiled code" in message and "spark.archives" in message
    assert "Running on a cluster" in message

    older = dict(REPORT, version="0.0.9", file="/old/trilink_spark/__init__.py")
    message = judge_reports([REPORT, older], "0.1.0")
    assert message is not None and "imports trilink_spark 0.0.9 from /old/" in message
    assert "not the driver's 0.1.0" in message and "tl.ship(spark)" in message

    hosts = [dict(REPORT, host=f"h{i}", seen="no") for i in range(12)]
    message = judge_reports(hosts, "0.1.0", "/data/state")
    assert message is not None and "cannot see state_path /data/state" in message
    assert "and 2 more" in message and "tl.ship" not in message
    assert "HDFS, S3 or GCS" in message and "relative" not in message
    assert judge_reports([REPORT, dict(REPORT, seen="yes")], "0.1.0", "/data/state") is None


def test_an_optional_module_counts_only_where_the_tasks_need_it():
    no_rocksdb = dict(REPORT, missing={"rocksdict": "ModuleNotFoundError: No module named "
                                                    "'rocksdict'"})
    assert judge_reports([no_rocksdb], "0.1.0") is None  # local_merge: not needed
    message = judge_reports([no_rocksdb], "0.1.0", "/data/state", ("rocksdict",))
    assert message is not None and "cannot import rocksdict" in message
    assert "rocksdict holds compiled code" in message and "tl.ship" not in message


def test_the_cluster_launcher_checks_its_arguments():
    with pytest.raises(InvalidArgumentError):
        SparkStandalone(workers=0)
    with pytest.raises(InvalidArgumentError, match="Spark's notation"):
        SparkStandalone(memory="lots")


def test_a_missing_mmh3_is_named_and_never_sent_to_tl_ship():
    # after tl.ship the package imports from its zip and fails on mmh3, compiled code
    shipped = dict(REPORT, missing={
        "mmh3": "ModuleNotFoundError: No module named 'mmh3'",
        "trilink_spark": "ModuleNotFoundError: No module named 'mmh3'"})
    message = judge_reports([shipped], "0.1.0")
    assert message is not None and "cannot import mmh3" in message
    assert "mmh3 holds compiled code" in message and "tl.ship" not in message
    # before tl.ship: every missing module in one message, each with the fix of its kind
    bare = dict(REPORT, missing={
        "mmh3": "ModuleNotFoundError: No module named 'mmh3'",
        "rocksdict": "ModuleNotFoundError: No module named 'rocksdict'",
        "sortedcontainers": "ModuleNotFoundError: No module named 'sortedcontainers'",
        "trilink_spark": "ModuleNotFoundError: No module named 'trilink_spark'"})
    message = judge_reports([bare], "0.1.0", None, ("rocksdict",))
    assert message is not None
    for name in ("mmh3", "rocksdict", "sortedcontainers", "trilink_spark"):
        assert f"{name} (ModuleNotFoundError" in message
    assert "tl.ship(spark)" in message and "mmh3, rocksdict hold compiled code" in message


def test_after_tl_ship_the_fix_is_never_tl_ship_again():
    # tl.ship brought the package but sortedcontainers is not installed on the driver
    after = dict(REPORT, missing={
        "sortedcontainers": "ModuleNotFoundError: No module named 'sortedcontainers'",
        "trilink_spark": "ModuleNotFoundError: No module named 'sortedcontainers'"})
    message = judge_reports([after], "0.1.0", shipped=frozenset({"trilink_spark"}))
    assert message is not None and "cannot import sortedcontainers" in message
    assert "call tl.ship(spark) before" not in message
    assert "could not bring sortedcontainers" in message
    assert "pip install sortedcontainers here" in message
    # shipped, and still not imported from the zip: an older copy on the executors wins
    older = dict(REPORT, missing={}, version="0.0.9", file="/env/site-packages/trilink_spark")
    message = judge_reports([older], "0.1.0", shipped=frozenset({"trilink_spark"}))
    assert message is not None and "already added trilink_spark" in message
    assert "call tl.ship(spark) before" not in message
    # never shipped: tl.ship is the fix
    message = judge_reports([after], "0.1.0")
    assert message is not None and "call tl.ship(spark) before" in message


def test_tl_ship_records_what_it_added(spark):
    from trilink_spark._internal.spark.executors import executor_environment_key, note_shipped
    from trilink_spark._internal.spark import executors

    tl.ship(spark, check=False)
    key = executor_environment_key(spark)
    assert {"trilink_spark", "sortedcontainers"} <= executors.shipped_packages(key)
    note_shipped(key, ["extra"])
    assert "extra" in executors.shipped_packages(key)
