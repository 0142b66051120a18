"""The fast tier (``make test-fast``, ``-m "not spark"``): which tests ``tests/conftest.py``
marks ``spark``, and the guard that fails a test of the fast tier that starts a JVM: small test
files run in a pytest subprocess with the suite's conftest."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import JVM_RECORD_OPTION, LONG, SLOW, SPARK_OUTSIDE_THE_FIXTURE, deselects_spark

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")
ROOT = CONFTEST.parent.parent

MARKED = '''
import pytest


@pytest.fixture
def frame(spark):
    return spark


@pytest.fixture
def plain_value():
    return 1


def test_plain(tmp_path, plain_value):
    assert plain_value == 1


def test_uses_spark(spark):
    pass


def test_through_a_conftest_fixture(local_root):
    pass


def test_through_a_fixture_of_the_file(frame):
    pass


@pytest.mark.usefixtures("spark")
def test_through_usefixtures():
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_parametrized(n, spark):
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_parametrized_plain(n):
    assert n in (1, 2)


@pytest.mark.cluster
def test_a_cluster():
    pass

'''

STARTS_A_JVM = '''
import subprocess
import sys

import pytest


def test_plain():
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


def test_starts_a_jvm_unmarked():
    assert subprocess.run([JAVA, "-version"], capture_output=True).returncode == 0


@pytest.mark.spark
def test_starts_a_jvm_marked():
    assert subprocess.run([JAVA, "-version"], capture_output=True).returncode == 0
'''


def java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").is_file():
        return str(Path(home, "bin", "java"))
    return shutil.which("java")


@pytest.fixture
def suite(pytester: pytest.Pytester, request: pytest.FixtureRequest,
          monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytest directory with the suite's conftest and markers; its runs start with
    ``JAVA_TOOL_OPTIONS`` without this session's JVM record (in the fast tier), so that the
    JVMs they start are theirs, not this test's."""
    inherited = os.environ.get(JVM_RECORD_OPTION)
    if inherited:
        monkeypatch.setenv("JAVA_TOOL_OPTIONS",
                           os.environ.get("JAVA_TOOL_OPTIONS", "").replace(inherited, "").strip())
        monkeypatch.delenv(JVM_RECORD_OPTION)
    shutil.copy(CONFTEST, pytester.path / "conftest.py")
    shutil.copy(CONFTEST.with_name("long_tests.txt"), pytester.path / "long_tests.txt")
    markers = "\n".join(f"    {m}" for m in request.config.getini("markers"))
    pytester.makeini(f"[pytest]\naddopts = -p no:cacheprovider\nmarkers =\n{markers}\n")
    return pytester


def test_the_spark_marker_is_registered(request: pytest.FixtureRequest) -> None:
    names = {m.split(":", 1)[0].strip() for m in request.config.getini("markers")}
    assert "spark" in names


def test_the_fast_tier_runs_the_tests_without_spark_and_fails_one_that_starts_a_jvm(
        suite: pytest.Pytester) -> None:
    path = java()
    if path is None:
        pytest.skip("needs Java")
    suite.makepyfile(test_marked=MARKED, test_jvm=STARTS_A_JVM.replace("JAVA", repr(path)))
    fast = suite.runpytest_subprocess("-v", "-p", "no:xdist", "-m", "not spark")
    # the 7 tests of test_marked.py whose fixtures include spark, and the marked JVM test
    fast.assert_outcomes(passed=5, errors=1, deselected=8)
    passed = {m.group(1) for line in fast.outlines
              if (m := re.match(r"(\S+\.py::\S+) PASSED", line))}
    assert passed == {"test_marked.py::test_plain", "test_marked.py::test_parametrized_plain[1]",
                      "test_marked.py::test_parametrized_plain[2]", "test_jvm.py::test_plain",
                      "test_jvm.py::test_starts_a_jvm_unmarked"}
    text = "\n".join(fast.outlines)
    assert "ERROR at teardown of test_starts_a_jvm_unmarked" in text
    assert re.search(r"test_jvm.py::test_starts_a_jvm_unmarked started 1 JVM\(s\) "
                     r"\(jvm-\d+\.log\) in the fast tier", text), text


@pytest.mark.parametrize("markexpr,fast", [
    ("not spark", True), ("not spark and not cluster", True), ("not (spark or connect)", True),
    ("connect and not spark", True), ("not spark and (a or b)", True),
    ("", False), ("spark", False), ("connect", False), ("not cluster", False),
    ("cluster or not spark", False), ("(a and b and c) or not spark", False),
])
def test_the_guard_is_on_where_no_test_marked_spark_can_be_selected(markexpr: str,
                                                                    fast: bool) -> None:
    assert deselects_spark(markexpr) is fast


def test_the_tests_listed_as_starting_spark_outside_the_fixture_exist() -> None:
    assert SPARK_OUTSIDE_THE_FIXTURE
    for node in SPARK_OUTSIDE_THE_FIXTURE:
        path, name = node.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), node


def test_the_tests_listed_as_slow_exist_and_need_no_spark() -> None:
    """Each ``SLOW`` entry names a test function or a module's doctests that exist, none of
    them also listed as starting Spark."""
    assert SLOW and not SLOW & SPARK_OUTSIDE_THE_FIXTURE
    for node in SLOW:
        path, name = node.split("::")
        text = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {name}\(", text, re.M) or name == path[:-3].replace(
            "/", "."), node


def test_the_tests_listed_as_long_exist_and_the_two_tiers_run_every_test() -> None:
    """Each ``LONG`` entry names a test function that exists, and ``make test`` (``-m "not
    long"``) with ``make test-long`` (``-m long``) runs every test, which CI runs both of."""
    assert len(LONG) >= 50
    for node in LONG:
        path, name = node.split("::")
        text = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {name}\(", text, re.M), node
        assert not path.startswith("tests/cluster/"), node  # make test keeps the cluster tier
    make = (ROOT / "Makefile").read_text()
    assert '-m "not long"' in make and "-m long" in make
    ci = (ROOT / ".ci" / "run").read_text().split()
    assert ci[-3:] == ["make", "test", "test-long"], ci
    readme = (ROOT / "README.md").read_text()
    assert "\nmake test test-long " in readme  # the Quick start's test command is CI's
