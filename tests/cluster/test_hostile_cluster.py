"""What users of ``tl.ship`` and the executors' check meet off the happy path: a package
imported from a zip (``--py-files``, a zipped egg) or through an import hook (an editable
install), Spark's own packages named in ``packages``, the message for a package that fails
to import only for a missing compiled dependency, and the README's packed-environment
commands. The real cluster's share is in ``test_standalone.py``."""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import trilink_spark as tl
from trilink_spark._internal.spark.executors import judge_reports
from trilink_spark._internal.spark.ship import zip_package
from trilink_spark.errors import InvalidArgumentError

README = Path(__file__).resolve().parent.parent.parent / "README.md"


def plain_zip(source: Path, target: Path) -> Path:
    """A zip of a package directory as a user or a build tool makes one: directory entries,
    this machine's times and modes, a ``__pycache__`` the zip's importer never uses."""
    with zipfile.ZipFile(target, "w") as archive:
        for path in sorted(source.rglob("*")):
            archive.write(path, path.relative_to(source.parent).as_posix())
    return target


def make_package(root: Path, name: str) -> Path:
    package = root / name
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "mod.py").write_text("def f():\n    return 2\n")
    (package / "data.txt").write_text("packaged data\n")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0junk")
    return package


EXPECTED = {"__init__.py": b"VALUE = 1\n", "data.txt": b"packaged data\n",
            "sub/__init__.py": b"", "sub/mod.py": b"def f():\n    return 2\n"}


def zipped(path: Path, name: str) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {i.filename.removeprefix(f"{name}/"): archive.read(i) for i in archive.infolist()}


def forget(name: str) -> None:
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def test_ship_works_where_the_package_itself_is_imported_from_a_zip(tmp_path):
    """``spark-submit --py-files trilink-spark.zip job.py``: the driver imports the package
    from the zip, and a ``tl.ship(spark)`` in the job must still find it (the same bytes as
    from the directory)."""
    archive = plain_zip(Path(tl.__file__).parent, tmp_path / "trilink-spark.zip")
    code = ("import hashlib, trilink_spark\n"
            "from trilink_spark._internal.spark.ship import zip_package\n"
            "print(trilink_spark.__file__)\n"
            "print(hashlib.sha256(zip_package('trilink_spark').read_bytes()).hexdigest())\n")
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           "PYTHONPATH": str(archive)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    where, digest = done.stdout.split()
    assert where.startswith(str(archive))  # imported from the zip, not from a directory
    assert digest == hashlib.sha256(zip_package("trilink_spark").read_bytes()).hexdigest()


def test_a_pure_package_that_lives_in_a_zip_on_the_path_is_shipped(tmp_path, monkeypatch):
    name = "tl_hostile_zipped"
    archive = plain_zip(make_package(tmp_path / "src", name), tmp_path / f"{name}.zip")
    monkeypatch.syspath_prepend(str(archive))
    try:
        assert zipped(zip_package(name), name) == EXPECTED  # not imported yet
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.startswith(str(archive))
        assert zipped(zip_package(name), name) == EXPECTED  # imported from the zip
    finally:
        forget(name)


class Hook(importlib.abc.MetaPathFinder):
    """What an editable install (setuptools' finder) puts on ``sys.meta_path``: one import
    name mapped to a directory that is on no ``sys.path`` entry."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name, self.directory = name, directory

    def find_spec(self, fullname: str, path: Any = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(
            fullname, self.directory / "__init__.py",
            submodule_search_locations=[str(self.directory)])


def test_a_package_installed_through_an_import_hook_is_shipped(tmp_path):
    name = "tl_hostile_hooked"
    hook = Hook(name, make_package(tmp_path / "checkout", name))
    sys.meta_path.append(hook)
    try:
        assert importlib.util.find_spec(name) is not None  # importable here
        assert zipped(zip_package(name), name) == EXPECTED  # not imported yet
        importlib.import_module(name)
        assert zipped(zip_package(name), name) == EXPECTED
    finally:
        sys.meta_path.remove(hook)
        forget(name)


@pytest.mark.parametrize("name", ["pyspark", "py4j"])
def test_sparks_own_python_packages_are_refused(name):
    """The executors run PySpark's own copy (the executors' Spark puts it on their path); a zip
    of the installed one would be hundreds of MB of jars."""
    with pytest.raises(InvalidArgumentError, match="Spark's own"):
        zip_package(name)


def test_a_package_that_fails_only_for_a_compiled_dependency_is_not_sent_to_tl_ship():
    """After ``tl.ship`` the package is on the executors' path; when its import fails for
    a missing pyarrow, shipping it again cannot help."""
    report = {"host": "h1", "python": "/env/bin/python", "pid": 7, "version": None,
              "file": None, "seen": None,
              "missing": {"pyarrow": "ModuleNotFoundError: No module named 'pyarrow'",
                          "trilink_spark": "ModuleNotFoundError: No module named 'pyarrow'"}}
    message = judge_reports([report], tl.__version__)
    assert message is not None and "cannot import pyarrow" in message
    assert "pyarrow holds compiled code" in message and "tl.ship" not in message
    itself = dict(report, missing={
        "pyarrow": "ModuleNotFoundError: No module named 'pyarrow'",
        "trilink_spark": "ModuleNotFoundError: No module named 'trilink_spark'"})
    message = judge_reports([report, dict(itself, host="h2")], tl.__version__)
    assert message is not None and "tl.ship(spark)" in message  # h2 lacks the package itself


def readme_cluster_commands() -> list[str]:
    section = README.read_text().split("## Running on a cluster", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert blocks, "the section has a bash block"
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_packs_the_environment_it_names():
    """``venv-pack`` packs ``$VIRTUAL_ENV`` unless ``-p`` names the environment: outside an
    activated environment it fails ('Current environment is not a virtual environment')."""
    calls = [c for line in readme_cluster_commands() for c in line.split("&&")
             if "venv-pack" in c and " -o " in c]
    assert calls
    for call in calls:
        words = shlex.split(call)
        assert "-p" in words or "--prefix" in words, call


def test_the_readme_spark_submit_starts_its_driver_in_client_mode(tmp_path):
    """With ``PYSPARK_PYTHON=./environment/bin/python`` alone, spark-submit in client mode
    runs the driver with that path too, where no archive is unpacked: 'Cannot run program
    "./environment/bin/python"'. The README's line must start the driver."""
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    if not ((java_home and Path(java_home, "bin", "java").is_file()) or shutil.which("java")):
        pytest.skip("spark-submit needs Java")
    line = next(ln for ln in readme_cluster_commands() if "spark-submit" in ln)
    words = shlex.split(line)
    at = words.index("spark-submit")
    assignments = dict(w.split("=", 1) for w in words[:at])
    assert assignments.get("PYSPARK_PYTHON") == "./environment/bin/python"
    (tmp_path / "env" / "bin").mkdir(parents=True)  # the environment the README packed
    os.symlink(sys.executable, tmp_path / "env" / "bin" / "python")
    (tmp_path / "job.py").write_text("import sys\nprint('driver ran', sys.executable)\n")
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**{k: v for k, v in os.environ.items()
              if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS")},
           **assignments}
    done = subprocess.run([str(submit), "--master", "local[1]", *words[at + 1:]], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "driver ran" in done.stdout, done.stderr[-1500:]
