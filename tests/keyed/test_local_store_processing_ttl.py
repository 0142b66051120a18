"""State TTL by processing time: the processing-time index of the local copy (driven
through :class:`LocalState` and the task's functions, without Spark), the batch time the
manifest fixes, and streams run through ``keyed_foreach_batch`` with a fixed clock."""

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
from trilink_spark.columns import EVENT_TIME_COL
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import StateCorruptError
from trilink_spark.keyed import KeyedContext
from trilink_spark.keyed.durable.local_sync import LocalConfig, expire_processed, load_touched
from trilink_spark.keyed.durable.local_sync import save_touched, sync
from trilink_spark.keyed.durable.manifest import PROCESSING_RECORD, batch_time, claim
from trilink_spark.keyed.semantics.process import KeyedRuntime, KeyedWatermarkProcessFunction
from trilink_spark.keyed.durable.codec import BATCH_TIME, decode_state
from trilink_spark.keyed.semantics.keys import PartitionState
from trilink_spark.keyed.durable.codec import encode_state
from trilink_spark.state.local import LocalState, head
from trilink_spark.state.store import KeyedStateStore

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the processors ship to tasks
MINUTE_MS = 60_000.0


# ---------------------------------------------------------------------- the index itself
def _key(i: int) -> bytes:
    return bytes([0, 0, 0, i % 3, 3]) + f"k{i:03d}".encode()


def _row(wake: float = math.inf) -> bytes:
    return head(wake, 1) + b"row"


def _apply(local: LocalState, version: int, puts: dict[bytes, float],
           deletes: list[bytes], undo: bool = True) -> None:
    keys = list(puts) + deletes
    before = {k: v for k, v in zip(keys, local.get(keys)) if v is not None}
    local.apply(version, f"a{version}", {}, [(k, _row()) for k in puts], deletes, before,
                undo=undo, times=list(puts.values()))


def _agrees(local: LocalState, model: dict[bytes, float], every: list[bytes],
            rng: np.random.Generator) -> None:
    """The invariant: the index holds exactly the stored keys' processing times."""
    local.check()
    assert local.keys == len(model)
    got = local.times(every)
    assert got == [(-math.inf if math.isnan(model[k]) else model[k]) if k in model else None
                   for k in every]
    known = sorted({t for t in model.values() if math.isfinite(t)})
    bounds = [-math.inf, math.inf, *rng.choice(known, min(3, len(known)), replace=False)] \
        if known else [-math.inf, math.inf]
    for bound in bounds:
        for unknown in (False, True):
            expected = {k for k, t in model.items()
                        if (math.isfinite(t) and t <= bound)
                        or (unknown and not math.isfinite(t))}
            found = local.expiring(float(bound), unknown)
            assert len(found) == len(set(found)) and set(found) == expected, (bound, unknown)
            times = [model[k] for k in found if math.isfinite(model[k])]
            assert times == sorted(times)  # in time order, unknown ones first


def test_the_index_follows_apply_undo_and_reset(tmp_path: Path) -> None:
    a, b, c = _key(1), _key(2), _key(3)
    with LocalState.open(str(tmp_path), "x", 0) as local:
        assert not local.timed and local.expiring(math.inf, True) == []
        _apply(local, 0, {a: 100.0, b: 200.0, c: -math.inf}, [])
        assert local.timed
        assert local.expiring(150.0, False) == [a]
        assert local.expiring(150.0, True) == [c, a]
        assert local.expiring(200.0, False) == [a, b]
        _apply(local, 1, {a: 300.0}, [b])
        assert local.expiring(250.0, True) == [c] and local.times([a, b]) == [300.0, None]
        local.check()
        assert local.undo()
        assert local.expiring(250.0, False) == [a, b] and local.times([a, b]) == [100.0, 200.0]
        local.check()
        local.reset()
        assert not local.timed and local.expiring(math.inf, True) == []
        local.check()


