"""One watermark semantics: per-key hooks and vectorised processors share the runtime's rules.

The runtime judges lateness once (``KeyedRuntime.judge``) and applies the idle rule once
(``KeyedRuntime.watermarks``). These tests run a per-key processor (hooks, timers) and
``KeyedWindowAggregate`` (the vectorised hooks) on the same seeded random input, with null
event times, late rows and a key that goes idle, against a row-by-row model, and check that
changing the rule in one place changes both.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
from collections.abc import Hashable
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle
from pyspark.sql import types as T

import trilink_spark as tl
import trilink_spark.keyed.semantics.windows as windows_module
from trilink_spark.keyed.semantics.process import (EVENT_TIME_COL, KeyedRows, KeyedContext,
                                                   KeyedRuntime, KeyedWatermarkProcessFunction)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SIZE, DELAY, IDLE = 10, 3.0, 15.0
KEYS = [f"s{i}" for i in range(6)]
SCHEMA = T.StructType([T.StructField("k", T.StringType()), T.StructField("t", T.DoubleType()),
                       T.StructField("v", T.DoubleType()), T.StructField("id", T.LongType())])


# ---------------------------------------------------------------------- processors
class PerKeyWindows(KeyedWatermarkProcessFunction):
    """Tumbling windows written with the per-key hooks: a timer closes each window."""

    output_schema = "kind string, k string, start double, n long, total double"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        opened = ctx.get_state("windows", {})
        for t, v in zip(rows[EVENT_TIME_COL], rows["v"]):
            if math.isnan(t):
                continue  # a null event time belongs to no window
            start = math.floor(t / SIZE) * SIZE
            n, total = opened.get(start, (0, 0.0))
            opened[start] = (n + 1, total + (0.0 if math.isnan(v) else v))
            ctx.register_timer(int(start + SIZE))
        ctx.set_state("windows", opened)
        return [("on", key, float(i), 0, 0.0) for i in rows["id"]]

    def process_late(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        return [("late", key, float(i), 0, 0.0) for i in rows["id"]]

    def on_timer(self, key: Any, timestamp: int, ctx: KeyedContext) -> Any:
        assert ctx.watermark >= timestamp  # an idle key caught up before its timers fire
        opened = ctx.get_state("windows", {})
        n, total = opened.pop(float(timestamp - SIZE))
        ctx.set_state("windows", opened)
        return [("win", key, float(timestamp - SIZE), n, total)]


class Judged(KeyedWatermarkProcessFunction):
    """A vectorised processor that emits the runtime's verdict on every row."""

    output_schema = "id long, late boolean, before double"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        raise NotImplementedError

    def process_rows(self, batch: KeyedRows, runtime: KeyedRuntime) -> Any:
        return pd.DataFrame({"id": batch.rows["id"].to_numpy(), "late": batch.late,
                             "before": batch.watermark_before[batch.codes]})


class RecordingWindows(tl.KeyedWindowAggregate):
    """KeyedWindowAggregate that also keeps the ids of the rows the runtime judged late."""

    def process_rows(self, batch: KeyedRows, runtime: KeyedRuntime) -> Any:
        runtime.shared.setdefault("late", []).extend(batch.rows["id"][batch.late].tolist())
        return super().process_rows(batch, runtime)


def window_aggregate(cls: type[tl.KeyedWindowAggregate] = tl.KeyedWindowAggregate
                     ) -> tl.KeyedWindowAggregate:
    agg = cls(SIZE, value="v", aggs=("count", "sum"))
    agg.bind(SCHEMA, "k", "t", "fractional")
    return agg


