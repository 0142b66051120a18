"""KeyedTester: a keyed process function run over pandas frames without Spark, through the
runners' own task code and the stored codec, and, against a real stream, the README's
processors giving the same output, batch by batch, and the same state."""

from __future__ import annotations

import ast
import math
import os
import re
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.columns import EVENT_TIME_COL
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import MissingColumnError, NullKeyError, ReservedColumnError
from trilink_spark.errors import StateTypeError
from trilink_spark.keyed.records.state_reader import STATE_COLUMNS
from trilink_spark.testing import KeyedTester
from trilink_spark.testing.ddl import struct_of

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the processors ship to tasks
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------- processors
class Counted(tl.KeyedWatermarkProcessFunction):
    """Counts each key's on-time and late rows; emits the counts and the watermark the rows
    were judged against."""

    output_schema = "k string, n long, late long, judged double"
    state_schema = "n long, late long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        ctx.set_state("n", ctx.get_state("n", 0) + len(rows))
        return [(key, ctx.get_state("n"), ctx.get_state("late", 0), ctx.watermark)]

    def process_late(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        ctx.set_state("late", ctx.get_state("late", 0) + len(rows))
        return None


class Reminder(tl.KeyedWatermarkProcessFunction):
    """A timer 10 units after each key's newest row; on_end says goodbye."""

    output_schema = "k string, what string, at long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        ctx.register_timer(int(rows[EVENT_TIME_COL].max()) + 10)
        ctx.set_state("seen", True)
        return None

    def on_timer(self, key: Any, timestamp: int, ctx: Any) -> Any:
        return [(key, "timer", timestamp)]

    def on_end(self, key: Any, ctx: Any) -> Any:
        return [(key, "end", -1)]


class Keys(tl.KeyedWatermarkProcessFunction):
    """Emits the key each hook got (as its repr), and keeps a running count per key."""

    output_schema = "shown string, n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        ctx.set_state("n", ctx.get_state("n", 0) + len(rows))
        return [(repr(ctx.key), ctx.get_state("n"))]


class Stores(tl.KeyedWatermarkProcessFunction):
    """Stores whatever ``rows["v"]`` names (no state_schema: JSON)."""

    output_schema = "k string, back string"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        back = repr(ctx.get_state("value"))
        kind = rows["v"].iloc[0]
        value = {"tuple": (1, 2), "int-keys": {1: 2}, "set": {1, 2}}.get(kind)
        if value is not None:
            ctx.set_state("value", value)
        return [(key, back)]


class OnSelf(tl.KeyedWatermarkProcessFunction):
    """Keeps a count on ``self`` (lost between batches, as in a stream) and in ctx."""

    output_schema = "k string, on_self long, in_state long"

    def __init__(self) -> None:
        self.seen = 0

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        self.seen += len(rows)
        ctx.set_state("n", ctx.get_state("n", 0) + len(rows))
        return [(key, self.seen, ctx.get_state("n"))]


class Columns(tl.KeyedWatermarkProcessFunction):
    """Emits the columns and order of the rows it got."""

    output_schema = "k string, columns string, order string"

    def __init__(self, wanted: list[str] | None = None) -> None:
        self.wanted = wanted

    def input_columns(self) -> Any:
        return self.wanted

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        return [(key, ",".join(rows.columns), ",".join(map(str, rows["i"])))]


def frame(keys: list[Any], times: list[Any], **extra: Any) -> pd.DataFrame:
    return pd.DataFrame({"k": keys, "t": times, **extra})


# ---------------------------------------------------------------------- without Spark
def test_late_rows_are_judged_against_each_keys_watermark_across_batches() -> None:
    tester = KeyedTester(Counted(), key="k", event_time="t", delay=2)
    first = tester.run(frame(["a", "b", "a"], [10, 4, 12]))
    assert first.values.tolist() == [["a", 2, 0, -math.inf], ["b", 1, 0, -math.inf]]
    # a's watermark is 12 - 2 = 10: its 5 is late, 11 is not; b's is 2: its 3 is on time
    second = tester.run(frame(["a", "b", "a"], [5, 3, 11]))
    assert second.values.tolist() == [["a", 3, 1, 10.0], ["b", 2, 0, 2.0]]
    assert tester.counters() == {"rows": 6, "late": 1, "late_partition": 3}  # 4, 5, 3
    state = tester.state().set_index("key")
    assert list(tester.state().columns) == [*STATE_COLUMNS, "n", "late"]
    assert state["watermark"].to_dict() == {"a": 10.0, "b": 2.0}
    assert state["last_seen"].to_dict() == {"a": 12.0, "b": 12.0}
    assert state["rows"].to_dict() == {"a": 4, "b": 2}
    assert state["n"].to_dict() == {"a": 3, "b": 2}
    assert state["late"]["a"] == 1 and pd.isna(state["late"]["b"])  # b set none
    assert (state["partition"] == 0).all()
    assert state["block"].isna().all()


def test_timestamp_event_times_are_microseconds_and_intervals_parse() -> None:
    tester = KeyedTester(Counted(), key="k", event_time="t", delay="2 seconds")
    seconds = pd.to_datetime([10, 12], unit="s")  # naive: UTC
    tester.run(frame(["a", "a"], seconds))
    out = tester.run(frame(["a", "a"], pd.to_datetime([5, 11], unit="s", utc=True)))
    assert out.values.tolist() == [["a", 3, 1, 10_000_000.0]]
    assert tester.state()["watermark"].tolist() == [pd.Timestamp(10_000_000, unit="us", tz="UTC")]


def test_timers_fire_once_the_watermark_passes_and_at_the_end() -> None:
    tester = KeyedTester(Reminder(), key="k", event_time="t", delay=1, idle_timeout=math.inf)
    assert tester.run(frame(["a", "b"], [0, 5])).empty  # timers at 10 and 15
    out = tester.run(frame(["a"], [12]))  # a's watermark 11 passes 10; a's next timer at 22
    assert out.values.tolist() == [["a", "timer", 10]]
    assert list(out.columns) == ["k", "what", "at"]
    assert tester.run(frame(["b"], [14])).empty  # b's 15 is not due at 13; another at 24
    # every watermark at infinity: each key's timers (keys by their earliest timer), then
    # on_end per key with state
    end = tester.finish()
    assert end.values.tolist() == [["b", "timer", 15], ["b", "timer", 24], ["a", "timer", 22],
                                   ["a", "end", -1], ["b", "end", -1]]
    with pytest.raises(InvalidArgumentError, match="ended"):
        tester.run(frame(["a"], [30]))
    with pytest.raises(InvalidArgumentError, match="called already"):
        tester.end()


def test_an_idle_keys_timers_fire_on_the_partitions_watermark() -> None:
    tester = KeyedTester(Reminder(), key="k", event_time="t", delay=1)  # idle after 4
    tester.run(frame(["quiet", "busy"], [0, 0]))
    assert tester.run(frame(["busy"], [3])).empty  # quiet is not idle yet (3 <= 4)
    # quiet is idle (the partition moved 9 > 4 past its last row): its watermark is the
    # partition's, 8, below its timer at 10; then 10, and the timer fires
    assert tester.run(frame(["busy"], [9])).empty
    out = tester.run(frame(["busy"], [11]))
    # busy's own watermark reached its timer at 10; quiet's (-1) did not, the idle rule did
    assert out.values.tolist() == [["busy", "timer", 10], ["quiet", "timer", 10]]


def test_an_empty_batch_runs_no_hook_and_returns_the_output_columns() -> None:
    tester = KeyedTester(Counted(), key="k", event_time="t", delay=2)
    out = tester.run(frame([], []).astype({"k": object, "t": "int64"}))
    assert out.empty and list(out.columns) == ["k", "n", "late", "judged"]
    assert tester.counters()["rows"] == 0 and tester.state().empty
    assert list(tester.state().columns) == [*STATE_COLUMNS, "n", "late"]


def test_state_ttl_by_event_time_forgets_a_silent_key() -> None:
    tester = KeyedTester(Counted(), key="k", event_time="t", delay=0, state_ttl=50)
    tester.run(frame(["a", "b"], [0, 0]))
    tester.run(frame(["b"], [49]))
    assert set(tester.state()["key"]) == {"a", "b"}  # a silent for 49 < 50
    tester.run(frame(["b"], [50]))
    assert set(tester.state()["key"]) == {"b"}  # a silent for 50: expired
    again = tester.run(frame(["a"], [60]))  # a row starts it afresh
    assert again.values.tolist() == [["a", 1, 0, -math.inf]]


def test_state_ttl_by_processing_time_uses_each_batchs_time() -> None:
    tester = KeyedTester(Counted(), key="k", event_time="t", delay=0,
                         state_ttl=timedelta(minutes=1), state_ttl_time="processing")
    tester.run(frame(["a", "b"], [0, 0]), processing_time=1_000.0)
    tester.run(frame(["b"], [1]), processing_time=1_059.0)
    assert set(tester.state()["key"]) == {"a", "b"}
    # a clock that goes back does not move processing time back
    tester.run(frame(["b"], [2]), processing_time=500.0)
    assert set(tester.state()["key"]) == {"a", "b"}
    tester.run(frame(["b"], [3]), processing_time=pd.Timestamp(1_060, unit="s"))
    assert set(tester.state()["key"]) == {"b"}
    assert tester.run(frame(["a"], [4]), processing_time=1_061).values.tolist()[0][1] == 1
    with pytest.raises(InvalidArgumentError, match="processing_time"):
        KeyedTester(Counted(), key="k", event_time="t", delay=0).run(
            frame(["a"], [0]), processing_time=1.0)


def test_null_and_nan_keys_are_two_keys_and_stay_apart_in_the_state() -> None:
    values = np.array([np.nan, 1.0, 0.0, -0.0, np.nan])
    keys = pd.arrays.FloatingArray(values, mask=np.array([False, False, True, False, False]))
    tester = KeyedTester(Keys(), key="k", event_time="t", delay=1)
    out = tester.run(frame(keys, [1, 2, 3, 4, 5]))
    assert sorted(out.values.tolist()) == [["0.0", 1], ["1.0", 1], ["None", 1], ["nan", 2]]
    out = tester.run(frame(pd.array([None, 1.0], dtype="Float64"), [6, 7]))
    assert sorted(out.values.tolist()) == [["1.0", 2], ["None", 2]]
    state = tester.state()
    assert str(state["key"].dtype) == "Float64" and len(state) == 4
    by_kind = {"null" if k is pd.NA else ("nan" if math.isnan(k) else k): n
               for k, n in zip(state["key"].astype(object), state["rows"])}
    assert by_kind == {"nan": 2, 1.0: 2, "null": 2, 0.0: 1}
    # an integer key column with a null keeps its integers exact
    ints = KeyedTester(Keys(), key="k", event_time="t", delay=1)
    out = ints.run(frame(pd.array([2**53 + 1, None], dtype="Int64"), [1, 2]))
    assert sorted(out["shown"]) == ["9007199254740993", "None"]
    assert ints.state()["key"].astype(object).tolist()[0] == 2**53 + 1


def test_state_the_codec_cannot_hold_is_refused_as_in_a_stream() -> None:
    tester = KeyedTester(Stores(), key="k", event_time="t", delay=0)
    tester.run(frame(["a"], [0], v=["tuple"]))
    # a tuple comes back from the store as a list, as JSON gives it
    assert tester.run(frame(["a"], [1], v=["read"])).values.tolist() == [["a", "[1, 2]"]]
    with pytest.raises(StateTypeError, match=r"state of key 'a' cannot be stored: dict key 1"):
        tester.run(frame(["a"], [2], v=["int-keys"]))
    with pytest.raises(StateTypeError, match="set is not JSON-representable"):
        KeyedTester(Stores(), key="k", event_time="t", delay=0).run(
            frame(["a"], [2], v=["set"]))
    # with a state_schema, ctx.set_state refuses a value that does not fit it
    class Typed(Counted):
        def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
            ctx.set_state("n", "many")

    with pytest.raises(StateTypeError, match="does not fit its declared type int64"):
        KeyedTester(Typed(), key="k", event_time="t", delay=0).run(frame(["a"], [0]))


def test_a_batch_that_raises_commits_nothing_and_runs_again() -> None:
    class Fragile(Counted):
        def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
            out = super().process_on_time(key, rows, ctx)
            if (rows["t"] < 0).any():
                raise RuntimeError("a negative time")
            return out

    tester = KeyedTester(Fragile(), key="k", event_time="t", delay=0)
    tester.run(frame(["a"], [1]))
    before = tester.state()
    with pytest.raises(RuntimeError, match="negative"):
        tester.run(frame(["a", "b"], [2, -1]))
    pd.testing.assert_frame_equal(tester.state(), before)
    assert tester.counters()["rows"] == 1
    assert tester.run(frame(["a"], [2])).values.tolist() == [["a", 2, 0, 1.0]]


def test_the_processor_is_shipped_to_each_batch_as_spark_ships_it() -> None:
    processor = OnSelf()
    tester = KeyedTester(processor, key="k", event_time="t", delay=0)
    assert tester.run(frame(["a", "a"], [0, 1])).values.tolist() == [["a", 2, 2]]
    # what the hook kept on self is gone at the next batch; the state is not
    assert tester.run(frame(["a"], [2])).values.tolist() == [["a", 1, 3]]
    assert processor.seen == 0

    class Unpicklable(OnSelf):
        def __init__(self) -> None:
            super().__init__()
            import threading

            self.lock = threading.Lock()

    with pytest.raises(InvalidArgumentTypeError, match="does not pickle"):
        KeyedTester(Unpicklable(), key="k", event_time="t", delay=0).run(frame(["a"], [0]))

    class Shipped(OnSelf):
        """Sends a count of 10 (its __getstate__), as pickling would send it."""

        def __getstate__(self) -> dict[str, Any]:
            return {"seen": 10}

    shipped = KeyedTester(Shipped(), key="k", event_time="t", delay=0)
    assert shipped.run(frame(["a"], [0])).values.tolist() == [["a", 11, 1]]
    assert shipped.run(frame(["a"], [1])).values.tolist() == [["a", 11, 2]]


def test_order_by_sorts_nulls_first_nan_last_and_keeps_ties_in_order() -> None:
    arrival = [3.0, np.nan, None, 1.0, 1.0, np.inf]
    rows = frame(["a"] * 6, [0] * 6, i=range(6),
                 arrival=pd.arrays.FloatingArray(
                     np.array([3.0, np.nan, 0.0, 1.0, 1.0, np.inf]),
                     mask=np.array([x is None for x in arrival])))
    tester = KeyedTester(Columns(), key="k", event_time="t", delay=0, order_by="arrival")
    assert tester.run(rows)["order"].tolist() == ["2,3,4,0,5,1"]
    # input_columns: only those, the key, order_by and the event time reach the hooks
    narrow = KeyedTester(Columns(["i"]), key="k", event_time="t", delay=0, order_by="arrival")
    assert narrow.run(rows)["columns"].tolist() == [f"k,i,arrival,{EVENT_TIME_COL}"]
    wide = KeyedTester(Columns(), key="k", event_time="t", delay=0)
    assert wide.run(rows)["columns"].tolist() == [f"k,t,i,arrival,{EVENT_TIME_COL}"]
    with pytest.raises(MissingColumnError, match="input column 'x'"):
        KeyedTester(Columns(["x"]), key="k", event_time="t", delay=0).run(rows)


def test_a_later_batch_takes_the_first_batchs_column_types() -> None:
    tester = KeyedTester(Counted(), key="k", event_time="t", delay=0)
    tester.run(frame(["a"], [1]))
    # ints beside a null come from pandas as float64: cast back to the first batch's long
    out = tester.run(frame(["a", "a"], [2.0, np.nan]))
    assert out.values.tolist() == [["a", 3, 0, 1.0]]
    with pytest.raises(InvalidArgumentTypeError, match="first batch fixed it as int64"):
        tester.run(frame(["a"], ["soon"]))


def test_bad_arguments_and_frames_are_refused() -> None:
    with pytest.raises(InvalidArgumentTypeError, match="KeyedWatermarkProcessFunction"):
        KeyedTester(object(), key="k", event_time="t", delay=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="key must be a column name"):
        KeyedTester(Counted(), key=1, event_time="t", delay=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="delay must be finite and >= 0"):
        KeyedTester(Counted(), key="k", event_time="t", delay=-1)
    with pytest.raises(InvalidArgumentTypeError, match="delay must be an interval string"):
        KeyedTester(Counted(), key="k", event_time="t", delay=[1])
    with pytest.raises(InvalidArgumentError, match="state_ttl_time"):
        KeyedTester(Counted(), key="k", event_time="t", delay=0, state_ttl_time="wall")
    with pytest.raises(InvalidArgumentError, match="needs a state_ttl"):
        KeyedTester(Counted(), key="k", event_time="t", delay=0, state_ttl_time="processing")
    with pytest.raises(InvalidArgumentError, match="state_ttl must be positive"):
        KeyedTester(Counted(), key="k", event_time="t", delay=0, state_ttl=0)
    with pytest.raises(InvalidArgumentError, match="null_policy must be one of"):
        KeyedTester(Counted(), key="k", event_time="t", delay=0, null_policy="drop")
    tester = KeyedTester(Counted(), key="k", event_time="t", delay="1 second")
    with pytest.raises(InvalidArgumentTypeError, match="needs a timestamp event time"):
        tester.run(frame(["a"], [1]))
    tester = KeyedTester(Counted(), key="k", event_time="t", delay=0)
    with pytest.raises(InvalidArgumentTypeError, match="must be a pandas DataFrame"):
        tester.run({"k": ["a"], "t": [1]})  # type: ignore[arg-type]
    with pytest.raises(MissingColumnError, match="event time column 't'"):
        tester.run(pd.DataFrame({"k": ["a"]}))
    with pytest.raises(ReservedColumnError, match="_tl_x"):
        tester.run(frame(["a"], [1], _tl_x=[0]))
    with pytest.raises(InvalidArgumentTypeError, match="is string; use a timestamp or a number"):
        tester.run(frame(["a"], ["noon"]))
    with pytest.raises(InvalidArgumentError, match=r"beyond \+-2\*\*53 units"):
        tester.run(frame(["a"], [2**53 + 1]))
    with pytest.raises(InvalidArgumentTypeError, match="column names must be str"):
        tester.run(pd.DataFrame({"k": ["a"], "t": [1], 0: [1]}))
    with pytest.raises(NullKeyError, match="column 'k' has null keys"):
        KeyedTester(Counted(), key="k", event_time="t", delay=0, null_policy="error").run(
            frame([None, "a"], [1, 2]))

    class NoSchema(Counted):
        output_schema = None

    with pytest.raises(InvalidArgumentError, match="NoSchema has no output_schema"):
        KeyedTester(NoSchema(), key="k", event_time="t", delay=0).run(frame(["a"], [1]))
    with pytest.raises(InvalidArgumentError, match="before any batch"):
        KeyedTester(tl.KeyedWindowAggregate(10), key="k", event_time="t", delay=0).finish()

    class BadDDL(Counted):
        state_schema = "n long,"

    with pytest.raises(InvalidArgumentError, match="state_schema 'n long,' is not a Spark DDL"):
        KeyedTester(BadDDL(), key="k", event_time="t", delay=0).run(frame(["a"], [1]))

    class WrongRows(Counted):
        def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
            return [(key,)]

    with pytest.raises(InvalidArgumentError, match="one value per column"):
        KeyedTester(WrongRows(), key="k", event_time="t", delay=0).run(frame(["a"], [1]))


def test_finish_before_any_batch_gives_the_declared_columns() -> None:
    out = KeyedTester(Counted(), key="k", event_time="t", delay=0).finish()
    assert out.empty and list(out.columns) == ["k", "n", "late", "judged"]


def test_a_copied_or_pickled_tester_has_a_lock_of_its_own_and_runs_on_alone() -> None:
    """The tester's lock is left out of its pickled state: a copy (the pickle protocol) and
    an unpickled tester get a fresh one and carry on from the same state, apart."""
    import copy
    import pickle

    t = KeyedTester(Counted(), key="k", event_time="t", delay=0)
    t.run(pd.DataFrame({"k": ["a", "b"], "t": [1, 2]}))
    # a threading.Lock does not pickle: these copies are made only if the lock is left out
    for back in (copy.deepcopy(t), pickle.loads(cloudpickle.dumps(t))):
        back.run(pd.DataFrame({"k": ["a"], "t": [3]}))
        assert dict(zip(back.state()["key"], back.state()["n"])) == {"a": 2, "b": 1}
        assert back.batches == 2
    assert dict(zip(t.state()["key"], t.state()["n"])) == {"a": 1, "b": 1} and t.batches == 1


def test_a_batch_that_raises_gives_an_all_null_column_no_type() -> None:
    """A column the first batch held only nulls of takes the type of the first batch that
    succeeds with values, not of one whose hook raised."""

    class Fails(Counted):
        def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
            if key == "boom":
                raise RuntimeError("hook failed")
            return super().process_on_time(key, rows, ctx)

    t = KeyedTester(Fails(), key="k", event_time="t", delay=0)
    t.run(pd.DataFrame({"k": ["a"], "t": [1], "v": [None]}))
    with pytest.raises(RuntimeError, match="hook failed"):
        t.run(pd.DataFrame({"k": ["boom"], "t": [2], "v": [5]}))
    t.run(pd.DataFrame({"k": ["b"], "t": [3], "v": ["x"]}))  # strings: the type it fixes
    with pytest.raises(InvalidArgumentTypeError, match="'v' is .* first batch fixed it as"):
        t.run(pd.DataFrame({"k": ["c"], "t": [4], "v": [[1]]}))
    assert t.batches == 2 and set(t.state()["key"]) == {"a", "b"}


def test_no_spark_session_or_jvm_is_started() -> None:
    """In a fresh interpreter: a tester runs batches, and no SparkContext (no JVM) exists."""
    script = textwrap.dedent("""
        import pandas as pd
        import trilink_spark as tl
        from pyspark import SparkContext
        from trilink_spark.testing import KeyedTester

        tester = KeyedTester(tl.KeyedWindowAggregate(10, value="v", aggs=("count", "sum")),
                             key="k", event_time="t", delay=1)
        out = tester.run(pd.DataFrame({"k": ["a", "a", "b"], "t": [1, 12, 3],
                                       "v": [1.0, 2.0, 3.0]}))
        end = tester.finish()
        assert SparkContext._active_spark_context is None and SparkContext._gateway is None
        print(len(out), len(end), len(tester.state()))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_SUBMIT_ARGS",)}
    env["JAVA_HOME"] = "/nonexistent"  # a JVM could not start even if something tried
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not Path(p, "java").exists())
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1", "2", "2"]


# ---------------------------------------------------------------------- the DDL reader
DDLS = [
    "k string, n long", "struct<k: string, n: bigint>", "a INT, B Double not null",
    "`a.b` tinyint, `c``d` smallint COMMENT 'it\\'s', e float, f real",
    'a int comment "x y"', "a int NOT NULL COMMENT 'c'", "a: int, b: string",
    "d decimal(12, 3), e dec, f numeric(5)", "x integer, y byte, z short",
    "b binary, d date, t timestamp, u timestamp_ntz, l timestamp_ltz, v boolean",
    "xs array<int>, m map<string, array<double>>, s struct<x: int, y string not null>",
    "v void, c char(3), w varchar(10), h character(2)", "s struct<>", "STRUCT<A: INT>",
]


@pytest.mark.parametrize("ddl", ["int", "a int,", "a", "a int b", "a interval day",
                                 "a map<int>", "a decimal(40, 2)"])
def test_the_ddl_reader_refuses_what_is_no_struct_or_needs_spark(ddl: str) -> None:
    """Not a struct (a bare type, a syntax error, a decimal beyond 38 digits), or an
    interval type, which only Spark's parser reads."""
    with pytest.raises(InvalidArgumentError, match="is not a Spark DDL struct"):
        struct_of(ddl, "output_schema")


def test_the_ddl_reader_agrees_with_sparks_parser(spark: Any) -> None:
    from pyspark.sql.types import StructType

    for ddl in DDLS:
        ours = struct_of(ddl)
        theirs = StructType.fromDDL(ddl)
        assert ours.jsonValue() == theirs.jsonValue(), ddl


# ---------------------------------------------------------------------- against a stream
def readme_processors() -> tuple[list[tuple[str, Any, dict[str, Any]]], set[str]]:
    """Every keyed call of the README (``keyed_process``, ``keyed_foreach_batch``,
    ``KeyedTester``) whose processor is a ``KeyedWatermarkProcessFunction`` subclass it
    defines or a ``tl.KeyedWindowAggregate``, as ``(processor as written, processor, {key,
    event_time, delay, order_by})``, made from the README's own code; and the names of the
    subclasses it defines."""
    text = (ROOT / "README.md").read_text()
    blocks = [textwrap.dedent(b) for b in re.findall(r"```py(?:thon)?\n(.*?)```", text,
                                                     flags=re.S)]
    found: list[tuple[str, Any, dict[str, Any]]] = []
    defined: set[str] = set()
    namespace: dict[str, Any] = {"__name__": "readme_processors", "tl": tl}
    for block in blocks:
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        for node in tree.body:  # the block's imports and its processor classes
            if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(b) == "tl.KeyedWatermarkProcessFunction" for b in node.bases):
                defined.add(node.name)
            elif not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            exec(compile(ast.Module([node], []), "README", "exec"), namespace)
        assigned = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name)}
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = ast.unparse(call.func)
            # the positions of the processor, key, event time and delay in the call
            at = {"tl.keyed_process": (3, 1, 2, 4), "tl.keyed_foreach_batch": (3, 1, 2, 4),
                  "KeyedTester": (0, 1, 2, 3)}.get(name)
            if at is None:
                continue
            args = {k.arg: k.value for k in call.keywords}
            made = call.args[at[0]]
            given = {n: args.get(n, call.args[i] if len(call.args) > i else None)
                     for n, i in zip(("key", "event_time", "delay"), at[1:])}
            if isinstance(made, ast.Name):
                made = assigned.get(made.id, made)
            shown = ast.unparse(made)
            if not isinstance(made, ast.Call) or not (
                    shown.startswith("tl.KeyedWindowAggregate(")
                    or ast.unparse(made.func) in defined):
                continue
            processor = eval(compile(ast.Expression(made), "README", "eval"), namespace)
            order_by = args.get("order_by")
            found.append((shown, processor, {
                **{n: ast.literal_eval(v) for n, v in given.items()},
                "order_by": None if order_by is None else ast.literal_eval(order_by)}))
    return found, defined