def test_a_copy_with_or_without_the_index_refuses_the_other_kind_of_write(
        tmp_path: Path) -> None:
    with LocalState.open(str(tmp_path), "timed", 0) as local:
        _apply(local, 0, {_key(1): 5.0}, [])
        with pytest.raises(StateCorruptError, match="without processing times"):
            local.apply(1, "b", {}, [(_key(2), _row())], [], {})
        with pytest.raises(StateCorruptError, match="2 processing times for 1 rows"):
            local.apply(1, "b", {}, [(_key(2), _row())], [], {}, times=[1.0, 2.0])
    with LocalState.open(str(tmp_path), "plain", 0) as local:
        local.apply(0, "a", {}, [(_key(1), _row())], [], {})
        with pytest.raises(StateCorruptError, match="with processing times"):
            local.apply(1, "b", {}, [(_key(2), _row())], [], {}, times=[1.0])
        local.check()


@pytest.mark.parametrize("seed", [3, 17])
def test_a_random_sequence_keeps_the_index_exact(tmp_path: Path, seed: int) -> None:
    """Random batches of puts (times known, repeated or unknown) and deletes, undos and
    rebuilds into an emptied copy; after each step the index holds exactly the stored keys'
    times, and expiring() reads exactly the keys at or below a bound."""
    rng = np.random.default_rng(seed)
    every = [_key(i) for i in range(40)]
    model: dict[bytes, float] = {}
    undo_to: dict[bytes, float] | None = None
    with LocalState.open(str(tmp_path), "x", 0) as local:
        for version in range(120):
            step = rng.random()
            if step < 0.15 and undo_to is not None:
                assert local.undo()
                model, undo_to = undo_to, None
                assert not local.undo()  # one batch back, no more
            elif step < 0.22:  # a rebuild: the copy emptied and written whole
                local.reset()
                _apply(local, version, dict(model), [], undo=False)
                undo_to = None
            else:
                chosen = rng.choice(len(every), int(rng.integers(0, 8)), replace=False)
                puts: dict[bytes, float] = {}
                deletes: list[bytes] = []
                for i in chosen.tolist():
                    k = every[i]
                    if k in model and rng.random() < 0.3:
                        deletes.append(k)
                    else:
                        pick = rng.random()
                        puts[k] = (math.nan if pick < 0.1 else -math.inf if pick < 0.2
                                   else float(rng.integers(0, 12)) * 1000.0)
                undo_to = dict(model)
                _apply(local, version, puts, deletes)
                for k in deletes:
                    model.pop(k, None)
                model.update(puts)
            _agrees(local, model, every, rng)


# ---------------------------------------------------------------------- tasks, no Spark
class Count(KeyedWatermarkProcessFunction):
    state_schema = None

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        ctx.set_state("n", ctx.get_state("n", 0) + len(rows))
        return None


def _config(tmp: Path, at: float | None, ttl: float = MINUTE_MS,
            since: float | None = 0.0) -> LocalConfig:
    return LocalConfig(str(tmp / "local"), "sid", 1000, math.inf, None, ttl, at, since)


def _task(store: KeyedStateStore, config: LocalConfig, batch_id: int, prev: int | None,
          keys: list[str]) -> tuple[str, int]:
    """One task of partition 0 as ``task._run_local`` runs it; what sync did, keys read."""
    frame = pd.DataFrame({"k": keys, EVENT_TIME_COL: np.zeros(len(keys))})
    proc = Count()
    with LocalState.open(config.root, config.store_id, 0) as local:
        synced = sync(local, store, config, 0, prev, proc, 0.0, math.inf)
        state, before = load_touched(local, config, frame, "k", pa.string(), "test")
        runtime = KeyedRuntime(proc, "k", 0.0, math.inf, state, None, config.batch_time)
        runtime.process(frame)
        save_touched(local, store, config, 0, batch_id, prev, runtime.snapshot(), before,
                     pa.string(), None, proc, 0.0, math.inf, lambda: None)
        local.check()
    return synced, len(before)


def _stored(store: KeyedStateStore, version: int) -> dict[Any, float | None]:
    state = decode_state(store.load_table(0, version))
    return {k: state.batch_time.get(k) for k in state.key_high}