# ---------------------------------------------------------------------- data and model
def random_batches(seed: int, n_batches: int = 6) -> list[pd.DataFrame]:
    """Six sources, one lagging 8 behind; disorder up to 6 (late rows at DELAY=3); 10 % null
    event times; ``s0`` stops sending after two batches while the others move on (idle)."""
    rng = np.random.default_rng(seed)
    lag = {k: (-8.0 if k == "s1" else 0.0) for k in KEYS}
    clock, next_id, out = 0.0, 0, []
    for b in range(n_batches):
        senders = KEYS if b < 2 else KEYS[1:]
        n = int(rng.integers(5, 30))
        keys = rng.choice(senders, n)
        t = clock + np.array([lag[k] for k in keys]) + rng.integers(-6, 7, n)
        t[rng.random(n) < 0.1] = np.nan
        frame = pd.DataFrame({"k": keys, "t": t, "v": rng.normal(size=n),
                              "id": np.arange(next_id, next_id + n)})
        frame[EVENT_TIME_COL] = frame["t"]
        out.append(frame)
        next_id += n
        clock += float(rng.integers(5, 20))
    return out


@dataclasses.dataclass
class Model:
    """The semantics row by row (module docs of trilink_spark.keyed.semantics.process)."""

    key_high: dict[Hashable, float] = dataclasses.field(default_factory=dict)
    last_seen: dict[Hashable, float] = dataclasses.field(default_factory=dict)
    partition_high: float = -math.inf
    windows: dict[tuple[Hashable, float], list[float]] = dataclasses.field(default_factory=dict)
    caught_up: set[Hashable] = dataclasses.field(default_factory=set)

    def batch(self, frame: pd.DataFrame) -> tuple[list[int], list[tuple[Any, float, int]]]:
        late: list[int] = []
        for key, t, v, row_id in zip(frame["k"].tolist(), frame["t"].tolist(),
                                     frame["v"].tolist(), frame["id"].tolist()):
            high = self.key_high.get(key, -math.inf)
            if math.isnan(t):
                self.key_high[key] = high
                continue
            if t < high - DELAY:
                late.append(row_id)
            else:
                acc = self.windows.setdefault((key, math.floor(t / SIZE) * SIZE), [0, 0.0])
                acc[0] += 1
                acc[1] += v
            self.key_high[key] = max(high, t)
            self.partition_high = max(self.partition_high, t)
        for key in frame["k"]:
            self.last_seen[key] = self.partition_high
        due: list[tuple[Any, float, int]] = []
        idle_due: set[Hashable] = set()
        for (key, start), acc in list(self.windows.items()):
            idle = self.partition_high - self.last_seen[key] > IDLE
            mark = (self.partition_high if idle else self.key_high[key]) - DELAY
            if start + SIZE <= mark:
                due.append((key, start, int(acc[0])))
                del self.windows[(key, start)]
                if idle:
                    idle_due.add(key)
        for key in idle_due:
            self.key_high[key] = max(self.key_high[key], self.partition_high)
        self.caught_up |= idle_due
        return sorted(late), sorted(due)

    def watermark(self, key: Hashable) -> float:
        idle = self.partition_high - self.last_seen.get(key, -math.inf) > IDLE
        return (self.partition_high if idle else self.key_high.get(key, -math.inf)) - DELAY


def per_key_result(outs: list[Any]) -> tuple[list[int], list[tuple[Any, float, int]]]:
    rows = [r for o in outs if o is not None for r in o]
    late = sorted(int(r[2]) for r in rows if r[0] == "late")
    wins = sorted((r[1], r[2], int(r[3])) for r in rows if r[0] == "win")
    return late, wins


def aggregate_result(outs: list[Any]) -> list[tuple[Any, float, int]]:
    frames = [o for o in outs if isinstance(o, pd.DataFrame)]
    if not frames:
        return []
    out = pd.concat(frames)
    return sorted(zip(out["k"], out["window_start"].astype(float), out["count"].astype(int)))