def batches(call: dict[str, Any], processor: Any, seed: int) -> list[pd.DataFrame]:
    """Four micro-batches for a README call: three keys and a null key, rows out of order
    (late ones among them), a key that goes silent (idle), a row without an event time, and
    every column a README processor reads; times step by a quarter of a window, so windows
    close."""
    rng = np.random.default_rng(seed)
    timestamps = isinstance(call["delay"], str)
    size = getattr(processor, "size", 0)
    step = 2400 if timestamps else max(4, int(size) // 4)  # seconds of a timestamp, or units
    frames = []
    arrival = 0
    for b in range(4):
        keys = ["s1", "s2", None, "s3"] if b < 2 else ["s1", "s2", None]  # s3 goes silent
        rows = []
        for i in range(12):
            k = keys[i % len(keys)]
            t = (b * 12 + i) * step // 2 + int(rng.integers(-3, 2)) * step
            rows.append((k, t))
        data = pd.DataFrame(rows, columns=["key", "t"])
        order = rng.permutation(len(data))
        frame_ = pd.DataFrame({
            call["key"]: data["key"],
            "arrival": order + arrival, "slot_start": data["t"],
            "volts": rng.uniform(200, 240, len(data)).round(1),
            "amount": rng.uniform(1, 100, len(data)).round(2),
            "n": rng.integers(1, 5, len(data)), "low": rng.uniform(0, 10, len(data)).round(2)})
        arrival += len(data)
        if timestamps:
            frame_[call["event_time"]] = pd.to_datetime(data["t"], unit="s", utc=True)
            frame_.loc[5, call["event_time"]] = pd.NaT
        else:
            frame_[call["event_time"]] = data["t"].astype("int64")
        frames.append(frame_)
    return frames


def normal(rows: pd.DataFrame, columns: list[str]) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples of plain values: timestamps as UTC instants, numbers as floats,
    null and NaN as None (a sink sees them through Spark's toPandas, the tester through
    Arrow's to_pandas)."""
    out = []
    for values in rows[columns].astype(object).itertuples(index=False):
        row = []
        for v in values:
            if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
                row.append(None)
            elif isinstance(v, pd.Timestamp):
                row.append(v.tz_localize("UTC") if v.tzinfo is None else v.tz_convert("UTC"))
            elif isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
                row.append(float(v))
            else:
                row.append(v)
        out.append(tuple(row))
    return sorted(out, key=repr)


def test_readme_processors_give_a_streams_output_and_state(spark: Any, tmp_path: Path,
                                                           local_root: Path) -> None:
    """Each README processor, the same four batches through KeyedTester and through
    keyed_foreach_batch on one partition: the same rows per batch, the same state."""
    calls, defined = readme_processors()
    names = [shown for shown, _, _ in calls]
    assert defined >= {"RunningCount", "LateRows", "Spikes"}, defined
    assert {n.partition("(")[0] for n in names} >= defined  # every one defined is run here
    assert sum(n.startswith("tl.KeyedWindowAggregate(") for n in names) >= 4, names
    late = 0
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        for i, (shown, processor, call) in enumerate(calls):
            path = tmp_path / f"state{i}"
            sink: list[pd.DataFrame] = []
            run = tl.keyed_foreach_batch(lambda df, b: sink.append(df.toPandas()),
                                         call["key"], call["event_time"], processor,
                                         call["delay"], str(path), num_partitions=1,
                                         order_by=call["order_by"])
            tester = KeyedTester(processor, **call)
            for batch_id, part in enumerate(batches(call, processor, seed=i)):
                run(spark.createDataFrame(part), batch_id)
                got = tester.run(part)
                columns = list(got.columns)
                assert list(sink[-1].columns) == columns, shown
                assert normal(got, columns) == normal(sink[-1], columns), (shown, batch_id)
            stream_state = tl.read_state(spark, str(path)).toPandas()
            ours = tester.state()
            assert list(ours.columns) == list(stream_state.columns), shown
            assert normal(ours, list(ours.columns)) == normal(
                stream_state, list(ours.columns)), shown
            assert tester.counters() == run.counters(), shown
            assert sum(len(out) for out in sink) > 0, shown  # something was compared
            late += tester.counters()["late"]
        assert late > 20  # and the batches held late rows
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def test_a_value_the_store_refuses_fails_the_stream_with_the_testers_error(
        spark: Any, tmp_path: Path, local_root: Path) -> None:
    part = frame(["a"], [0], v=["int-keys"])
    with pytest.raises(StateTypeError) as ours:
        KeyedTester(Stores(), key="k", event_time="t", delay=0).run(part)
    run = tl.keyed_foreach_batch(lambda df, b: df.collect(), "k", "t", Stores(), 0,
                                 str(tmp_path / "state"), num_partitions=1)
    with pytest.raises(StateTypeError) as theirs:  # the task's error, typed at the caller
        run(spark.createDataFrame(part), 0)
    assert str(theirs.value) == str(ours.value)