def test_tasks_expire_by_batch_time_and_rebuilds_restore_the_index(tmp_path: Path) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    _task(store, _config(tmp_path, 0.0), 0, None, ["a", "b", "c"])
    _task(store, _config(tmp_path, 30_000.0), 1, 0, ["a"])
    assert _stored(store, 1) == {"a": 30_000.0, "b": 0.0, "c": 0.0}
    synced, read = _task(store, _config(tmp_path, 59_999.0), 2, 1, ["c"])
    assert (synced, read) == ("current", 1)  # only the batch's key: nothing expired yet
    assert _stored(store, 2) == {"a": 30_000.0, "b": 0.0, "c": 59_999.0}
    shutil.rmtree(tmp_path / "local")  # the copy is lost: rebuilt from the state path
    synced, read = _task(store, _config(tmp_path, 60_000.0), 3, 2, [])
    assert (synced, read) == ("rebuild", 1)  # b alone ran out (60,000 - 0 >= 60,000)
    assert _stored(store, 3) == {"a": 30_000.0, "c": 59_999.0}
    synced, read = _task(store, _config(tmp_path, 90_000.0), 4, 3, ["b"])
    assert _stored(store, 4) == {"c": 59_999.0, "b": 90_000.0}  # a ran out, b anew
    assert decode_state(store.load_table(0, 4)).values["b"] == {"n": 1}
    synced, _ = _task(store, _config(tmp_path, 90_000.0), 4, 3, ["b"])  # replayed
    assert synced == "undo" and _stored(store, 4) == {"c": 59_999.0, "b": 90_000.0}


def test_keys_without_a_batch_time_count_from_since(tmp_path: Path) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    plain = LocalConfig(str(tmp_path / "local"), "sid", 1000, math.inf, None)
    _task(store, plain, 0, None, ["a", "b"])  # an event-time run keeps no batch time
    assert BATCH_TIME not in store.load_table(0, 0).column_names
    synced, _ = _task(store, _config(tmp_path, 1_000_000.0, since=1_000_000.0), 1, 0, ["a"])
    assert synced == "rebuild"  # the copy gets its index: rebuilt once
    assert _stored(store, 1) == {"a": 1_000_000.0, "b": None}
    _task(store, _config(tmp_path, 1_030_000.0, since=1_000_000.0), 2, 1, ["a"])
    _task(store, _config(tmp_path, 1_059_999.0, since=1_000_000.0), 3, 2, [])
    assert set(_stored(store, 3)) == {"a", "b"}
    _task(store, _config(tmp_path, 1_060_000.0, since=1_000_000.0), 4, 3, [])
    assert _stored(store, 4) == {"a": 1_030_000.0}  # b counted from since
    synced, _ = _task(store, plain, 5, 4, ["a"])  # back to event time: the index goes
    assert synced == "rebuild" and _stored(store, 5) == {"a": None}


def test_expire_processed_and_the_state_column_round_trip() -> None:
    state = PartitionState(key_high={"a": 0.0, "b": 0.0, "c": 0.0},
                           values={"a": {"n": 1}, "b": {"n": 2}, "c": {"n": 3}},
                           batch_time={"a": 10.0, "b": 50.0}, timers=[("a", 4), ("b", 5)])
    back = decode_state(encode_state(state, pa.string()))
    assert back.batch_time == {"a": 10.0, "b": 50.0}
    config = LocalConfig("", "", 1, math.inf, None, 40.0, 60.0, 30.0)
    assert expire_processed(back, config) == ["a"]  # 10 <= 60 - 40; c counts from 30
    config = LocalConfig("", "", 1, math.inf, None, 40.0, 60.0, 20.0)
    assert expire_processed(back, config) == ["c"]  # from 20 now
    assert back.timers == [("b", 5)] and set(back.values) == {"b"}
    assert expire_processed(back, LocalConfig("", "", 1, math.inf, None)) == []
    legacy = encode_state(PartitionState(key_high={"x": 1.0}), pa.string())
    assert decode_state(legacy).batch_time == {}


