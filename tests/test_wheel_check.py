"""tools/check_wheel.py: its pure functions (parsing and checks), without building anything."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_wheel", ROOT / "tools" / "check_wheel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


cw = _load()

SETUP_CFG = """\
[metadata]
name = demo-pkg

[options]
python_requires = >=3.11
install_requires =
    numpy>=1.24
    pandas>=2.0,<3  # inline comment
    # a comment line
    redis>=5

[options.extras_require]
spark =
    pyspark>=4.1,<5
connect =
    pyspark[connect]>=4.1,<5
old =
    tomli>=2; python_version<"3.12"

[options.entry_points]
console_scripts =
    demo = demo_pkg.cli:main
"""

METADATA = """\
Metadata-Version: 2.4
Name: demo-pkg
Version: 1.2.3
Requires-Python: >=3.11
Requires-Dist: numpy>=1.24
Requires-Dist: pandas<3,>=2.0
Requires-Dist: redis>=5
Provides-Extra: spark
Requires-Dist: pyspark<5,>=4.1; extra == "spark"
Provides-Extra: connect
Requires-Dist: pyspark[connect]<5,>=4.1; extra == "connect"
Provides-Extra: old
Requires-Dist: tomli>=2; python_version < "3.12" and extra == "old"

# demo

The description, with a line that looks like a header:
Requires-Dist: pyspark
"""


def project() -> Any:
    return cw.parse_setup_cfg(SETUP_CFG)


# ------------------------------------------------------------------- requirements and metadata
def test_normalize_name() -> None:
    assert cw.normalize_name("Sorted_Containers") == "sorted-containers"
    assert cw.normalize_name("a.-_b") == "a-b"


@pytest.mark.parametrize(
    ("line", "name", "extras", "specs", "marker", "extra"),
    [
        ("numpy>=1.24", "numpy", set(), {">=1.24"}, "", None),
        ("pandas >= 2.0, < 3", "pandas", set(), {">=2.0", "<3"}, "", None),
        ("pandas (<3,>=2.0)", "pandas", set(), {">=2.0", "<3"}, "", None),
        ("pandas-stubs", "pandas-stubs", set(), set(), "", None),
        ('pyspark[connect]<5,>=4.1; extra == "connect"', "pyspark", {"connect"},
         {"<5", ">=4.1"}, "", "connect"),
        ("Kafka_Python<4,>=2.0.2 ; extra == 'Kafka'", "kafka-python", set(), {"<4", ">=2.0.2"},
         "", "kafka"),
        ('tomli>=2; python_version < "3.12" and extra == "old"', "tomli", set(), {">=2"},
         'python_version<"3.12"', "old"),
        ('tomli>=2; (python_version < "3.12") and extra == "old"', "tomli", set(), {">=2"},
         'python_version<"3.12"', "old"),
        ("tomli>=2; python_version<'3.12'", "tomli", set(), {">=2"}, 'python_version<"3.12"',
         None),
    ],
)
def test_parse_requirement(line: str, name: str, extras: set[str], specs: set[str], marker: str,
                           extra: str | None) -> None:
    req = cw.parse_requirement(line)
    assert (req.name, set(req.extras), set(req.specifiers), req.marker, req.extra) == \
        (name, extras, specs, marker, extra)


def test_parse_requirement_refuses_what_it_cannot_compare() -> None:
    with pytest.raises(ValueError):
        cw.parse_requirement("pkg @ https://example.org/pkg.whl")
    with pytest.raises(ValueError):
        cw.parse_requirement("; extra == 'x'")


def test_same_requirement_however_spelt() -> None:
    assert cw.parse_requirement("pandas>=2.0,<3") == cw.parse_requirement("pandas (<3, >=2.0)")
    assert cw.parse_requirement("pandas>=2.0,<3") != cw.parse_requirement("pandas>=2.1,<3")


def test_parse_setup_cfg() -> None:
    spec = project()
    assert spec.name == "demo-pkg"
    assert spec.python_requires == ">=3.11"
    assert [r.name for r in spec.install_requires] == ["numpy", "pandas", "redis"]
    assert set(spec.extras) == {"spark", "connect", "old"}
    assert all(r.extra == "spark" for r in spec.extras["spark"])
    (tomli,) = spec.extras["old"]
    assert (tomli.name, tomli.marker, tomli.extra) == ("tomli", 'python_version<"3.12"', "old")
    assert spec.console_scripts == {"demo": "demo_pkg.cli:main"}


def test_parse_metadata_reads_headers_only() -> None:
    meta = cw.parse_metadata(METADATA)
    assert (meta.name, meta.version, meta.requires_python) == ("demo-pkg", "1.2.3", ">=3.11")
    assert meta.metadata_version == "2.4"
    assert [r.name for r in meta.base_requirements()] == ["numpy", "pandas", "redis"]
    assert [r.name for r in meta.extra_requirements("spark")] == ["pyspark"]
    assert meta.provides_extra == {"spark", "connect", "old"}


def test_check_metadata_accepts_a_faithful_one() -> None:
    assert cw.check_metadata(cw.parse_metadata(METADATA), project(), "1.2.3") == []


def test_check_metadata_refuses_pyspark_in_base() -> None:
    meta = cw.parse_metadata(METADATA.replace("Requires-Dist: redis>=5\n",
                                              "Requires-Dist: redis>=5\nRequires-Dist: pyspark>=4.1\n"))
    problems = cw.check_metadata(meta, project())
    assert any("base Requires-Dist names pyspark" in p for p in problems)
    assert any("the metadata has pyspark>=4.1" in p for p in problems)


def test_check_metadata_refuses_other_pins() -> None:
    meta = cw.parse_metadata(METADATA.replace("numpy>=1.24", "numpy>=1.20"))
    problems = cw.check_metadata(meta, project())
    assert "base requirements: setup.cfg has numpy>=1.24, the metadata does not" in problems
    assert "base requirements: the metadata has numpy>=1.20, setup.cfg does not" in problems


def test_check_metadata_requires_python() -> None:
    low = cw.parse_metadata(METADATA.replace("Requires-Python: >=3.11", "Requires-Python: >=3.9"))
    problems = cw.check_metadata(low, project())
    assert any("admits Python older than 3.11" in p for p in problems)
    assert any("differs from setup.cfg" in p for p in problems)
    missing = cw.parse_metadata(METADATA.replace("Requires-Python: >=3.11\n", ""))
    assert "no Requires-Python" in cw.check_metadata(missing, project())


def test_check_metadata_extras_and_version() -> None:
    no_spark = cw.parse_metadata(METADATA.replace('; extra == "spark"', '; extra == "connect"'))
    problems = cw.check_metadata(no_spark, project(), "1.2.3")
    assert any("'spark' extra does not require pyspark" in p for p in problems)
    assert any("extra 'spark': setup.cfg has pyspark" in p for p in problems)
    assert cw.check_metadata(cw.parse_metadata(METADATA), project(), "9.9") == \
        ["Version is '1.2.3', the source says '9.9'"]
    renamed = cw.parse_metadata(METADATA.replace("Name: demo-pkg", "Name: other"))
    assert any("Name is 'other'" in p for p in cw.check_metadata(renamed, project()))


def test_check_metadata_against_the_real_setup_cfg() -> None:
    """METADATA as setuptools writes it from setup.cfg (specifiers reordered) passes."""
    spec = cw.parse_setup_cfg((ROOT / "setup.cfg").read_text())
    assert not {r.name for r in spec.install_requires} & cw.SPARK_NAMES
    assert any(r.name == "pyspark" for r in spec.extras[cw.SPARK_EXTRA])
    def spelt(req: Any) -> str:  # specifiers in the opposite order to __str__'s
        extras: str = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        marker = f"; {req.marker}" if req.marker else ""
        return str(req.name) + extras + ",".join(sorted(req.specifiers, reverse=True)) + marker

    lines = ["Metadata-Version: 2.4", f"Name: {spec.name}", "Version: 0",
             f"Requires-Python: {spec.python_requires}"]
    lines += [f"Requires-Dist: {spelt(r)}" for r in spec.install_requires]
    for extra, reqs in spec.extras.items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {spelt(r)}; extra == "{extra}"' for r in reqs]
    assert cw.check_metadata(cw.parse_metadata("\n".join(lines) + "\n"), spec) == []


@pytest.mark.parametrize(
    ("spec", "ok"),
    [(">=3.11", True), (">= 3.12", True), (">=3.11,<4", True), ("~=3.11", True),
     ("==3.11.*", True), (">3.11", True), (">=3.9", False), (">3.10", False), ("<4", False),
     ("", False), ("!=3.10", False)],
)
def test_python_floor_ok(spec: str, ok: bool) -> None:
    assert cw.python_floor_ok(spec) is ok


def test_entry_points() -> None:
    text = "[console_scripts]\ndemo = demo_pkg.cli:main\n"
    assert cw.parse_entry_points(text) == {"console_scripts": {"demo": "demo_pkg.cli:main"}}
    assert cw.check_entry_points(text, project()) == []
    assert cw.check_entry_points("[console_scripts]\nDemo = x:y\n", project()) != []


# --------------------------------------------------------------------------- archive contents
def test_parse_wheel_filename() -> None:
    name = cw.parse_wheel_filename("trilink_spark-0.1.0-py3-none-any.whl")
    assert (name.distribution, name.version, name.platform_tag) == ("trilink_spark", "0.1.0", "any")
    with pytest.raises(ValueError):
        cw.parse_wheel_filename("trilink_spark-0.1.0-1-py3-none-any.whl")
    with pytest.raises(ValueError):
        cw.parse_wheel_filename("trilink_spark-0.1.0.tar.gz")


DIST_INFO = "pkg-1.0.dist-info"
GOOD_WHEEL = ["pkg/__init__.py", "pkg/py.typed", "pkg/sub/__init__.py", "pkg/sub/mod.py",
              f"{DIST_INFO}/METADATA", f"{DIST_INFO}/WHEEL", f"{DIST_INFO}/RECORD",
              f"{DIST_INFO}/entry_points.txt", f"{DIST_INFO}/licenses/LICENSE"]


def test_check_wheel_names_accepts_a_clean_wheel() -> None:
    assert cw.check_wheel_names(GOOD_WHEEL, "pkg", DIST_INFO) == []


@pytest.mark.parametrize(
    ("extra", "problem"),
    [("tests/test_x.py", "unexpected top-level entry tests/test_x.py"),
     ("benches/common.py", "unexpected top-level entry benches/common.py"),
     ("examples/job.py", "unexpected top-level entry examples/job.py"),
     ("pkg/__pycache__/mod.cpython-311.pyc", "forbidden path pkg/__pycache__/mod.cpython-311.pyc"),
     ("pkg/mod.pyc", "compiled file pkg/mod.pyc"),
     ("pkg/tests/helper.py", "forbidden path pkg/tests/helper.py"),
     ("pkg/sub/test_mod.py", "test module pkg/sub/test_mod.py"),
     ("pkg/conftest.py", "test module pkg/conftest.py"),
     ("pkg-1.0.data/scripts/x", "unexpected top-level entry pkg-1.0.data/scripts/x")],
)
def test_check_wheel_names_refuses(extra: str, problem: str) -> None:
    assert cw.check_wheel_names([*GOOD_WHEEL, extra], "pkg", DIST_INFO) == [problem]


def test_check_wheel_names_requires_py_typed() -> None:
    names = [n for n in GOOD_WHEEL if not n.endswith("py.typed")]
    assert cw.check_wheel_names(names, "pkg", DIST_INFO) == ["missing pkg/py.typed"]


def test_source_modules_and_missing_modules() -> None:
    modules = cw.source_modules(ROOT)
    assert "trilink_spark/__init__.py" in modules
    assert all(m.startswith("trilink_spark/") and m.endswith(".py") for m in modules)
    assert not any("__pycache__" in m for m in modules)
    assert cw.missing_modules(["a/x.py", "a/y.py"], ["a/x.py"]) == ["a/y.py"]
    assert cw.missing_modules(["a/x.py"], ["top/a/x.py"], prefix="top/") == []


def test_check_sdist_names() -> None:
    top = "pkg-1.0"
    required = ("PKG-INFO", "setup.cfg")
    good = [top, f"{top}/PKG-INFO", f"{top}/setup.cfg", f"{top}/tests/test_a.py"]
    assert cw.check_sdist_names(good, top, required) == []
    assert cw.check_sdist_names(good[:2], top, required) == [f"missing {top}/setup.cfg"]
    bad = [*good, f"{top}/tests/__pycache__/a.pyc", f"{top}/.venv/bin/python", "other/x",
           f"{top}/pkg/mod.pyc"]
    assert cw.check_sdist_names(bad, top, required) == [
        f"forbidden path {top}/tests/__pycache__/a.pyc", f"forbidden path {top}/.venv/bin/python",
        "entry outside pkg-1.0/: other/x", f"compiled file {top}/pkg/mod.pyc"]


def test_manifest_ships_what_the_sdist_check_requires() -> None:
    for required in cw.SDIST_REQUIRED:
        if required != "PKG-INFO":
            assert (ROOT / required).exists(), required


# ----------------------------------------------------------------------------- README snippet
README = """\
# demo

