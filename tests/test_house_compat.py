"""What the house move (issue 28) must not change for users: old names still resolve with one
warning, the control plane's checks refuse what they refused with the same words, the house
checks see every way to break a rule, and no document names a path that moved."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trilink_spark as tl
from trilink_spark.advice import BottleneckAdvisor, TrueRate, ds2_plan
from trilink_spark.elastic import ElasticityAdvisor
from trilink_spark.errors import ConfigError, ConfigTypeError, InvalidArgumentError
from trilink_spark.switching import AdaptivePartitioner, LoadAwareRebalancer, validate_update

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
graph = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(graph)


def _caught(code: str) -> tuple[dict[str, Any], list[warnings.WarningMessage]]:
    namespace: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(code, "user_code.py", "exec"), namespace)
    return namespace, [w for w in caught if issubclass(w.category, DeprecationWarning)]


# ------------------------------------------------------------------ names that moved
@pytest.mark.parametrize("name", sorted(tl._MOVED))
def test_a_moved_name_warns_once_at_the_users_line_however_it_is_read(name: str) -> None:
    module, attr, _ = tl._MOVED[name]
    home = getattr(importlib.import_module(module), attr)
    for code in (f"from trilink_spark import {name} as got",
                 f"import trilink_spark\ngot = trilink_spark.{name}",
                 f"import trilink_spark\ngot = getattr(trilink_spark, {name!r})"):
        namespace, caught = _caught(code)
        assert namespace["got"] is home, code
        # ``from package import name`` probes with hasattr before it reads: still one warning
        assert len(caught) == 1, (code, [str(w.message) for w in caught])
        assert f"has moved to {module}.{attr}" in str(caught[0].message)
        assert caught[0].filename == "user_code.py", code


def test_star_import_gives_the_public_names_without_a_warning() -> None:
    namespace, caught = _caught("from trilink_spark import *")
    assert set(namespace) - {"__builtins__"} == set(tl.__all__)
    assert caught == []


def test_keyed_event_time_col_still_resolves_with_a_warning() -> None:
    """``trilink_spark.keyed.EVENT_TIME_COL`` was in ``keyed.__all__`` in 0.1."""
    from trilink_spark.columns import EVENT_TIME_COL

    for code in ("from trilink_spark.keyed import EVENT_TIME_COL as got",
                 "import trilink_spark.keyed\ngot = trilink_spark.keyed.EVENT_TIME_COL"):
        namespace, caught = _caught(code)
        assert namespace["got"] == EVENT_TIME_COL
        assert len(caught) == 1 and "trilink_spark.keyed.EVENT_TIME_COL has moved to " \
            "trilink_spark.columns.EVENT_TIME_COL" in str(caught[0].message)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        importlib.import_module("trilink_spark.keyed").nothing  # noqa: B018


# ------------------------------------------------------------------ checks that must not move
@pytest.mark.parametrize(("update", "error", "message"), [
    ({"threshold": float("nan")}, ConfigError, "threshold must be finite, got nan"),
    ({"decay": float("inf")}, ConfigError, "decay must be finite, got inf"),
    ({"min_gain": 10**5000}, ConfigError, "min_gain must be finite, got <int>"),
    ({"period_s": -10**400}, ConfigError, "period_s must be finite, got -1000000000"),
    ({"threshold": np.int64(1)}, ConfigTypeError, "threshold must be a number, got int64"),
    ({"sample_rate": np.float32(0.5)}, ConfigTypeError,
     "sample_rate must be a number, got float32"),
    ({"threshold": np.float64(1.5)}, ConfigError,
     "threshold must be in [0.0, 1.0], got np.float64(1.5)"),
])
def test_config_fields_refuse_what_they_refused_with_the_same_words(
        update: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        validate_update(update)
    assert type(caught.value) is error and str(caught.value).startswith(message)


def test_adaptive_settings_keep_their_checks() -> None:
    with pytest.raises(ConfigError, match=r"^threshold must be finite, got inf$"):
        AdaptivePartitioner(4, threshold=float("inf"))
    with pytest.raises(ConfigTypeError, match=r"^decay must be a number, got int64$"):
        AdaptivePartitioner(4, decay=np.int64(0))


def test_control_plane_counts_quote_a_numpy_int_as_before() -> None:
    graph_ = {"src": ["a"], "a": []}
    cases = [
        (lambda: ds2_plan(graph_, {"a": TrueRate(100.0)}, {"src": 1.0},
                          min_parallelism=np.int64(0)), "min_parallelism must be >= 1, got 0"),
        (lambda: LoadAwareRebalancer(window=np.int64(0)), "window must be >= 1, got 0"),
        (lambda: BottleneckAdvisor(window_batches=np.int64(0)),
         "window_batches must be >= 1, got 0"),
        # the elastic package always quoted the repr
        (lambda: ElasticityAdvisor(trigger_interval_s=1, min_units=np.int64(0)),
         "min_units must be >= 1, got np.int64(0)"),
    ]
    for call, message in cases:
        with pytest.raises(InvalidArgumentError) as caught:
            call()
        assert str(caught.value) == message


# ------------------------------------------------------------------ the house checks see it all
def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    pkg = tmp_path / "trilink_spark"
    for name, text in {"__init__.py": "", **files}.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(pkg).parents:
            init = pkg / parent / "__init__.py"
            if not init.exists():
                init.write_text("")
        path.write_text(text)
    return graph.modules(pkg)


def test_graph_checker_sees_a_plain_import_of_the_facade(tmp_path: Path) -> None:
    mods = _package(tmp_path, {
        "kafka/a.py": "import trilink_spark as tl\nx = tl.key_by\n",
        "kafka/b.py": "def f():\n    import trilink_spark\n    return trilink_spark.key_by\n",
        "kafka/c.py": "from ..errors import x\n", "errors.py": "x = 1\n"})
    graph.imports(mods)
    assert graph.FACADE_IMPORTS == [
        "trilink_spark.kafka.a imports the facade (trilink_spark)",
        "trilink_spark.kafka.b imports the facade (trilink_spark)"]


def test_graph_checker_sees_a_private_name_read_through_a_package(tmp_path: Path) -> None:
    mods = _package(tmp_path, {
        "switching/wire.py": "_secret = 1\n",
        "switching/other.py": "from .. import switching\nprint(switching.wire._secret)\n",
        "advice/a.py": "import trilink_spark.switching.wire\n"
                       "print(trilink_spark.switching.wire._secret)\n"})
    _, private = graph.imports(mods)
    assert sorted(private) == [
        "trilink_spark.advice.a reads _secret of trilink_spark.switching.wire",
        "trilink_spark.switching.other reads _secret of trilink_spark.switching.wire"]


def test_graph_checker_refuses_a_subpackage_without_a_rank(tmp_path: Path) -> None:
    """A subpackage missing from RANKS would count as the bottom layer: anything could import
    it and the layer rule would never see a breach through it."""
    mods = _package(tmp_path, {"helpers/x.py": "", "merge/a.py": "from ..helpers import x\n",
                               "_internal/v.py": ""})
    edges, _ = graph.imports(mods)
    assert graph.layer_violations(edges) == []  # what the rank check is there for
    assert graph.unranked_subpackages(mods) == ["helpers has no rank in RANKS"]
    assert graph.unranked_subpackages(graph.modules()) == []


def _trilink_aliases(tree: ast.AST) -> set[str]:
    return {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
            for a in node.names if a.name == "trilink_spark"}


def test_nothing_outside_the_package_reads_a_deprecated_top_level_name() -> None:
    """``tl.<moved name>`` in a bench, example, tool or test (annotations included, which
    never run) reads the deprecated fallback; the pytest filter only sees what runs."""
    found = []
    for folder in ("benches", "examples", "tools", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = _trilink_aliases(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id in names and node.attr in tl._MOVED:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}")
    found = [f for f in found if not f.startswith("tests/test_house")]
    assert found == []


# ------------------------------------------------------------------ documents name real homes
_DOTTED = re.compile(r"trilink_spark(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
#: Dotted strings that are no path: the metadata mark Ahead KeyBy writes (kept as it was, so
#: frames marked by an older release still read as keyed), and a bench's private module name.
_NOT_PATHS = {"trilink_spark.keyed_by_source", "trilink_spark.kafka._client_head"}


def _resolves(dotted: str) -> str | None:
    """Why ``dotted`` names no current home (None when it does)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for j, attr in enumerate(parts[i:]):
            if i + j == 1 and attr in tl._MOVED:
                return f"the deprecated top-level name {attr}"
            if not hasattr(obj, attr):
                return f"nothing called {attr}"
            obj = getattr(obj, attr)
        return None
    return "no such module"


