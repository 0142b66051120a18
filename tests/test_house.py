"""The house rules: the public names stay, every module imports alone, no circles, layers hold."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import trilink_spark as tl

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
graph = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(graph)

# The top level: the verbs and types a user meets first (at most 30 names).
PUBLIC = {
    "key_by", "keyed_agg", "keyed_apply", "keyed_watermark", "keyed_process",
    "keyed_foreach_batch", "local_merge", "merge_partials", "global_merge",
    "Partitioner", "HashPartitioner", "ModuloPartitioner", "LeastKeyPartitioner",
    "LeastCountPartitioner", "WeightPartitioner", "BlockPartitioner", "TablePartitioner",
    "OverlayPartitioner", "AdaptivePartitioner",
    "partition_balance", "evaluate_strategies", "resolve_strategy",
    "KeyedWatermarkProcessFunction", "KeyedWindowAggregate", "read_state",
    "get_session", "ship", "TrilinkError", "PARTITION_COL", "dashboard",
}

# Every name that left the top level, with its one home: removing one breaks users' code
# (each still resolves at the top level, with a DeprecationWarning, until the next minor).
MOVED = {
    "trilink_spark.errors": [
        "InvalidArgumentError", "InvalidArgumentTypeError", "InvalidKeyTypeError",
        "NullKeyError", "UnknownStrategyError", "MissingColumnError", "ConfigError",
        "ConfigTypeError", "ConfigCenterUnavailableError", "StoreUnavailableError",
        "BrokerUnavailableError", "PartitionCountError", "KeysNotGroupedError",
        "MissingDependencyError", "DataLossError", "ReservedColumnError", "StateCorruptError",
        "StateStoreError", "StateTypeError", "StateOwnershipError", "ArithmeticOverflowError",
        "ConnectUnsupportedError"],
    "trilink_spark.columns": ["EVENT_TIME_COL"],
    "trilink_spark.eventtime": ["parse_interval"],
    "trilink_spark.partitioners": [
        "rebalance_minimal", "strategy_names", "balance_degree", "extra_compute_time",
        "keyed_bound", "BalanceReport", "StrategyScore", "choose_best", "CANDIDATES",
        "kafka_default_partition", "kafka_murmur2"],
    "trilink_spark.placement": [
        "FIT_MODES", "KeyedStrategy", "explain_keyed_agg", "KeyedAggPlan", "physical_plan",
        "shuffle_exchanges", "KafkaPythonPartitioner", "ahead_key_by", "confluent_partition",
        "SOURCE_AGGREGATES", "is_keyed_by_source", "keyed_by_source"],
    "trilink_spark.keyed": [
        "KeyedBatchFunction", "KeyedContext", "SwapReport", "TimerService", "WINDOW_AGGS"],
    "trilink_spark.state": ["KeyedStateStore"],
    "trilink_spark.merge": [
        "AGGREGATES", "Combine", "GLOBAL_STORES", "MERGE_MODES", "RedisStore",
        "LocalMergeBatchFunction", "local_merge_foreach_batch"],
    "trilink_spark.kafka": [
        "read_kafka", "register_kafka_source", "write_kafka", "read_trigger_cap",
        "write_trigger_cap"],
    "trilink_spark.switching": [
        "AdaptiveBatchFunction", "Decision", "adaptive_foreach_batch", "CONFIG_FIELDS",
        "ConfigCenter", "RedisConfigCenter", "validate_update", "REBALANCE_STATES",
        "LoadAwareRebalancer", "RebalanceDecision"],
    "trilink_spark.measurement": [
        "TASK_METRIC_COLUMNS", "task_metrics", "OPERATOR_TIMING_COLUMNS",
        "OPERATOR_TIMING_CONF", "OperatorTimer", "OperatorTimingReader",
        "read_operator_timings"],
    "trilink_spark.advice": [
        "FlowNetwork", "FlowResult", "find_bottlenecks", "learn_capacity", "max_flow",
        "operator_min_cut", "BottleneckAdvisor", "BottleneckListener", "BottleneckReport",
        "TrueRate", "ds2_plan"],
    "trilink_spark.elastic": ["Advice", "ElasticityAdvisor", "apply_advice",
                              "follow_trigger_cap"],
}
#: Second names for one thing: they resolve, deprecated, to the one name.
ALIASES = {"SWITCH_MODES": ("trilink_spark.switching", "MODES"),
           "KAFKA_SOURCE": ("trilink_spark.kafka", "SOURCE_NAME"),
           "ds2_parallelism": ("trilink_spark.advice.ds2", "ds2_parallelism")}


def test_public_names_are_pinned():
    assert set(tl.__all__) == PUBLIC
    assert len(tl.__all__) == len(set(tl.__all__)) <= 30
    for name in tl.__all__:
        assert getattr(tl, name) is not None, name
    assert isinstance(tl.__version__, str)


def test_every_name_that_left_the_top_level_resolves_to_its_home_with_a_warning():
    import importlib
    import warnings

    homes = {n: (m, n) for m, names in MOVED.items() for n in names} | ALIASES
    assert len(homes) == 100  # the 128 names of 0.1, less the 27 that stayed and __version__
    for name, (module, attr) in homes.items():
        home = importlib.import_module(module)
        if module != "trilink_spark.advice.ds2":  # the alias that goes is in no __all__
            assert attr in home.__all__, (name, module)
        with pytest.warns(DeprecationWarning, match=rf"trilink_spark\.{name} has moved to "
                          rf"{module.replace('.', '[.]')}\.{attr}"):
            old = getattr(tl, name)
        assert old is getattr(home, attr), name
        assert name not in dir(tl)  # listed nowhere: inspect.getmembers never warns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in PUBLIC:
            getattr(tl, name)  # the names that stay never warn
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        getattr(tl, "no_such_name")
    import inspect

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert {n for n, _ in inspect.getmembers(tl)} >= PUBLIC  # walking dir() never warns


def test_each_public_name_has_one_home():
    """A name in two subpackages' ``__all__`` is two names for one thing (unless one of the
    two is a subpackage that re-exports an internal module's names, as measurement does)."""
    import importlib

    seen: dict[str, str] = {}
    for module in sorted(MOVED):
        for name in importlib.import_module(module).__all__:
            assert name not in seen, (name, seen.get(name), module)
            seen[name] = module


