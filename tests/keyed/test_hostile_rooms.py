"""Hostile checks of keyed/'s rooms: the old module paths' shims, and the runner's pickling,
swap requests and restarts after its placement decision moved into the Replanner."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark._internal.validation import choice, count
from trilink_spark.errors import InvalidArgumentError, TrilinkError
from trilink_spark.keyed import KeyedBatchFunction
from trilink_spark.keyed.swaps.plan import SwapReport, SwapRequest
from trilink_spark.keyed.swaps.replanner import SWAP_RECORD, Replanner
from trilink_spark.state.formats import check_history_record

from conftest import RunningCount
from testkit.swaps import stored_counts

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parents[2]


def fresh_python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a new interpreter (nothing of this process imported)."""
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)


def old_module(name: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(f"trilink_spark.keyed.{name}")


# ---------------------------------------------------------------------- the module shims
def test_star_import_of_an_old_path_binds_its_public_names() -> None:
    namespace: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        exec("from trilink_spark.keyed.streaming import *", namespace)
    assert {"keyed_foreach_batch", "KeyedBatchFunction"} <= set(namespace)


def test_old_history_helpers_that_took_the_runner_are_gone_with_a_pointer() -> None:
    """``run_history_keep`` and ``record_run_batch`` read and wrote fields of the runner's
    ``__dict__``; the runner's :class:`RunHistory` does their work now. Reading them at the old
    path says where the module went (CHANGELOG: removed internal helpers)."""
    from trilink_spark.keyed.records.history import RunHistory

    history = old_module("history")
    for name in ("run_history_keep", "record_run_batch"):
        with pytest.raises(AttributeError, match="moved to trilink_spark.keyed.records.history"):
            getattr(history, name)
    assert callable(RunHistory().start)


def test_old_process_keyed_batch_still_resolves() -> None:
    process = old_module("process")
    with pytest.deprecated_call():
        assert process.KeyedBatch is tl.keyed.KeyedRows


def test_state_batch_is_an_attribute_of_its_package_without_importing_it() -> None:
    done = fresh_python("""
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        import trilink_spark.state as state
        print(state.batch.StatefulBatchFunction.__name__)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "StatefulBatchFunction"


def test_dir_hasattr_and_a_name_that_never_existed() -> None:
    streaming = old_module("streaming")
    assert {"keyed_foreach_batch", "KeyedBatchFunction"} <= set(dir(streaming))
    assert not hasattr(streaming, "never_existed")
    with pytest.raises(AttributeError, match="never_existed.*moved to "
                       "trilink_spark.keyed.run.streaming"):
        streaming.never_existed  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("trilink_spark.keyed.never_existed")
    with pytest.raises(AttributeError):
        tl.keyed.never_existed  # noqa: B018
    with pytest.raises(AttributeError):  # dunder names are never forwarded
        streaming.__wrapped__  # noqa: B018


def test_every_old_path_reads_the_same_objects_as_its_home_and_warns_each_read() -> None:
    snapshot = old_module("snapshot")
    with pytest.deprecated_call(match="snapshot.encode_state has moved to "
                                "trilink_spark.keyed.durable.codec.encode_state"):
        encode = snapshot.encode_state
    from trilink_spark.keyed.durable.codec import encode_state
    assert encode is encode_state
    namespace: dict[str, object] = {}
    with pytest.deprecated_call():  # as user code would write it (exec: the house test walks
        exec("from trilink_spark.keyed.swap import SwapReport as Old", namespace)  # imports)
    assert namespace["Old"] is SwapReport


def test_reload_of_an_old_path_keeps_it_working() -> None:
    streaming = old_module("streaming")
    reloaded = importlib.reload(streaming)
    assert reloaded is sys.modules["trilink_spark.keyed.streaming"]
    with pytest.deprecated_call():
        assert reloaded.keyed_foreach_batch is tl.keyed_foreach_batch


def test_pickles_by_old_paths_load_the_objects_of_their_homes() -> None:
    # an earlier release pickled a class by its module path then: GLOBAL 'module name'
    for old, name, home in [("swap", "SwapReport", SwapReport),
                            ("swap", "SwapRequest", SwapRequest),
                            ("streaming", "KeyedBatchFunction", KeyedBatchFunction)]:
        stream = f"ctrilink_spark.keyed.{old}\n{name}\n.".encode()
        with pytest.deprecated_call():
            assert pickle.loads(stream) is home  # noqa: S301 - the test's own bytes
    # and what is reached by an old path pickles by its home
    with pytest.deprecated_call():
        old_class = old_module("swap").SwapRequest
    request = old_class.checked(None, 4, "minimal", "sync", None)
    assert b"trilink_spark.keyed.swaps.plan" in pickle.dumps(request)
    assert pickle.loads(cloudpickle.dumps(request)) == request  # noqa: S301


RACE = """
    import importlib, sys, threading, warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    import trilink_spark.keyed as keyed
    split = errors = 0
    for _ in range(150):
        for name in ("snapshot", "streaming"):  # each round is a first read of both paths
            sys.modules.pop("trilink_spark.keyed." + name, None)
            keyed.__dict__.pop(name, None)
        got, failed = [], []
        start = threading.Barrier(8)
        def by_import(name):
            start.wait()
            try:
                got.append((name, importlib.import_module("trilink_spark.keyed." + name)))
            except BaseException as err:
                failed.append(err)
        def by_attribute(name):
            start.wait()
            try:
                got.append((name, getattr(keyed, name)))
            except BaseException as err:
                failed.append(err)
        ways = WAYS
        threads = [threading.Thread(target=f, args=(n,)) for n in ("snapshot", "streaming")
                   for f in ways]
        [t.start() for t in threads]; [t.join() for t in threads]
        errors += len(failed)
        split += any(len({id(m) for n, m in got if n == name}) > 1
                     for name in ("snapshot", "streaming"))
    print(errors, split)
"""


@pytest.mark.parametrize("ways", ["(by_import,) * 4", "(by_attribute,) * 4"])
def test_first_reads_from_four_threads_by_one_way_get_one_module(ways: str) -> None:
    done = fresh_python(RACE.replace("WAYS", ways))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "0"]


def test_first_reads_from_four_threads_by_import_and_attribute_get_one_module() -> None:
    done = fresh_python(RACE.replace("WAYS", "(by_import, by_attribute) * 2"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "0"]


def test_python_w_error_imports_the_package_and_raises_on_old_names_only() -> None:
    done = fresh_python("""
        import trilink_spark, trilink_spark.keyed, trilink_spark.testing, trilink_spark.state
        import trilink_spark.keyed.streaming as old  # the module itself gives no warning
        try:
            old.keyed_foreach_batch
        except DeprecationWarning as err:
            print("raised:", err)
    """, "-W", "error")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "raised: trilink_spark.keyed.streaming.keyed_foreach_batch has moved to" \
        in done.stdout


# ---------------------------------------------------------------------- the runner, no Spark
class Count(RunningCount):
    pass


def write(df: Any, b: int) -> None:
    df.count()


def make_run(tmp_path: Path, **kw: Any) -> KeyedBatchFunction:
    kw.setdefault("num_partitions", 4)
    return tl.keyed_foreach_batch(write, "k", "t", Count(), 1_000_000, str(tmp_path / "state"),
                                  **kw)


def old_layout(run: KeyedBatchFunction, request: SwapRequest | None) -> dict[str, Any]:
    """The pickled state an earlier release's runner had (placement fields on the runner)."""
    planner = run.replanner
    return {"func": run.func, "store": run.store, "options": run.options, "token": run.token,
            "swaps": [], "rebalances": [(3, "kept")], "_rebalanced_through": 3,
            "_request": request, "_types": None, "_column": None, "_derived_kind": None,
            "_warned_files": False, "_ttl_units": float("inf"),
            "_processing_ttl_ms": float("inf"), "_clock": run._clock,
            "_arguments": dict(planner._arguments), "_restart_checked": True,
            "_adaptive": ("hash", 2), "_picked_up": True, "_persisted": None,
            "_history_keep": 7, "_history_skipped": True}


def test_a_pending_swap_and_a_working_lock_survive_the_round_trip(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    run.request_swap(num_partitions=8)
    copy = pickle.loads(cloudpickle.dumps(run))  # noqa: S301 - the test's own bytes
    assert copy.pending_swap == run.pending_swap
    assert copy.replanner.store is copy.store and copy.replanner.options is copy.options
    assert copy.replanner._lock.acquire(timeout=1)
    copy.replanner._lock.release()
    assert copy.cancel_swap() == run.pending_swap
    assert copy.pending_swap is None and copy.cancel_swap() is None
    assert copy.store.load_record(SWAP_RECORD) is None  # the stored request went with it


def test_a_run_pickled_with_the_old_field_layout_keeps_its_placement_fields(
        tmp_path: Path) -> None:
    run = make_run(tmp_path)
    request = SwapRequest.checked(None, 8, "minimal", "sync", None)
    old = KeyedBatchFunction.__new__(KeyedBatchFunction)
    old.__setstate__(old_layout(run, request))
    planner = old.replanner
    assert isinstance(planner, Replanner)
    assert old.pending_swap == request
    assert old.rebalances == [(3, "kept")] and planner._rebalanced_through == 3
    assert planner._restart_checked and planner._adaptive == ("hash", 2)
    assert old.history.keep == 7 and old.history.skipped
    assert planner._lock.acquire(timeout=1)
    planner._lock.release()
    again = pickle.loads(cloudpickle.dumps(old))  # noqa: S301 - the test's own bytes
    assert again.pending_swap == request and again.rebalances == [(3, "kept")]


def test_a_run_pickled_before_the_restart_fields_gets_this_starts_arguments(
        tmp_path: Path) -> None:
    run = make_run(tmp_path, num_partitions=6)
    fields = {k: v for k, v in old_layout(run, None).items()
              if k not in {"_arguments", "_restart_checked", "_adaptive", "_picked_up",
                           "_persisted"}}
    old = KeyedBatchFunction.__new__(KeyedBatchFunction)
    old.__setstate__(fields)
    assert old.replanner._arguments == run.replanner._arguments
    assert not old.replanner._restart_checked and not old.replanner._picked_up


def test_swap_requests_from_four_threads_leave_one_request_stored_and_pending(
        tmp_path: Path) -> None:
    run = make_run(tmp_path)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def ask(n: int) -> None:
        start.wait()
        try:
            for i in range(15):
                run.request_swap(num_partitions=2 + (n * 15 + i) % 9)
                if i % 5 == 4:
                    run.cancel_swap()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    stored = run.store.load_record(SWAP_RECORD)
    pending = run.pending_swap
    if pending is None:
        assert stored is None
    else:
        assert stored is not None
        assert SwapRequest.from_record(stored, "record").request_id == pending.request_id


@pytest.mark.parametrize("kw, match", [
    ({"num_partitions": 0}, "num_partitions"),
    ({"refit": "max"}, "refit"),
    ({"mode": "fluid"}, "max_keys_per_batch"),
    ({"mode": 3}, "mode"),
    ({"num_partitions": 2**63}, "num_partitions"),
])
def test_bad_swap_requests_are_typed_and_say_what_is_allowed(tmp_path: Path, kw: Any,
                                                             match: str) -> None:
    run = make_run(tmp_path)
    with pytest.raises(TrilinkError, match=match) as caught:
        run.request_swap(**kw)
    assert isinstance(caught.value, (ValueError, TypeError))
    assert run.pending_swap is None and run.store.load_record(SWAP_RECORD) is None


# ---------------------------------------------------------------------- the runner on Spark
def frames(spark: Any, b: int, rows: int = 300) -> tuple[Any, pd.Series]:
    rng = np.random.default_rng(b)
    keys = [f"k{i:02d}" for i in rng.integers(0, 40, rows)]
    frame = pd.DataFrame({"k": keys, "t": np.arange(b * rows, (b + 1) * rows, dtype=np.int64)})
    return spark.createDataFrame(frame), frame["k"].value_counts()


def test_old_layout_run_carries_out_its_swap_replays_and_restarts(spark: Any,
                                                                  tmp_path: Path) -> None:
    run = make_run(tmp_path)
    df0, c0 = frames(spark, 0)
    run(df0, 0)
    # the run as an earlier release pickled it, with a swap requested and not yet planned
    old = KeyedBatchFunction.__new__(KeyedBatchFunction)
    old.__setstate__(old_layout(run, SwapRequest.checked(None, 6, "minimal", "sync", None)))
    old = pickle.loads(cloudpickle.dumps(old))  # noqa: S301 - the test's own bytes
    df1, c1 = frames(spark, 1)
    old(df1, 1)
    assert old.swaps and old.swaps[-1].refused is None
    assert old.pending_swap is None
    total = c0.add(c1, fill_value=0)
    assert stored_counts(old) == {k: int(v) for k, v in total.items()}
    assert set(old.owners().values()) <= set(range(6)) and max(old.owners().values()) >= 4
    old(df1, 1)  # replayed: the same batch id, the same state
    assert stored_counts(old) == {k: int(v) for k, v in total.items()}
    assert {s.batch_id for s in old.swaps} == {1}  # the replay reuses batch 1's plan
    # a restart on the same state path with other arguments: carried out or refused, typed
    restarted = make_run(tmp_path, num_partitions=3, takeover=True)
    df2, c2 = frames(spark, 2)
    try:
        restarted(df2, 2)
    except TrilinkError as err:
        assert "num_partitions" in str(err) or "restart" in str(err)
        return
    total = total.add(c2, fill_value=0)
    assert stored_counts(restarted) == {k: int(v) for k, v in total.items()}
    assert set(restarted.owners().values()) <= set(range(3))


def test_request_swap_while_a_batch_runs_and_refusals_are_typed(spark: Any,
                                                                tmp_path: Path) -> None:
    run = make_run(tmp_path)
    df0, c0 = frames(spark, 0)
    run(df0, 0)
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            for n in (5, 6, 7):
                run.request_swap(num_partitions=n)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    df1, c1 = frames(spark, 1)
    [t.start() for t in threads]
    run(df1, 1)
    [t.join() for t in threads]
    assert not errors
    df2, c2 = frames(spark, 2)
    run(df2, 2)  # whatever request was left is carried out here
    assert run.pending_swap is None
    total = c0.add(c1, fill_value=0).add(c2, fill_value=0)
    assert stored_counts(run) == {k: int(v) for k, v in total.items()}
    with pytest.raises(TrilinkError, match="Modulo needs integer keys") as caught:
        run.request_swap("modulo")  # refused at once: the key type is known by now
    assert isinstance(caught.value, TypeError)
    assert run.pending_swap is None
    with pytest.raises(InvalidArgumentError, match="mode"):
        run.request_swap(mode="later")


# ---------------------------------------------------------------------- validation, the record

RECORD = {"v": 1, "batch": 3, "time": 1.0, "seconds": 0.5, "strategy": "hash",
          "partitions": 2, "rows": [10, -1]}


@pytest.mark.parametrize("field, value, error, match", [
    ("batch", True, TypeError, "batch must be an int, got bool"),
    ("batch", 2**63, ValueError, "batch must be at most 9,223,372,036,854,775,807"),
    pytest.param("batch", 10**5000, ValueError, "batch must be at most", id="5000-digits"),
    ("time", float("nan"), ValueError, "time must be a finite number"),
    ("seconds", float("nan"), ValueError, "seconds"),
    ("partitions", 10**9, ValueError, "partitions must be at most"),
    ("rows", [float("inf"), 1], ValueError, r"rows\[0\] must be a finite number"),
    ("rows", [True, 1], TypeError, r"rows\[0\] must be a number, got bool"),
    ("rows", [1, 2, 3], ValueError, "rows"),
    ("strategy", "x" * 100_000, ValueError, "at most 200"),
    ("hot_keys", [[{"a": 1}, 1, 0]], TypeError, "JSON scalar"),
    ("v", 2, ValueError, "record.v must be 1"),
])
def test_hostile_history_records_are_refused_naming_the_field(field: str, value: Any,
                                                               error: type, match: str) -> None:
    with pytest.raises(TrilinkError, match=match) as caught:
        check_history_record({**RECORD, field: value})
    assert isinstance(caught.value, error)
    with pytest.raises(TrilinkError, match=f"h.json.*{match}|{match}.*h.json"):
        check_history_record({**RECORD, field: value}, "h.json")


@pytest.mark.parametrize("value, error", [(b"sync", TypeError), (None, TypeError),
                                          ("SYNC", ValueError), ("", ValueError)])
def test_choice_refusals_name_what_is_allowed(value: Any, error: type) -> None:
    with pytest.raises(TrilinkError, match="'sync', 'fluid'") as caught:
        choice(value, "mode", ("sync", "fluid"))
    assert isinstance(caught.value, error)


@pytest.mark.parametrize("value, error", [(True, TypeError), (3.0, TypeError), ("3", TypeError),
                                          (0, ValueError), (2**63, ValueError),
                                          (np.uint64(2**64 - 1), ValueError)], ids=str)
def test_count_refusals_are_typed(value: Any, error: type) -> None:
    with pytest.raises(TrilinkError, match="n must be") as caught:
        count(value, "n", high=2**63 - 1)
    assert isinstance(caught.value, error)
