"""Swaps on the executor-local store under attack: a swap batch cuts its
segments from the sources' local copies (``read_moved``), and each task logs only its batch's,
due, leaving and arriving keys in a changelog.

Oracles: every key stored once with its exact count (``check_invariants``); each local copy at
the committed version holds exactly the keys the state path puts in its partition (``audit``);
outputs equal to the file store's under the same (deterministic) placements; and the state
TTL's own rule (a key whose partition moved on by ``state_ttl`` since its last row is gone).
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
import trilink_spark.keyed.durable.local_sync as incremental
from trilink_spark.columns import EVENT_TIME_COL
from trilink_spark.keyed.durable.local_sync import (LocalConfig, SwapIn, load_touched,
                                                    save_touched, sync)
from trilink_spark.keyed.semantics.process import KeyedRuntime
from trilink_spark.state.local import LocalState
from trilink_spark.state.store import KeyedStateStore
from trilink_spark.state.held import ask_release
from conftest import KeylessCount
from testkit.swaps import check_invariants, die_after_writing

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"u{i:04d}" for i in range(400)]


Count = KeylessCount


def frame(spark: Any, b: int, keys: list[Any], rows: int = 200, schema: str = "k string, t long"
          ) -> tuple[Any, pd.Series]:
    rng = np.random.default_rng(b)
    idx = rng.choice(len(keys), size=rows)
    if b == 0:
        idx = np.concatenate([np.arange(len(keys)), idx])
    ks = [keys[i] for i in idx]
    df = spark.createDataFrame([(k, b * 100_000 + i) for i, k in enumerate(ks)], schema)
    return df, pd.Series(ks, dtype=object).fillna("<null>").value_counts()


def _label(key: Any) -> Any:
    return "<null>" if key is None or (isinstance(key, float) and math.isnan(key)) else key


def _decode(kb: bytes) -> Any:
    tag, body = kb[4], kb[5:]
    if tag == 0:
        return "<null>"
    if tag == 1:
        u = int.from_bytes(body, "big") ^ (1 << 63)
        return u - (1 << 64) if u >= (1 << 63) else u
    if tag == 3:
        return body
    raise AssertionError(f"key tag {tag}")


def audit(run: Any, root: Path) -> dict[int, Any]:
    """Copies at the committed version whose keys differ from the state path's partition."""
    committed = run.store.read_manifest()["committed"][-1]
    want: dict[int, set[Any]] = {}
    for key, p in run.owners().items():
        key = _label(key)
        want.setdefault(p, set()).add(key.encode() if isinstance(key, str) and key != "<null>"
                                      else key)
    bad: dict[int, Any] = {}
    checked = 0
    for store_dir in [d for d in root.glob("*") if d.is_dir()]:
        for db in store_dir.glob("p*.db"):
            pid = int(db.name[1:6])
            with LocalState.open(str(root), store_dir.name, pid) as local:
                if local.version != committed:
                    continue
                held = [_decode(k) for k, _ in local.rows()]
            checked += 1
            if len(held) != len(set(held)) or set(held) != want.get(pid, set()):
                bad[pid] = (len(held), len(want.get(pid, set())))
    assert checked, "no local copy at the committed version"
    return bad


def make_run(tmp_path: Path, func: Any = None, **kw: Any) -> Any:
    kw.setdefault("num_partitions", 4)
    return tl.keyed_foreach_batch(func or (lambda df, b: df.count()), "k", "t", Count(), 10**9,
                                  str(tmp_path / "state"), **kw)