def test_errors_share_one_root():
    errors = [getattr(tl, n) for n in tl.__all__ if n.endswith("Error")]
    assert errors and all(issubclass(e, tl.TrilinkError) for e in errors)


def _import_alone(module: str) -> tuple[str, int, str]:
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    return module, proc.returncode, proc.stderr[-2000:]


#: Run as ``python -c`` in a fresh interpreter, with the module names in argv. A fresh
#: ``python -c "import trilink_spark.x.y"`` first imports the package ``trilink_spark`` (its
#: eager facade), then whatever of ``x.y`` the facade did not load. So this imports the facade
#: once, exactly as such an interpreter does, and then imports each module the facade did not
#: load in a forked child of that state: the child starts where a fresh interpreter importing
#: that module would be after its facade step (the parent imports nothing else before it
#: forks), and exits through the normal interpreter shutdown. A module the facade loaded is
#: imported in a fresh interpreter by the facade step alone: nothing of it is left to run.
#: Prints one line, the repr of ``{module: (status, how, stderr tail)}``.
_ISOLATION_DRIVER = r"""
import os, sys
results = {}
try:
    import trilink_spark
except BaseException:
    import traceback
    tail = traceback.format_exc()[-2000:]
    results = {m: (1, "facade failed", tail) for m in sys.argv[1:]}
else:
    by_facade = {m for m in sys.modules if m == "trilink_spark" or m.startswith("trilink_spark.")}
    for module in sys.argv[1:]:
        if module in by_facade:
            results[module] = (0, "facade", "")
            continue
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            os.dup2(write, 2)
            os.close(write)
            exec("import " + module)  # an error exits the child with status 1 and its traceback
            raise SystemExit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            err = pipe.read()
        _, status = os.waitpid(pid, 0)
        results[module] = (os.waitstatus_to_exitcode(status), "forked",
                           err.decode(errors="replace")[-2000:])
sys.stdout.write(repr(results) + "\n")
"""