Intro with `inline code`.

## Quick start

```sh
make demo
```

## Usage

```python
import demo  # first
# not a heading: a comment inside a block
```

<!-- not the marker -->

~~~python
print("tilde")
~~~

## More

````markdown
```python
print("inside another fence: not a block")
```
````

```py
print("second")
```
"""


def test_python_blocks() -> None:
    blocks, markers = cw.python_blocks(README)
    assert markers == 0
    assert [b.code for b in blocks] == [
        "import demo  # first\n# not a heading: a comment inside a block\n",
        'print("tilde")\n', 'print("second")\n']
    assert [b.heading for b in blocks] == ["Usage", "Usage", "More"]
    assert blocks[0].line == 13


def test_find_snippets_defaults_to_first_block_after_quick_start() -> None:
    (snippet,), how = cw.find_snippets(README)
    assert snippet.code.startswith("import demo")
    assert "Quick start" in how and cw.MARKER in how


def test_find_snippets_before_quick_start_is_skipped() -> None:
    text = "```python\nprint('intro')\n```\n\n## Quick-start\n\n```python\nprint('qs')\n```\n"
    (snippet,), _ = cw.find_snippets(text)
    assert snippet.code == "print('qs')\n"
    (first,), how = cw.find_snippets(text.replace("## Quick-start", "## Usage"))
    assert first.code == "print('intro')\n" and "no 'Quick start' heading" in how


def test_find_snippets_markers_win() -> None:
    text = README.replace("```py\n", f"{cw.MARKER}\n\n```py\n")
    snippets, how = cw.find_snippets(text)
    assert [s.code for s in snippets] == ['print("second")\n']
    assert all(s.marked for s in snippets) and "marked" in how


def test_find_snippets_refuses_a_dangling_marker() -> None:
    text = README.replace("## More\n", f"## More\n\n{cw.MARKER}\n\nSome prose.\n")
    with pytest.raises(cw.CheckFailed, match="marker must sit just above"):
        cw.find_snippets(text)


def test_find_snippets_by_section() -> None:
    (snippet,), how = cw.find_snippets(README, section="more")
    assert snippet.code == 'print("second")\n' and "'More'" in how
    with pytest.raises(cw.CheckFailed, match="no python block under"):
        cw.find_snippets(README, section="Nowhere")
    with pytest.raises(cw.CheckFailed, match="no ```python block"):
        cw.find_snippets("# nothing\n\n```sh\nls\n```\n")


def test_find_snippets_on_the_real_readme() -> None:
    snippets, _ = cw.find_snippets((ROOT / "README.md").read_text())
    assert snippets and all("import trilink_spark" in s.code for s in snippets)
    compile(snippets[0].code, "README snippet", "exec")


# ------------------------------------------------------------------------- PySpark untouched
def snapshot(**change: Any) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "version": "4.3.0", "copies": 1, "dist_info": "/v/site/pyspark-4.3.0.dist-info",
        "record_sha256": "abc",
        "dist_info_files": {"RECORD": [10, 1, 100], "METADATA": [20, 1, 101]},
        "package_dir": "/v/site/pyspark", "package_init": [5, 1, 200],
    }
    snap.update(change)
    return snap


def test_compare_snapshots_untouched() -> None:
    assert cw.compare_snapshots({"pyspark": snapshot()}, {"pyspark": snapshot()}) == []


@pytest.mark.parametrize(
    ("after", "problem"),
    [(None, "pyspark was uninstalled"),
     (snapshot(version="4.3.1"), "pyspark changed version 4.3.0 -> 4.3.1"),
     (snapshot(copies=2), "pyspark: 2 installed copies, was 1"),
     (snapshot(package_dir="/elsewhere/pyspark"),
      "pyspark moved: package /v/site/pyspark -> /elsewhere/pyspark"),
     (snapshot(record_sha256="def"), "pyspark: RECORD changed (reinstalled)"),
     (snapshot(dist_info_files={"RECORD": [10, 1, 100], "METADATA": [20, 2, 999]}),
      "pyspark: dist-info file METADATA rewritten"),
     (snapshot(dist_info_files={"RECORD": [10, 1, 100]}),
      "pyspark: dist-info file METADATA removed"),
     (snapshot(package_init=[5, 2, 300]), "pyspark: package __init__.py rewritten")],
)
def test_compare_snapshots_changed(after: dict[str, Any] | None, problem: str) -> None:
    assert problem in cw.compare_snapshots({"pyspark": snapshot()}, {"pyspark": after})


def test_compare_snapshots_needs_pyspark_before() -> None:
    assert cw.compare_snapshots({"pyspark": None}, {"pyspark": snapshot()}) == \
        ["pyspark was not installed before the wheel"]


def test_pip_touched() -> None:
    clean = ("Requirement already satisfied: pyspark in /v/site\n"
             "Installing collected packages: numpy, trilink-spark\n"
             "Successfully installed numpy-2.4.6 trilink-spark-0.1.0\n")
    assert cw.pip_touched(clean, ["pyspark", "py4j"]) == []
    dirty = ("Attempting uninstall: pyspark\n  Found existing installation: pyspark 4.3.0\n"
             "  Successfully uninstalled pyspark-4.3.0\n"
             "Successfully installed py4j-0.10.9.9 pyspark-4.3.1 trilink-spark-0.1.0\n")
    assert cw.pip_touched(dirty, ["pyspark", "py4j"]) == [
        "pip: Attempting uninstall: pyspark", "pip: Found existing installation: pyspark 4.3.0",
        "pip uninstalled pyspark-4.3.0", "pip installed py4j-0.10.9.9",
        "pip installed pyspark-4.3.1"]


# ------------------------------------------------------------------------------------ helpers
@pytest.mark.parametrize(
    ("text", "major"),
    [('openjdk version "17.0.15" 2025-04-15', 17), ('java version "1.8.0_392"', 8),
     ('openjdk version "21" 2023-09-19', 21), ("no java here", None)],
)
def test_java_major(text: str, major: int | None) -> None:
    assert cw.java_major(text) == major


def test_source_version() -> None:
    assert cw.source_version('"""doc"""\n__version__ = "0.1.0"\n') == "0.1.0"
    assert cw.source_version("__version__: str = '2.0'\n") == "2.0"
    assert cw.source_version("version = '1'\n") is None
    assert cw.source_version((ROOT / "trilink_spark" / "__init__.py").read_text())


def test_venv_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("SPARK_HOME", "/opt/other-spark")
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    env = cw.venv_env(tmp_path)
    assert "PYTHONPATH" not in env and "SPARK_HOME" not in env
    python = str(cw.venv_bin(tmp_path, "python"))
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == python
    assert env["PATH"].startswith(str(cw.venv_bin(tmp_path, "")))
    assert env["VIRTUAL_ENV"] == str(tmp_path)


def test_report_summary(capsys: pytest.CaptureFixture[str]) -> None:
    report = cw.Report()
    report.add("build", True, "built\nmore", 1.0)
    assert report.ok
    report.add("metadata", False, "first problem\nsecond problem", 0.5)
    assert not report.ok
    summary = report.summary(2.0)
    assert "[ok  ] build" in summary and "[FAIL] metadata" in summary
    assert "second problem" in summary and "1 check(s) FAILED in 2.0 s" in summary
    assert "first problem" in capsys.readouterr().out


def test_must_and_run_cmd() -> None:
    ok = cw.run_cmd([sys.executable, "-c", "print('hi')"])
    assert cw.must(ok, "hi") == "hi\n"
    bad = cw.run_cmd([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"])
    with pytest.raises(cw.CheckFailed, match=r"(?s)step failed \(exit 3\).*boom"):
        cw.must(bad, "step")