# --------------------------------------------------------------------------- defects
@pytest.mark.parametrize("damage", ["garbage_rows", "lost_row"])
def test_a_damaged_source_copy_is_rebuilt_by_the_segment_job_not_fatal(
        spark: Any, tmp_path: Path, local_root: Path, damage: str) -> None:
    """A non-swap batch treats a damaged copy as a cache and rebuilds it
    (test_local_store.test_a_damaged_local_copy_is_rebuilt_not_trusted); the swap's segment
    job (read_moved) must too, never fail the batch on every retry."""
    from rocksdict import Options, Rdict

    run = make_run(tmp_path, strategy=tl.BlockPartitioner(4, num_blocks=64))
    df, total = frame(spark, 0, KEYS, 1000)
    run(df, 0)
    for db_dir in local_root.rglob("p0000*.db"):
        ask_release(str(db_dir))  # a worker holds it open since its task
        db = Rdict(str(db_dir), Options(raw_mode=True))
        rows = [k for k in db.keys() if k.startswith(b"r")]
        if damage == "garbage_rows":
            for k in rows:
                db[k] = db[k][:12] + b"\x07garbage"  # a row no decoder accepts
        else:
            for k in rows[::3]:
                del db[k]  # the copy lost rows (its meta still says version 0)
        db.close()
    run.request_swap(num_partitions=6)
    df, counts = frame(spark, 1, KEYS[:40])
    for attempt in range(2):  # a retry of the batch must not fail the same way
        try:
            run(df, 1)
            break
        except Exception as err:  # noqa: BLE001
            if attempt:
                pytest.fail(f"the swap batch fails on every retry: {str(err)[-300:]}")
    check_invariants(run, total.add(counts, fill_value=0))
    assert audit(run, local_root) == {}


