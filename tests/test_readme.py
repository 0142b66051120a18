"""Every ```python block of the README runs, and its printed claims hold."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 3


def _expected(comment: str) -> str | None:
    """The literal a ``# ...`` comment promises, if it starts with one."""
    comment = comment.strip()
    if comment.startswith("["):
        return comment[: comment.index("]") + 1]
    token = re.split(r"[,:(]| \(", comment)[0].strip()
    return token if re.fullmatch(r"-?[\d.]+|True|False", token) else None


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(spark, index):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(BLOCKS[index], f"README block {index}", "exec"), {})
    printed = out.getvalue().splitlines()
    lines = BLOCKS[index].splitlines()
    calls = [i for i, ln in enumerate(lines) if ln.startswith("print(")]
    assert len(calls) == len(printed), "each top-level print must print one line"
    for i, line in zip(calls, printed):
        comment = lines[i].split("  # ", 1)[1] if "  # " in lines[i] else None
        if comment is None and i + 1 < len(lines) and lines[i + 1].startswith("# "):
            comment = lines[i + 1][2:]
        want = _expected(comment) if comment else None
        if want is not None:
            assert want in line, (lines[i], line)


def test_expected_parser():
    assert _expected("[0, 1, 2]: x") == "[0, 1, 2]"
    assert _expected("0.5") == "0.5"
    assert _expected("40, one row per user") == "40"
    assert _expected("rows per partition") is None


def _dry_run(target: str, venv: Path) -> list[str]:
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=README.parent,
                         capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if "pip install" in ln and " -e " in ln]


def test_make_demo_installs_only_what_the_demo_needs(tmp_path):
    # on a fresh checkout (no venv yet): the demo's one install is the package and PySpark
    demo = _dry_run("demo", tmp_path / "venv")
    assert demo == [f'{tmp_path / "venv"}/bin/python -m pip install --quiet -e ".[spark]"']
    suite = _dry_run("test", tmp_path / "venv")
    assert len(suite) == 1 and '".[spark,test,bench]"' in suite[0]


def _toc_tool():
    import importlib.util

    path = README.parent / "tools" / "readme_toc.py"
    spec = importlib.util.spec_from_file_location("readme_toc", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_of_contents_lists_every_section():
    toc = _toc_tool()
    text = README.read_text()
    assert toc.current(text) == toc.table(text), "run python tools/readme_toc.py"
    assert toc.anchor("Where is the bottleneck, and how many tasks fix it?") == \
        "#where-is-the-bottleneck-and-how-many-tasks-fix-it"


def test_every_link_within_the_readme_has_its_heading():
    toc = _toc_tool()
    text = README.read_text()
    anchors = {toc.anchor(h) for _, h in toc.headings(text)} | {"#trilink-spark"}
    links = set(re.findall(r"\]\((#[^)\s]+)\)", text))
    assert links, "the README links its own sections"
    assert sorted(links - anchors) == []


def test_the_balance_table_is_what_make_demo_prints():
    # the README's figures come from the command that prints them: the demo's scoring (the
    # JSON of `trilink-spark balance`, no Spark needed), to three places as the table shows
    import json

    from trilink_spark.cli import main

    rows = {"keys uniform, records uniform": "uniform", "keys skewed, records uniform":
            "skewed_keys", "keys uniform, records skewed": "skewed_records",
            "keys skewed, records skewed": "skewed_both"}
    text = README.read_text().split("<!-- balance-demo -->", 1)[1]
    table = [ln for ln in text.strip().splitlines()[2:6]]
    out = io.StringIO()
    assert main(["balance", "--json"], out=out) == 0
    printed = {d["name"]: d for d in json.loads(out.getvalue())["datasets"]}
    assert len(table) == 4
    for line in table:
        label, *cells = [c.strip() for c in line.strip("|").split("|")]
        data = printed[rows[label]]
        degree = {s["strategy"]: s["balance_degree"] for s in data["strategies"]}
        want = [degree["hash"], degree["modulo"], degree["least_key"], degree["least_count"],
                data["keyed_bound"]]
        assert cells == [f"{v:.3f}" for v in want], (label, cells, want)