# ---------------------------------------------------------------------- the two paths agree
@pytest.mark.parametrize("seed", range(25))
def test_per_key_and_vectorised_paths_share_lateness_watermarks_and_idleness(seed: int) -> None:
    per_key = KeyedRuntime(PerKeyWindows(), "k", DELAY, IDLE)
    agg = window_aggregate(RecordingWindows)
    vectorised = KeyedRuntime(agg, "k", DELAY, IDLE)
    model = Model()
    for frame in random_batches(seed):
        want_late, want_windows = model.batch(frame)
        late, wins = per_key_result(per_key.process(frame.copy()))
        assert late == want_late
        assert wins == want_windows
        assert aggregate_result(vectorised.process(frame.copy())) == want_windows
        assert sorted(vectorised.shared.pop("late")) == want_late
        # one high-water mark per key, one "last seen", one idle verdict, in both paths
        assert per_key.key_high == vectorised.key_high == model.key_high
        assert per_key.last_seen == vectorised.last_seen == model.last_seen
        assert per_key.counters == vectorised.counters
        everyone = list(model.key_high)
        for rt in (per_key, vectorised):
            marks = rt.watermarks(everyone)
            assert marks.watermark.tolist() == [model.watermark(k) for k in everyone]
            assert marks.idle.tolist() == [rt.is_idle(k) for k in everyone]
            rt._check()
        # the state survives a snapshot (as between micro-batches)
        per_key = KeyedRuntime(per_key.processor, "k", DELAY, IDLE, per_key.snapshot())
        vectorised = KeyedRuntime(agg, "k", DELAY, IDLE, vectorised.snapshot())
    rest = sorted((k, s, int(n)) for (k, s), (n, _) in model.windows.items())
    assert per_key_result(per_key.finish())[1] == rest
    assert aggregate_result(vectorised.finish()) == rest
    assert agg.open_windows(vectorised) == 0


def test_the_random_input_exercises_late_rows_null_times_and_an_idle_key() -> None:
    late = caught_up = nulls = 0
    for seed in range(25):
        model = Model()
        for frame in random_batches(seed):
            late += len(model.batch(frame)[0])
            nulls += int(frame["t"].isna().sum())
        caught_up += "s0" in model.caught_up
    assert late > 50 and nulls > 50
    assert caught_up >= 20  # s0 went idle and its windows closed on the partition watermark


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                                   st.one_of(st.none(), st.integers(0, 40))),
                         min_size=1, max_size=12), min_size=1, max_size=5),
       st.integers(0, 5))