def test_leaving_keys_are_excluded_in_linear_time(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """load_touched of a swap batch: O(batch + due + moved keys), never O(wanted x leaving)
    (the set of leaving keys is built once)."""
    class C(tl.KeyedWatermarkProcessFunction):
        def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
            ctx.set_state("n", ctx.get_state("n", 0) + len(rows))

    batch_keys, leaving = 500, 5_000
    store = KeyedStateStore(str(tmp_path / "state"))
    config = LocalConfig(str(tmp_path / "local"), "sid", 1000, math.inf, None)
    keys = [f"k{i:07d}" for i in range(batch_keys + leaving)]
    first = pd.DataFrame({"k": keys, EVENT_TIME_COL: np.ones(len(keys))})
    with LocalState.open(config.root, config.store_id, 0) as local:
        sync(local, store, config, 0, None, C(), 0.0, math.inf)
        state, before = load_touched(local, config, first, "k", pa.string(), "t")
        runtime = KeyedRuntime(C(), "k", 0.0, math.inf, state, None)
        runtime.process(first)
        save_touched(local, store, config, 0, 0, None, runtime.snapshot(), before, pa.string(),
                     None, C(), 0.0, math.inf, lambda: None)
    hashed = [0]

    def counting_set(items: Any = ()) -> set[Any]:
        out = set(items)
        hashed[0] += len(out)
        return out

    monkeypatch.setattr(incremental, "set", counting_set, raising=False)
    batch = pd.DataFrame({"k": keys[:batch_keys], EVENT_TIME_COL: np.full(batch_keys, 2.0)})
    swap = SwapIn(pa.array(keys[batch_keys:]), [])
    with LocalState.open(config.root, config.store_id, 0) as local:
        load_touched(local, config, batch, "k", pa.string(), "t", None, swap)
    assert hashed[0] <= 10 * (batch_keys + leaving), hashed[0]


def _idle_case(spark: Any, tmp_path: Path, store: str, ttl: float | None
               ) -> tuple[dict[int, list[Any]], Any, list[str]]:
    """Partition 0 holds quiet keys (last row at t=10); partition 1's keys run ahead (t=500).
    Batch 2 swaps 2 -> 3 partitions (refit="none": the same placement on both stores) and
    moves some of partition 1's keys into partition 0, whose only row of the batch is one
    quiet key's; so only the arriving keys raise partition 0's event time to 500."""
    cands = [f"c{i:03d}" for i in range(200)]
    h2 = tl.HashPartitioner(2).for_column("string").assign(cands)
    h3 = tl.HashPartitioner(3).for_column("string").assign(cands)
    quiet = [k for k, a, b in zip(cands, h2, h3) if a == 0 and b == 0][:10]
    ahead = [k for k, a in zip(cands, h2) if a == 1][:20]
    assert sum(1 for k in ahead if h3[cands.index(k)] == 0) >= 3
    batches = [[(k, 10) for k in quiet + ahead], [(k, 500) for k in ahead], [(quiet[0], 11)],
               [(k, 12) for k in quiet], [(k, 5000) for k in quiet + ahead]]
    outs: dict[int, list[Any]] = {}

    def sink(out: Any, b: int) -> None:
        outs[b] = sorted(tuple(r) for r in out.collect())

    kw: dict[str, Any] = {"state_ttl": ttl} if ttl is not None else {"idle_timeout": 50}
    proc = tl.KeyedWindowAggregate(100, aggs=("count",)) if ttl is None else Count()
    run = tl.keyed_foreach_batch(sink, "k", "t", proc, 0, str(tmp_path / store), strategy="hash",
                                 num_partitions=2, state_store=store, **kw)
    for b, rows in enumerate(batches[: 3 if ttl is not None else 5]):
        if b == 2:
            run.request_swap(num_partitions=3, refit="none")
        run(spark.createDataFrame(pd.DataFrame(rows, columns=["k", "t"]), "k string, t long"), b)
    assert run.swaps[-1].moved_keys > 0
    return outs, run, quiet


def test_keys_the_arriving_keys_make_idle_fire_in_the_swap_batch(spark: Any, tmp_path: Path,
                                                                 local_root: Path) -> None:
    """The arriving keys raise the destination's event time (merge_in); its own quiet keys
    then turn idle and their windows close on the partition watermark, in the swap batch, as
    the file store does: the due keys are picked by the event time after the merge, or the
    windows stay open and take later rows the file store counts as late."""
    local_out, local_run, _ = _idle_case(spark, tmp_path, "rocksdb", None)
    files_out, files_run, _ = _idle_case(spark, tmp_path, "files", None)
    assert local_run.counters() == files_run.counters()
    assert local_out == files_out


def test_a_swap_batch_expires_the_keys_its_arrivals_make_stale(spark: Any, tmp_path: Path,
                                                               local_root: Path) -> None:
    """state_ttl: after a task, no key is left whose partition moved on by the TTL since its
    last row (a non-swap batch keeps that: the wake index reads them), in a swap batch too:
    the arriving keys raise partition 0's event time to 500, so its quiet keys (last row at
    10, TTL 100) expire in it."""
    _, run, quiet = _idle_case(spark, tmp_path, "rocksdb", 100.0)
    stored = set(run.state_values())
    assert not stored & set(quiet[1:]), sorted(stored & set(quiet[1:]))


def test_an_empty_swap_batch_keeps_the_copies_current(spark: Any, tmp_path: Path,
                                                      local_root: Path) -> None:
    """README: 'the copies stay current, so the batch after the swap rebuilds nothing', for
    an empty micro-batch too: its partitions, which no task ran for, are run on their local
    copies (the leaving keys go, the arriving ones come in), not rewritten whole."""
    run = make_run(tmp_path)
    df, total = frame(spark, 0, KEYS)
    run(df, 0)
    run.request_swap(num_partitions=6)
    run(spark.createDataFrame([], "k string, t long"), 1)
    assert run.swaps[-1].moved_keys > 0
    df, counts = frame(spark, 2, KEYS)
    run(df, 2)
    check_invariants(run, total.add(counts, fill_value=0))
    assert set(run.task_timings(2)["sync"]) == {"current"}


def test_the_plan_reads_each_partition_once_per_swap_batch(
        spark: Any, tmp_path: Path, local_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README: the plan reads every partition's version on the driver at each swap batch
    (each step of a fluid swap plans again): once per partition and swap batch, never more
    (the tasks and the segment job read the local copies, not the state path)."""
    run = make_run(tmp_path, strategy=tl.BlockPartitioner(4, num_blocks=64))
    df, _ = frame(spark, 0, KEYS)
    run(df, 0)
    loads: list[int] = []
    real = KeyedStateStore.load_table

    def counted(self: KeyedStateStore, partition: int, version: int) -> Any:
        loads.append(partition)
        return real(self, partition, version)

    monkeypatch.setattr(KeyedStateStore, "load_table", counted)  # the driver only
    run.request_swap(num_partitions=6, mode="fluid", max_keys_per_batch=60)
    b = 1
    while True:
        df, _ = frame(spark, b, KEYS[:40])
        run(df, b)
        b += 1
        if run.swaps[-1].complete:
            break
    assert b > 2  # several steps
    steps = b - 1
    assert len(loads) <= 6 * steps, f"{len(loads)} partitions loaded over {steps} swap batches"


# --------------------------------------------------------------------------- claims that hold
def dies_at(b_dead: int, how: str) -> Any:
    def sink(out: Any, b: int) -> None:
        if b == b_dead:
            if how == "after":
                die_after_writing(out, b)
            if how == "partial":
                out.limit(1).collect()
            raise RuntimeError("driver died")
        out.count()
    return sink


@pytest.mark.parametrize("strategy,swap,crash,how", [
    ("hash", {"num_partitions": 6}, 2, "after"),
    ("hash", {"num_partitions": 2}, 2, "after"),
    ("block", {"num_partitions": 2}, 2, "before"),
    ("hash", {"num_partitions": 2}, 2, "partial"),
    ("hash", {"num_partitions": 6, "mode": "fluid", "max_keys_per_batch": 40}, 3, "after"),
    ("block", {"strategy": "hash", "mode": "fluid", "max_keys_per_batch": 40}, 3, "after"),
])
def test_a_driver_dying_in_a_swap_batch_replays_exactly(spark: Any, tmp_path: Path,
                                                        local_root: Path, strategy: str,
                                                        swap: dict[str, Any], crash: int,
                                                        how: str) -> None:
    placement = (lambda: tl.BlockPartitioner(4, num_blocks=64)) if strategy == "block" \
        else (lambda: "hash")
    run = make_run(tmp_path, func=dies_at(crash, how), strategy=placement())
    total = pd.Series(dtype=np.int64)
    rows = 0
    for b in range(crash):
        if b == 2:
            run.request_swap(**swap)
        df, counts = frame(spark, b, KEYS)
        run(df, b)
        total, rows = total.add(counts, fill_value=0), rows + int(counts.sum())
    if crash == 2:
        run.request_swap(**swap)
    df, counts = frame(spark, crash, KEYS)
    with pytest.raises(Exception, match="driver died"):
        run(df, crash)
    run = make_run(tmp_path, strategy=placement(), takeover=True)
    for b in range(crash, crash + 3):
        if b > crash:
            df, counts = frame(spark, b, KEYS)
        run(df, b)
        total, rows = total.add(counts, fill_value=0), rows + int(counts.sum())
        check_invariants(run, total)
        assert run.counters()["rows"] == rows  # removed partitions' counters carried
        assert audit(run, local_root) == {}


@pytest.mark.parametrize("schema,keys,strategy", [
    ("k int, t long", list(range(-150, 150)) + [None],
     lambda: tl.BlockPartitioner(4, num_blocks=64, null_policy="partition0")),
    ("k long, t long", [-(2**63), 2**63 - 1, 0, -1] + [i * 2**50 for i in range(-60, 60)],
     lambda: tl.BlockPartitioner(4, num_blocks=64)),
    ("k string, t long", [f"s{i}" for i in range(100)] + ["", "😀" * 3, "x" * (1 << 20), None],
     lambda: tl.HashPartitioner(4, null_policy="partition0")),
    ("k short, t long", list(range(-60, 60)), lambda: tl.BlockPartitioner(4, num_blocks=64)),
])
def test_swaps_of_each_key_type_keep_state_and_copies_exact(spark: Any, tmp_path: Path,
                                                             local_root: Path, schema: str,
                                                             keys: list[Any], strategy: Any
                                                             ) -> None:
    run = make_run(tmp_path, strategy=strategy())
    total = pd.Series(dtype=np.int64)
    swaps = {1: {"num_partitions": 6}, 2: {"num_partitions": 3},
             3: {"strategy": tl.HashPartitioner(3, null_policy="partition0")}}  # another layout
    for b in range(5):
        if b in swaps:
            run.request_swap(**swaps[b])
        df, counts = frame(spark, b, keys, 80, schema)
        run(df, b)
        total = total.add(counts, fill_value=0)
        check_invariants(run, total, null_key="<null>")
        assert audit(run, local_root) == {}
    assert set(run.task_timings(4)["sync"]) == {"current"}


def test_window_results_are_the_same_with_and_without_a_swap(spark: Any, tmp_path: Path,
                                                             local_root: Path) -> None:
    """Shared window tables move with their keys: per-key watermarks (no idle timeout), so the
    outputs do not depend on the placement."""
    keys = [f"w{i:03d}" for i in range(120)]

    def batch(b: int) -> Any:
        rng = np.random.default_rng(b)
        ks = [keys[i] for i in rng.choice(len(keys), size=600)]
        t = rng.integers(b * 50, b * 50 + 80, size=600)
        return spark.createDataFrame(pd.DataFrame({"k": ks, "t": t, "v": rng.integers(0, 99, 600)}),
                                     "k string, t long, v long")

    results = []
    for name, swaps in (("plain", {}), ("swapped", {2: {"num_partitions": 6},
                                                    4: {"num_partitions": 3, "mode": "fluid",
                                                        "max_keys_per_batch": 20}})):
        outs: dict[int, list[Any]] = {}
        run = tl.keyed_foreach_batch(
            lambda out, b: outs.__setitem__(b, sorted(tuple(r) for r in out.collect())),
            "k", "t", tl.KeyedWindowAggregate(100, value="v", aggs=("count", "sum", "max")), 10,
            str(tmp_path / name), strategy=tl.BlockPartitioner(4, num_blocks=64),
            num_partitions=4)
        for b in range(7):
            if b in swaps:
                run.request_swap(**swaps[b])
            run(batch(b), b)
        results.append(outs)
    assert results[0] == results[1] and sum(map(len, results[0].values())) > 0


def test_state_ttl_across_swaps_lost_and_stale_copies(spark: Any, tmp_path: Path,
                                                      local_root: Path) -> None:
    """Every partition gets rows each batch and event times jump 1,000 a batch with TTL 500:
    after batch b exactly the keys of the latest run of consecutive batches survive, with the
    rows of that run. Swaps (sync up, fluid, down), copies deleted between the segment job and
    the tasks, and a copy of partition 1 put back at an older version."""
    keys = [f"t{i:03d}" for i in range(80)]
    saved: dict[str, Any] = {}

    def sink(out: Any, b: int) -> None:  # runs after the segment job, before the tasks
        copy = next(local_root.rglob("p00001.db"), None)
        if b == 2 and copy is not None:
            shutil.copytree(copy, tmp_path / "p1_at_1")
            saved["dir"] = copy
        if b == 3:
            shutil.rmtree(local_root, ignore_errors=True)
        if b == 5 and "dir" in saved:
            shutil.rmtree(saved["dir"], ignore_errors=True)
            shutil.copytree(tmp_path / "p1_at_1", saved["dir"])
        out.count()

    run = tl.keyed_foreach_batch(sink, "k", "t", Count(), 10**6, str(tmp_path / "state"),
                                 strategy=tl.BlockPartitioner(4, num_blocks=64),
                                 num_partitions=4, state_ttl=500)
    swaps = {2: {"num_partitions": 6}, 3: {"num_partitions": 5, "mode": "fluid",
                                           "max_keys_per_batch": 10}, 5: {"num_partitions": 3}}
    run_sum: dict[str, int] = {}
    for b in range(7):
        if b in swaps and (not run.swaps or run.swaps[-1].complete):  # none under way
            run.request_swap(**swaps[b])
        rng = np.random.default_rng(1000 + b)
        active = rng.choice(len(keys), size=50, replace=False)
        ks = [keys[i] for i in np.concatenate([active, rng.choice(active, size=350)])]
        t = b * 1000 + rng.integers(0, 10, size=len(ks))
        run(spark.createDataFrame(pd.DataFrame({"k": ks, "t": t}), "k string, t long"), b)
        counts = pd.Series(ks).value_counts()
        run_sum = {k: run_sum.get(k, 0) + int(v) for k, v in counts.items()}
        assert {k: int(v["n"]) for k, v in run.state_values().items()} == run_sum
        assert audit(run, local_root) == {}


def test_upkeep_ms_is_minus_one_on_the_file_store(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path, state_store="files")
    df, _ = frame(spark, 0, KEYS[:20], 20)
    run(df, 0)
    assert (run.task_timings()["upkeep_ms"] == -1.0).all()