def test_documents_and_docstrings_name_each_path_at_its_home() -> None:
    sources = [ROOT / "README.md", ROOT / "benches" / "RESULTS.md",
               *sorted((ROOT / "trilink_spark").rglob("*.py")),
               *sorted((ROOT / "benches").rglob("*.py")),
               *sorted((ROOT / "examples").rglob("*.py"))]
    stale = []
    for path in sources:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _DOTTED.finditer(line):
                dotted = match.group(0)
                why = None if dotted in _NOT_PATHS else _resolves(dotted)
                if why:
                    stale.append(f"{path.relative_to(ROOT)}:{number} {dotted}: {why}")
    assert stale == []


def test_results_and_docstrings_never_use_a_moved_tl_name() -> None:
    """``tl.X`` in prose names the deprecated fallback (the README's note on it aside)."""
    pattern = re.compile(r"\btl\.([A-Za-z_][A-Za-z0-9_]*)")
    stale = []
    for path in [ROOT / "README.md", ROOT / "benches" / "RESULTS.md",
                 *sorted((ROOT / "trilink_spark").rglob("*.py"))]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "left the top level" in line:
                continue
            for match in pattern.finditer(line):
                if match.group(1) in tl._MOVED:
                    stale.append(f"{path.relative_to(ROOT)}:{number} tl.{match.group(1)}")
    assert stale == []