def test_vectorised_verdict_equals_the_per_key_hooks(batches: list[list[tuple[str, Any]]],
                                                     delay: int) -> None:
    """The rows process_late gets, and the watermark ctx gives in the hooks, are the rows and
    watermarks of ``KeyedRows``."""

    class Record(KeyedWatermarkProcessFunction):
        def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
            return [(int(i), False, ctx.watermark) for i in rows["id"]]

        def process_late(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
            return [(int(i), True, ctx.watermark) for i in rows["id"]]

    per_key = KeyedRuntime(Record(), "k", delay, 2.0)
    vectorised = KeyedRuntime(Judged(), "k", delay, 2.0)
    next_id = 0
    for rows in batches:
        frame = pd.DataFrame({"k": [k for k, _ in rows],
                              EVENT_TIME_COL: [np.nan if t is None else float(t) for _, t in rows],
                              "id": range(next_id, next_id + len(rows))})
        next_id += len(rows)
        hooks: list[Any] = sorted(r for o in per_key.process(frame) if o is not None for r in o)
        table = pd.concat([o for o in vectorised.process(frame) if isinstance(o, pd.DataFrame)])
        assert hooks == sorted(zip(table["id"].tolist(), table["late"].tolist(),
                                   table["before"].tolist()))
        assert per_key.key_high == vectorised.key_high
        assert per_key.last_seen == vectorised.last_seen
        per_key._check()
        vectorised._check()


# ---------------------------------------------------------------------- one place
def run_both(batches: list[pd.DataFrame]) -> tuple[Any, Any]:
    per_key = KeyedRuntime(PerKeyWindows(), "k", DELAY, IDLE)
    vectorised = KeyedRuntime(window_aggregate(), "k", DELAY, IDLE)
    wins: list[Any] = []
    aggs: list[Any] = []
    for frame in batches:
        wins += per_key_result(per_key.process(frame.copy()))[1]
        aggs += aggregate_result(vectorised.process(frame.copy()))
    return sorted(wins), sorted(aggs)


def test_a_change_to_the_idle_rule_changes_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = random_batches(3)
    wins, aggs = run_both(batches)
    assert wins == aggs and any(k == "s0" for k, _, _ in wins)
    # one change in one place: no key is ever idle
    monkeypatch.setattr(KeyedRuntime, "_idle",
                        lambda self, seen: np.zeros(len(seen), dtype=bool))
    never_idle_wins, never_idle_aggs = run_both(batches)
    assert never_idle_wins == never_idle_aggs
    assert len(never_idle_wins) < len(wins)  # s0's last windows stay open now


def test_a_change_to_the_lateness_rule_changes_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = random_batches(5)
    before = run_both(batches)
    judge = KeyedRuntime.judge

    def nothing_late(self: KeyedRuntime, frame: pd.DataFrame) -> KeyedRows:
        batch = judge(self, frame)
        return dataclasses.replace(batch, late=np.zeros(len(frame), dtype=bool))

    monkeypatch.setattr(KeyedRuntime, "judge", nothing_late)
    wins, aggs = run_both(batches)
    assert wins == aggs != before[0]
    count = sum(n for _, _, n in wins)
    assert count > sum(n for _, _, n in before[0])  # late rows now land in their windows


def test_both_paths_call_the_runtime_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    judge, watermarks = KeyedRuntime.judge, KeyedRuntime.watermarks

    def spy_judge(self: KeyedRuntime, frame: pd.DataFrame) -> KeyedRows:
        calls.append(("judge", type(self.processor).__name__))
        return judge(self, frame)

    def spy_watermarks(self: KeyedRuntime, keys: Any, times: Any = None) -> Any:
        calls.append(("watermarks", type(self.processor).__name__))
        return watermarks(self, keys, times)

    monkeypatch.setattr(KeyedRuntime, "judge", spy_judge)
    monkeypatch.setattr(KeyedRuntime, "watermarks", spy_watermarks)
    run_both(random_batches(1))
    for rule in ("judge", "watermarks"):
        for name in ("PerKeyWindows", "KeyedWindowAggregate"):
            assert (rule, name) in calls


def test_the_window_aggregate_keeps_no_watermark_logic_of_its_own() -> None:
    source = inspect.getsource(windows_module)
    for name in ("key_high", "last_seen", "partition_high", "idle_timeout", ".delay",
                 "cummax", "is_idle", "process_batch", "finish_batch"):
        assert name not in source, name
    assert tl.KeyedWindowAggregate(SIZE).vectorised
    assert not PerKeyWindows().vectorised


# ---------------------------------------------------------------------- the contract
class Lifecycle(KeyedWatermarkProcessFunction):
    """Per-key hooks plus on_watermark: records what each hook saw."""

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        for t in rows[EVENT_TIME_COL]:
            ctx.register_timer(int(t) + 1)
        return [("on", key, ctx.watermark)]

    def on_timer(self, key: Any, timestamp: int, ctx: KeyedContext) -> Any:
        return [("timer", key, ctx.watermark)]

    def on_watermark(self, runtime: KeyedRuntime) -> Any:
        return [("batch-end", runtime.ended, runtime.watermarks(["a"]).watermark[0])]


def test_hooks_see_the_judging_watermark_then_the_new_one() -> None:
    rt = KeyedRuntime(Lifecycle(), "k", 1, math.inf)
    first = [r for o in rt.process(pd.DataFrame({"k": ["a"], EVENT_TIME_COL: [5.0]}))
             if o for r in o]
    assert first == [("on", "a", -math.inf), ("batch-end", False, 4.0)]
    second = [r for o in rt.process(pd.DataFrame({"k": ["a"], EVENT_TIME_COL: [9.0]}))
              if o for r in o]
    # rows judged against 4; the timer at 6 fires once the watermark is 8
    assert second == [("on", "a", 4.0), ("timer", "a", 8.0), ("batch-end", False, 8.0)]
    end = [r for o in rt.finish() if o for r in o]
    assert end == [("timer", "a", math.inf), ("batch-end", True, math.inf)]


def test_a_legacy_process_batch_override_still_drives_the_runtime() -> None:
    class Legacy(KeyedWatermarkProcessFunction):
        def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
            return [("on", key, len(rows))]

        def process_batch(self, runtime: KeyedRuntime, frame: pd.DataFrame) -> list[Any]:
            return [[("batch", len(frame))], *runtime.run_per_key(frame)]

        def finish_batch(self, runtime: KeyedRuntime) -> list[Any]:
            return [[("end", runtime.counters.rows)]]

    rt = KeyedRuntime(Legacy(), "k", 0, math.inf)
    out = [r for o in rt.process(pd.DataFrame({"k": ["a", "b", "a"],
                                                EVENT_TIME_COL: [1.0, 2.0, 0.0]})) if o for r in o]
    assert out == [("batch", 3), ("on", "a", 1), ("on", "b", 1)]
    assert rt.counters.late == 1
    assert [r for o in rt.finish() if o for r in o] == [("end", 3)]


def test_keyed_batch_and_watermarks_edge_cases() -> None:
    rt = KeyedRuntime(Judged(), "k", 0, math.inf)
    batch = rt.judge(pd.DataFrame({"k": [(1, 2), (3, 4), (1, 2)],
                                   EVENT_TIME_COL: [2.0, np.nan, 1.0], "id": [0, 1, 2]}))
    assert batch.keys == [(1, 2), (3, 4)]  # tuple keys stay whole
    assert batch.row_keys.tolist() == [(1, 2), (3, 4), (1, 2)]
    assert batch.late.tolist() == [False, False, True]
    assert [p.tolist() for p in batch.positions()] == [[0, 2], [1]]
    assert rt.key_high == {(1, 2): 2.0, (3, 4): -math.inf}
    empty = rt.judge(pd.DataFrame({"k": [], EVENT_TIME_COL: [], "id": []}))
    assert empty.keys == [] and empty.positions() == [] and empty.row_keys.tolist() == []
    marks = rt.watermarks([], [])
    assert marks.watermark.tolist() == [] and marks.due.tolist() == []
    assert rt.watermarks(["never seen"]).watermark.tolist() == [-math.inf]
    with pytest.raises(tl.TrilinkError, match="one number per key"):
        rt.watermarks(["a", "b"], [1.0])
    rt.finish()
    assert rt.watermarks([(1, 2)], [1e300]).due.tolist() == [True]


# ---------------------------------------------------------------------- with Spark
def test_per_key_and_vectorised_processors_agree_in_spark(spark: Any) -> None:
    rows = pd.concat(random_batches(11), ignore_index=True).drop(columns=[EVENT_TIME_COL])
    df = spark.createDataFrame(rows, SCHEMA)
    hooks = tl.keyed_process(df, "k", "t", PerKeyWindows(), delay=DELAY, order_by="id",
                             num_partitions=2, idle_timeout=IDLE).toPandas()
    windows = tl.keyed_process(df, "k", "t", window_aggregate(), delay=DELAY, order_by="id",
                               num_partitions=2, idle_timeout=IDLE).toPandas()
    from_hooks = hooks[hooks["kind"] == "win"]
    assert sorted(zip(from_hooks["k"], from_hooks["start"], from_hooks["n"])) == \
        sorted(zip(windows["k"], windows["window_start"].astype(float), windows["count"]))
    late = set(hooks.loc[hooks["kind"] == "late", "start"].astype(int))
    nulls = int(rows["t"].isna().sum())
    assert late and len(late) == len(rows) - int(windows["count"].sum()) - nulls