def test_the_manifest_fixes_each_batch_time_once(tmp_path: Path) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    config = {"key": "k"}
    manifest = claim(store, None, "tok", None, config, False)
    manifest, at, since = batch_time(store, manifest, 0, 5_000.7, "tok", None, config, False)
    assert (at, since) == (5_000.0, 5_000.0)
    manifest, at, since = batch_time(store, manifest, 0, 9_000.0, "tok", None, config, False)
    assert (at, since) == (5_000.0, 5_000.0)  # a replay: the recorded time
    assert store.read_manifest()[PROCESSING_RECORD]["times"] == {"0": 5_000.0}
    store.write_manifest({**store.read_manifest(), "committed": [0]})
    manifest = store.read_manifest()
    manifest, at, since = batch_time(store, manifest, 1, 4_000.0, "tok", None, config, False)
    assert (at, since) == (5_000.0, 5_000.0)  # the clock went back; the time does not
    store.write_manifest({**store.read_manifest(), "committed": [0, 1]})
    manifest, at, _ = batch_time(store, store.read_manifest(), 2, 7_000.0, "tok", None,
                                 config, False)
    assert at == 7_000.0
    assert store.read_manifest()[PROCESSING_RECORD]["times"] == {"1": 5_000.0, "2": 7_000.0}
    store.write_manifest({**manifest, PROCESSING_RECORD: {"since": "x", "times": {}}})
    with pytest.raises(StateCorruptError, match="malformed processing_time"):
        batch_time(store, store.read_manifest(), 3, 8_000.0, "tok", None, config, False)


# ---------------------------------------------------------------------- streams
class Counting(tl.KeyedWatermarkProcessFunction):
    """Counts rows per key; a timer 5 after each key's newest row emits the count."""

    output_schema = "kind string, k string, n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        ctx.register_timer(int(rows["_tl_event_time"].max()) + 5)
        return [("row", key, n)]

    def on_timer(self, key: Any, timestamp: int, ctx: KeyedContext) -> Any:
        return [("timer", key, ctx.get_state("n", 0))]


class Stream:
    """A runner on one partition whose clock the test sets (seconds)."""

    def __init__(self, spark: Any, path: Path, takeover: bool = False, **kw: Any) -> None:
        self.spark, self.now, self.out = spark, 0.0, {}
        kw.setdefault("state_ttl", "1 minute")
        kw.setdefault("state_ttl_time", "processing")
        self.run = tl.keyed_foreach_batch(self.sink, "k", "t", Counting(), 2.0, str(path),
                                          num_partitions=1, idle_timeout=8.0,
                                          takeover=takeover, **kw)
        self.run._clock = lambda: self.now

    def sink(self, df: Any, batch_id: int) -> None:
        self.out[batch_id] = sorted(map(tuple, df.toPandas().itertuples(index=False)))

    def batch(self, batch_id: int, now: float, keys: list[str], t: float = 0.0) -> list[Any]:
        self.now = now
        frame = pd.DataFrame({"k": keys, "t": [t] * len(keys)}) if keys else \
            pd.DataFrame({"k": pd.Series([], dtype=object), "t": pd.Series([], dtype=float)})
        self.run(self.spark.createDataFrame(frame, "k string, t double"), batch_id)
        return self.out[batch_id]

    def keys(self) -> dict[str, int]:
        return {k: v["n"] for k, v in self.run.state_values().items()}


def test_keys_expire_by_processing_time_not_event_time(spark: Any, tmp_path: Path,
                                                      local_root: Path) -> None:
    s = Stream(spark, tmp_path / "s")
    s.batch(0, 1000.0, ["a", "b"])
    s.batch(1, 1030.0, ["a"])  # event time never moves: an event-time TTL would keep all
    s.batch(2, 1059.0, ["a"])
    assert s.keys() == {"a": 3, "b": 1}
    out = s.batch(3, 1060.0, ["c"], t=100.0)  # b: 60 s without a row; c moves event time
    assert ("timer", "b", 1) in out  # b turned idle: its due timer fired, then it expired
    assert s.keys() == {"a": 3, "c": 1}
    s.batch(4, 1118.0, ["b"], t=100.0)
    assert s.keys() == {"a": 3, "b": 1, "c": 1}  # a: 59 s since batch 2; b anew
    s.batch(5, 1119.0, [], t=100.0)
    assert s.keys() == {"b": 1, "c": 1}
    assert set(tl.read_state(spark, s.run.store.path).toPandas()["key"]) == {"b", "c"}