def test_an_arrow_table_with_an_empty_batch_keeps_every_row(spark) -> None:
    """PySpark drops the rows after an empty record batch of a multi-chunk Arrow table; every
    table the package hands to Spark goes through frame_of_arrow, which combines chunks."""
    import pyarrow as pa

    from trilink_spark._internal.spark.compat import frame_of_arrow

    key = pa.chunked_array([pa.array(["a"]), pa.array([], pa.string()), pa.array(["b", "c"])])
    table = pa.table({"k": key, "v": pa.array([1, 2, 3], pa.int32())})
    assert [b.num_rows for b in table.to_batches()] == [1, 0, 2]
    assert sorted(r["k"] for r in frame_of_arrow(spark, table).collect()) == ["a", "b", "c"]
    assert frame_of_arrow(spark, table, "k string, v int").count() == 3


def test_no_arrow_table_reaches_spark_but_through_frame_of_arrow() -> None:
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "trilink_spark"
    offenders = []
    for path in root.rglob("*.py"):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"createDataFrame\((table|combined|_arrow_result|to_arrow)", code) and \
                    path.name != "compat.py":
                offenders.append(f"{path.name}:{n}")
    assert offenders == []


# ------------------------------------------------------------------ keyed/ in rooms
_ROOMED = {old: homes for package in ("trilink_spark.keyed", "trilink_spark.merge",
                                       "trilink_spark.partitioners")
           for old, homes in importlib.import_module(package).MOVED_MODULES.items()}


@pytest.mark.parametrize("old", sorted(_ROOMED))
def test_a_module_path_from_before_the_rooms_still_resolves_with_a_warning(old: str) -> None:
    """Every module path keyed/ and merge/ had before their rooms imports, and each name it
    had reads from its new home with one warning naming that home."""
    homes = _ROOMED[old]
    name = next(n for n in homes[0].__all__)
    for code in (f"from {old} import {name} as got",
                 f"import {old} as mod\ngot = mod.{name}",
                 f"import {old.rsplit('.', 1)[0]} as k\n"
                 f"got = getattr(k.{old.rsplit('.', 1)[1]}, {name!r})"):
        namespace, caught = _caught(code)
        assert namespace["got"] is getattr(homes[0], name), code
        assert len(caught) == 1, (code, [str(w.message) for w in caught])
        assert str(caught[0].message).startswith(
            f"{old}.{name} has moved to {homes[0].__name__}.{name}"), code
        assert caught[0].filename == "user_code.py", code
    with pytest.raises(ImportError, match="no_such_name"):
        exec(f"from {old} import no_such_name", {})


def test_the_codec_module_path_reads_each_name_from_the_room_that_now_holds_it() -> None:
    """``keyed.snapshot`` was the codec and the key identities at once: they live apart now."""
    from trilink_spark.keyed.durable import codec
    from trilink_spark.keyed.semantics import keys

    namespace, caught = _caught("from trilink_spark.keyed.snapshot import NULL_KEY, "
                                "encode_state, PartitionState")
    assert namespace["NULL_KEY"] is keys.NULL_KEY
    assert namespace["PartitionState"] is keys.PartitionState
    assert namespace["encode_state"] is codec.encode_state
    assert [str(w.message).split(" has moved to ")[1].split(";")[0] for w in caught] == [
        "trilink_spark.keyed.semantics.keys.NULL_KEY",
        "trilink_spark.keyed.durable.codec.encode_state",
        "trilink_spark.keyed.semantics.keys.PartitionState"]


def test_renamed_batch_names_resolve_with_a_warning() -> None:
    """Four things were called "batch": ``KeyedBatch`` is ``KeyedRows`` now, and
    ``trilink_spark.state.batch`` is ``trilink_spark.state.foreach``."""
    from trilink_spark.keyed import KeyedRows
    from trilink_spark.state import StatefulBatchFunction

    namespace, caught = _caught("from trilink_spark.keyed import KeyedBatch as got")
    assert namespace["got"] is KeyedRows and len(caught) == 1
    assert "trilink_spark.keyed.KeyedBatch has moved to trilink_spark.keyed.KeyedRows" in str(
        caught[0].message)
    namespace, caught = _caught("from trilink_spark.state.batch import StatefulBatchFunction "
                                "as got")
    assert namespace["got"] is StatefulBatchFunction and len(caught) == 1
    assert "has moved to trilink_spark.state.foreach.StatefulBatchFunction" in str(
        caught[0].message)
    assert "KeyedBatch" not in importlib.import_module("trilink_spark.keyed").__all__


def test_merge_global_merge_stays_the_function_after_its_module_moved() -> None:
    """``trilink_spark.merge.global_merge`` was the function at the package's top; importing
    old module paths of merge/ never replaces it with a module."""
    import trilink_spark.merge as merge

    _caught("import trilink_spark.merge.redis_store\nimport trilink_spark.merge.local")
    assert callable(merge.global_merge) and merge.global_merge is tl.global_merge