def _import_each_alone(modules: list[str]) -> dict[str, tuple[int, str, str]]:
    if not hasattr(os, "fork"):  # no fork here: a fresh interpreter per module, two at a time
        with ThreadPoolExecutor(max_workers=2) as pool:
            return {m: (code, "fresh", err) for m, code, err in pool.map(_import_alone, modules)}
    proc = subprocess.run([sys.executable, "-c", _ISOLATION_DRIVER, *modules],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last_line = proc.stdout.strip().splitlines()[-1]
    results: dict[str, tuple[int, str, str]] = ast.literal_eval(last_line)
    return results


def test_every_module_imports_in_isolation():
    modules = sorted(graph.modules())
    assert len(modules) > 40
    # the method against the real thing: two modules (the last and the middle one by name) in
    # a fresh interpreter of their own each, beside the driver, must come out as it says
    controls = [modules[-1], modules[len(modules) // 2]]
    with ThreadPoolExecutor(max_workers=3) as pool:
        each = pool.submit(_import_each_alone, modules)
        alone = list(pool.map(_import_alone, controls))
        results = each.result()
    assert set(results) == set(modules)
    assert {how for _, how, _ in results.values()} <= {"facade", "forked", "facade failed",
                                                        "fresh"}
    for module, code, err in alone:
        assert (code == 0) == (results[module][0] == 0), (module, err, results[module])
    failed = [(m, how, err) for m, (code, how, err) in sorted(results.items()) if code != 0]
    assert not failed, failed


def test_import_graph_has_no_circle_and_keeps_the_layers():
    mods = graph.modules()
    edges, private = graph.imports(mods)
    assert graph.cycles(edges, mods) == []
    assert graph.layer_violations(edges) == []
    assert graph.room_violations(edges, mods) == []
    assert private == []
    # the data plane never imports the control plane or the command
    plan = graph.package_map(edges)
    for sub in graph.DATA_PLANE:
        assert not {*graph.CONTROL_PLANE, "cli"} & plan.get(sub, set()), sub


def test_graph_checker_finds_a_circle_and_a_layer_breach(tmp_path):
    pkg = tmp_path / "trilink_spark"
    (pkg / "merge").mkdir(parents=True)
    (pkg / "switching").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "merge" / "__init__.py").write_text("")
    (pkg / "switching" / "__init__.py").write_text("")
    (pkg / "merge" / "a.py").write_text("from .b import x\nfrom ..switching.c import _y\n")
    (pkg / "merge" / "b.py").write_text("from .a import z\n")
    (pkg / "switching" / "c.py").write_text("")
    mods = graph.modules(pkg)
    edges, private = graph.imports(mods)
    assert graph.cycles(edges, mods) == [["trilink_spark.merge.a", "trilink_spark.merge.b"]]
    assert graph.layer_violations(edges) == [
        "trilink_spark.merge.a (merge) imports trilink_spark.switching.c (switching)"]
    assert private == ["trilink_spark.merge.a imports _y from trilink_spark.switching.c"]


def test_keyed_rooms_run_bottom_to_top():
    """keyed/ is cut by job: semantics < durable < swaps < records < run, each room a
    package with a docstring saying what it holds, and no module of keyed/ outside a room."""
    assert list(graph.ROOMS["keyed"]) == ["semantics", "durable", "swaps", "records", "run"]
    assert list(graph.ROOMS["merge"]) == ["algebra", "engines", "stores"]
    keyed = ROOT / "trilink_spark" / "keyed"
    assert sorted(p.name for p in keyed.glob("*.py")) == ["__init__.py"]
    for name in graph.ROOMS["keyed"]:
        doc = ast.get_docstring(ast.parse((keyed / name / "__init__.py").read_text()))
        assert doc and len(doc) > 80, name
    # the semantics need no I/O and no Spark: they import nothing of the package but the
    # bottom layer and themselves, and no module-level pyspark
    mods = graph.modules()
    edges, _ = graph.imports(mods)
    for mod in (m for m in mods if m.startswith("trilink_spark.keyed.semantics.")):
        assert {graph.subpackage(t) for t in edges[mod]} <= {
            "keyed", "_internal", "errors", "columns", "eventtime"}, mod
        assert {t for t in edges[mod] if graph.subpackage(t) == "keyed"} <= {
            t for t in mods if t.startswith("trilink_spark.keyed.semantics")}, mod
        tree = ast.parse(mods[mod].read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not any("pyspark" in ast.unparse(n) for n in top), mod


def test_graph_checker_finds_a_room_breach(tmp_path):
    pkg = tmp_path / "trilink_spark"
    for room in ("semantics", "run"):
        (pkg / "keyed" / room).mkdir(parents=True)
        (pkg / "keyed" / room / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "keyed" / "__init__.py").write_text("")
    (pkg / "keyed" / "semantics" / "a.py").write_text("from ..run import b\n")
    (pkg / "keyed" / "run" / "b.py").write_text("from ..semantics import a\n")
    (pkg / "keyed" / "loose.py").write_text("")
    mods = graph.modules(pkg)
    edges, _ = graph.imports(mods)
    assert graph.room_violations(edges, mods) == [
        "trilink_spark.keyed.semantics.a (keyed/semantics) imports trilink_spark.keyed.run.b "
        "(keyed/run)",
        "trilink_spark.keyed.loose sits in no room of keyed (semantics, durable, swaps, "
        "records, run)"]


def test_graph_checker_sees_what_hides_a_dependency(tmp_path):
    pkg = tmp_path / "trilink_spark"
    for sub in ("kafka", "placement", "switching"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "keys.py").write_text("_ALLOWED = 1\nfrom .switching import x\n")
    (pkg / "kafka" / "a.py").write_text(
        "from .. import key_by\nfrom ..placement import b\n"
        "import trilink_spark.keys as kk\nprint(kk._ALLOWED)\n"
        "import importlib\nimportlib.import_module('trilink_spark.switching')\n")
    (pkg / "placement" / "b.py").write_text("")
    (pkg / "switching" / "c.py").write_text("from ..switching import d\n")
    mods = graph.modules(pkg)
    edges, private = graph.imports(mods)
    assert "trilink_spark.kafka.a imports key_by from the facade" in graph.FACADE_IMPORTS
    assert any("calls import_module" in d for d in graph.DYNAMIC_IMPORTS)
    assert "trilink_spark.kafka.a reads _ALLOWED of trilink_spark.keys" in private
    breaches = graph.layer_violations(edges)
    assert breaches == [
        "trilink_spark.kafka.a (kafka) imports trilink_spark.placement.b (placement)",
        "trilink_spark.keys (keys) imports trilink_spark.switching (switching)",
    ]
    assert graph.own_package_imports(edges, mods) == [
        "trilink_spark.switching.c imports its own package trilink_spark.switching"]


def test_the_command_line_walker_passes():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "import_graph.py")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert "0 problem(s)" in proc.stdout


def test_internal_column_names_live_in_one_module():
    package = ROOT / "trilink_spark"
    for path in package.rglob("*.py"):
        if path.name == "columns.py":
            continue
        text = path.read_text(encoding="utf-8")
        for line in text.splitlines():
            stripped = line.strip()
            if stripped.startswith(("#", ">>>")):
                continue
            assert '= "_tl_' not in stripped, (path, line)


def test_no_docstring_cites_files_users_do_not_have():
    for path in (ROOT / "trilink_spark").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "seed 00" not in text and "design.md" not in text, path


def test_no_subpackage_over_5000_lines_without_rooms():
    """A subpackage past 5,000 lines is cut into rooms (``ROOMS``) of at most 5,000 each."""
    package = ROOT / "trilink_spark"
    for sub in (p for p in package.iterdir() if (p / "__init__.py").exists()):
        lines = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in sub.rglob("*.py"))
        if lines > 5000:
            assert sub.name in graph.ROOMS, (sub.name, lines)
            for room in graph.ROOMS[sub.name]:
                inside = sum(len(f.read_text(encoding="utf-8").splitlines())
                             for f in (sub / room).rglob("*.py"))
                assert inside <= 5000, (sub.name, room, inside)


def test_rooms_stay_small():
    """At most 4 flat modules beside the facade, and no module over 900 lines."""
    package = ROOT / "trilink_spark"
    flat = sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")
    assert len(flat) <= 4, flat
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for p in package.rglob("*.py")}
    assert len(sizes) > 40
    assert {p: n for p, n in sizes.items() if n > 900} == {}


def test_benches_examples_and_tools_import_what_exists():
    """Every ``from trilink_spark... import name`` outside the package names a module or an
    attribute that exists (a moved module or name fails here, not in a benchmark run), and
    none reaches a name through the facade's deprecated fallback."""
    import importlib
    import warnings

    checked = 0
    for folder in ("benches", "examples", "tools", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                        "trilink_spark") and not node.level:
                    module = importlib.import_module(node.module)
                    for alias in node.names:
                        full = f"{node.module}.{alias.name}"
                        with warnings.catch_warnings():
                            warnings.simplefilter("error", DeprecationWarning)
                            ok = hasattr(module, alias.name) or importlib.util.find_spec(full)
                        assert ok, f"{path.relative_to(ROOT)}:{node.lineno} imports {full}"
                        checked += 1
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("trilink_spark"):
                            importlib.import_module(alias.name)
                            checked += 1
    assert checked > 100