def test_a_replayed_batch_uses_its_recorded_time(spark: Any, tmp_path: Path,
                                                 local_root: Path) -> None:
    s = Stream(spark, tmp_path / "s")
    s.batch(0, 0.0, ["a", "b"])
    first = s.batch(1, 50.0, ["a"])
    before = s.keys()
    again = s.batch(1, 500.0, ["a"])  # replayed much later: b would run out by the clock
    assert again == first and s.keys() == before == {"a": 2, "b": 1}
    assert s.run.task_timings()["sync"].tolist() == ["undo"]
    s.batch(2, 60.0, ["c"])  # the next batch follows its own clock
    assert s.keys() == {"a": 2, "c": 1}


def test_the_index_survives_a_lost_copy_and_a_restart(spark: Any, tmp_path: Path,
                                                      local_root: Path) -> None:
    s = Stream(spark, tmp_path / "s")
    s.batch(0, 0.0, ["a", "b", "c", "d"])
    s.batch(1, 20.0, ["b"])
    s.batch(2, 40.0, ["c"])
    shutil.rmtree(local_root)  # every local copy lost; the runner restarts
    s = Stream(spark, tmp_path / "s", takeover=True)
    s.batch(3, 60.0, [])
    assert s.keys() == {"b": 2, "c": 2}  # a and d ran out, no other key
    assert s.run.task_timings()["sync"].tolist() == ["rebuild"]
    s.batch(4, 79.0, [])
    assert s.keys() == {"b": 2, "c": 2}
    s.batch(5, 80.0, [])
    assert s.keys() == {"c": 2}


def test_state_written_without_batch_times_counts_from_the_first_processing_batch(
        spark: Any, tmp_path: Path, local_root: Path) -> None:
    old = Stream(spark, tmp_path / "s", state_ttl=None, state_ttl_time="event")
    old.batch(0, 0.0, ["a", "b"])
    s = Stream(spark, tmp_path / "s", takeover=True)
    s.batch(1, 1000.0, ["a"])
    s.batch(2, 1030.0, ["a"])
    s.batch(3, 1059.0, [])
    assert s.keys() == {"a": 3, "b": 1}
    s.batch(4, 1060.0, [])
    assert s.keys() == {"a": 3}  # b counted from batch 1 (1000 s), a from batch 2


@pytest.mark.parametrize("kw,error,match", [
    ({"state_ttl": 60, "state_ttl_time": "wall"}, InvalidArgumentError,
     "state_ttl_time must be one of 'event', 'processing'"),
    ({"state_ttl": 60, "state_ttl_time": 1}, InvalidArgumentTypeError,
     "state_ttl_time must be a str"),
    ({"state_ttl_time": "processing"}, InvalidArgumentError, "needs a state_ttl"),
    ({"state_ttl": "3 parsecs", "state_ttl_time": "processing"}, InvalidArgumentError,
     "state_ttl"),
    ({"state_ttl": "1 hour", "state_ttl_time": "processing", "state_store": "files"},
     InvalidArgumentError, "local state store"),
])
def test_bad_processing_ttl_arguments_are_refused_at_call_time(
        tmp_path: Path, kw: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Counting(), 2.0,
                               str(tmp_path / "s"), **kw)
    assert issubclass(InvalidArgumentError, ValueError)


def test_batch_times_travel_with_keys_a_swap_moves(spark: Any, tmp_path: Path,
                                                   local_root: Path) -> None:
    s = Stream(spark, tmp_path / "s")
    s.batch(0, 0.0, [f"k{i}" for i in range(8)])
    s.run.request_swap(num_partitions=3)
    s.batch(1, 30.0, ["k0", "k1"])  # the swap batch stamps its keys as any batch does
    assert len(s.run.swaps) == 1 and s.run.swaps[0].refused is None
    s.batch(2, 60.0, [])
    assert s.keys() == {"k0": 2, "k1": 2}  # the others ran out, wherever they moved
    s.batch(3, 90.0, ["k2"])
    assert s.keys() == {"k2": 1}
