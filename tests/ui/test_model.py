"""The dashboard model: records checked, history bounded, figures as computed by hand."""

from __future__ import annotations

import json
import logging
import math
import threading

import pytest

from trilink_spark.partitioners import evaluate_strategies
from trilink_spark.ui.model import HEATMAP_CELLS, DashboardModel
from trilink_spark.ui.records import MAX_HOT_KEYS, MAX_RECORD_PARTITIONS, MAX_SAMPLE_KEYS


def record(batch: int, rows: list[float] | None = None, **extra: object) -> dict[str, object]:
    rows = [40, 10, 10, 20] if rows is None else rows
    out: dict[str, object] = {"v": 1, "batch": batch, "time": 1795000000.0 + batch,
                              "seconds": 0.5, "strategy": "hash", "partitions": len(rows),
                              "rows": rows}
    out.update(extra)
    return out


def bad(**fields: object) -> dict[str, object]:
    """A good record with some fields replaced."""
    return {**record(0), **fields}


def malformed() -> dict[str, dict[str, object]]:
    return {
        "not a mapping": ["v", 1],  # type: ignore[dict-item]
        "no version": {k: v for k, v in record(0).items() if k != "v"},
        "version 2": bad(v=2),
        "batch as str": bad(batch="7"),
        "batch as bool": bad(batch=True),
        "negative batch": bad(batch=-1),
        "partitions as float": bad(partitions=4.0),
        "negative partitions": bad(partitions=-4),
        "zero partitions": bad(partitions=0),
        "rows longer than partitions": bad(partitions=3),
        "rows as str": bad(rows="40,10"),
        "rows with NaN": bad(rows=[40, math.nan, 1, 1]),
        "rows with inf": bad(rows=[40, math.inf, 1, 1]),
        "rows with -2": bad(rows=[40, -2, 1, 1]),
        "rows with a str": bad(rows=[40, "10", 1, 1]),
        "NaN time": bad(time=math.nan),
        "negative seconds": bad(seconds=-0.1),
        "strategy as int": bad(strategy=3),
        "task_ms too short": bad(task_ms=[1.0]),
        "too many partitions": bad(rows=[1] * (MAX_RECORD_PARTITIONS + 1)),
        "too many hot keys": bad(hot_keys=[["k", 1, 0]] * (MAX_HOT_KEYS + 1)),
        "hot key a dict": bad(hot_keys=[[{"a": 1}, 5, 0]]),
        "hot key a list": bad(hot_keys=[[["a"], 5, 0]]),
        "hot key on a partition not there": bad(hot_keys=[["k", 5, 4]]),
        "hot key entry short": bad(hot_keys=[["k", 5]]),
        "sample key a dict": bad(sample={"keys": [{"x": 1}], "weights": [1]}),
        "sample key NaN": bad(sample={"keys": [math.nan], "weights": [1]}),
        "sample lengths differ": bad(sample={"keys": ["a", "b"], "weights": [1]}),
        "sample too large": bad(sample={"keys": list(range(MAX_SAMPLE_KEYS + 1)),
                                              "weights": [1] * (MAX_SAMPLE_KEYS + 1)}),
        "sample weight negative": bad(sample={"keys": ["a"], "weights": [-1]}),
        "swap a list": bad(swap=[1]),
        "swap moved_keys negative": bad(swap={"moved_keys": -3}),
        "swap complete as str": bad(swap={"complete": "yes"}),
        "request without id": bad(request={"strategy": "hash"}),
        "rebalance moves as float": bad(rebalance={"reason": "x", "moves": 1.5}),
        "run empty": bad(run=""),
        "run not a str": bad(run=7),
        "strategy too long": bad(strategy="s" * 10_000),
        "executor too short": bad(executor=["0"]),
        "executor an int": bad(executor=[0, "1", "1", "0"]),
        "sync too long a text": bad(sync=["current", "x" * 10_000, "", ""]),
    }


@pytest.mark.parametrize("case", sorted(malformed()))
def test_a_malformed_record_is_refused_with_a_warning(case, caplog):
    model = DashboardModel(history=5)
    with caplog.at_level(logging.WARNING, logger="trilink_spark.ui.model"):
        assert model.add_record(malformed()[case]) is False
    assert model.version == 0
    assert model.runs == [] and model.batches() == []
    assert "history record refused" in caplog.text
    assert model.add_record(record(0)) is True  # the model still takes good records
    assert model.batches() == [0]


@pytest.mark.parametrize("event", [
    {"kind": "gossip", "time": 1.0},
    {"kind": "advice", "time": 1.0, "source": "oracle", "advice": "x", "reason": "y"},
    {"kind": "advice", "time": 1.0, "source": "ds2", "advice": {"scale": 4}},
    {"kind": "progress", "time": math.nan, "batch": 1, "query": "q", "input_rows": 1,
     "duration_ms": 1},
    {"kind": "progress", "time": 1.0, "batch": 1, "query": "q", "input_rows": -1,
     "duration_ms": 1},
    {"kind": "request", "time": 1.0, "request_id": "", "strategy": None},
    {"kind": "request", "time": 1.0, "request_id": "r1", "num_partitions": 0},
    "not a mapping",
])
def test_a_malformed_event_is_refused(event, caplog):
    model = DashboardModel()
    with caplog.at_level(logging.WARNING, logger="trilink_spark.ui.model"):
        assert model.add_event(event) is False
    assert "event refused" in caplog.text
    assert model.events() == {"request": 0, "advice": 0, "progress": 0}
    assert model.version == 0


def test_history_holds_the_newest_batches_whatever_is_fed():
    model = DashboardModel(history=7)
    for batch in range(5 * 7):
        assert model.add_record(record(batch, rows=[batch, 1]))
    assert model.batches() == list(range(28, 35))
    snap = model.snapshot()
    assert snap["balance"]["batch"] == list(range(28, 35))
    assert sorted(set(snap["cells"]["batch"])) == list(range(28, 35))
    assert snap["headline"]["batches"] == [7]


def test_events_are_bounded_per_kind():
    model = DashboardModel(history=4)
    for i in range(5 * 4):
        assert model.add_event({"kind": "progress", "time": float(i), "batch": i,
                                "query": "q", "input_rows": i, "duration_ms": 10})
        assert model.add_event({"kind": "advice", "time": float(i), "batch": i,
                                "source": "ds2", "advice": f"scale to {i}", "reason": "r"})
        assert model.add_event({"kind": "request", "time": float(i), "request_id": f"r{i}",
                                "strategy": "least_count", "num_partitions": None,
                                "mode": "sync"})
    assert model.events() == {"request": 4, "advice": 4, "progress": 4}
    snap = model.snapshot()
    assert snap["progress"]["batch"] == [16, 17, 18, 19]
    assert snap["advice"]["advice"] == ["scale to 19"]  # the newest of its source
    assert len(snap["timeline"]["kind"]) == 4 and set(snap["timeline"]["kind"]) == {"request"}


def test_a_record_for_a_batch_held_replaces_it():
    model = DashboardModel()
    assert model.add_record(record(3, rows=[10, 10]))
    assert model.add_record(record(4, rows=[10, 10]))
    assert model.add_record(record(3, rows=[30, 10], strategy="least_key"))
    assert model.batches() == [3, 4]
    snap = model.snapshot()
    assert snap["balance"]["balance_degree"] == [pytest.approx(1 / 3), 1.0]
    cells = snap["cells"]
    assert [r for b, r in zip(cells["batch"], cells["rows"]) if b == 3] == [30.0, 10.0]


def test_figures_match_hand_computations():
    model = DashboardModel()
    assert model.add_record(record(
        0, rows=[50, -1, 100, 75], task_ms=[5.0, -1, 9.5, 7.0], late=[1, -1, 2, 0],
        late_partition=[-1, -1, -1, -1],
        sample={"keys": ["hot", "a", "b", "a"], "weights": [70, 15, 10, 5]}))
    figures = model.figures(0)
    assert figures is not None
    assert figures.balance_degree == pytest.approx(50 / 100)  # the -1 partition left out
    mean = (50 + 100 + 75) / 3
    assert figures.extra_compute_time == pytest.approx((100 - mean) / mean)
    # keys whole on 2 partitions... here 3: T = 100, L = max(100/4, 70) = 70,
    # the other 3 partitions share 30: bound = 30 / (3 * 70)
    assert figures.keyed_bound == pytest.approx(30 / (3 * 70))
    snap = model.snapshot()
    assert snap["late_key"] == {"batch": [0], "rows": [3.0]}
    assert snap["late_partition"] == {"batch": [], "rows": []}  # no figure at all
    assert snap["latest_rows"] == {"partition": [0, 2, 3], "rows": [50.0, 100.0, 75.0]}
    assert snap["bound"]["keyed_bound"] == [pytest.approx(30 / 210)]
    latest = dict(zip(snap["latest"]["figure"], snap["latest"]["value"]))
    assert latest["balance degree"] == "0.500" and latest["rows"] == "225"
    assert snap["cells"]["task_ms"] == [5.0, -1.0, 9.5, 7.0]


def test_candidates_are_every_strategy_on_the_latest_sample():
    counts = {k: 10 for k in range(0, 400, 4)}
    model = DashboardModel()
    assert model.add_record(record(0, rows=[1, 1, 1, 1], strategy="least_count",
                                   sample={"keys": list(counts), "weights": list(counts.values())}))
    expected = evaluate_strategies(counts, 4)
    snap = model.snapshot()["candidates"]
    assert snap["strategy"] == [s.name for s in expected] == [
        "hash", "modulo", "least_key", "least_count"]
    assert snap["balance_degree"] == [s.balance_degree for s in expected]
    assert snap["balance_degree"][1] == 0.0 and snap["balance_degree"][3] == 1.0
    assert snap["extra_compute_time"] == [s.extra_compute_time for s in expected]
    assert snap["in_force"] == ["", "", "", "in force"]
    # a record replacing the newest batch brings its own candidates
    assert model.add_record(record(0, rows=[1, 1, 1, 1], strategy="least_count",
                                   sample={"keys": ["x"], "weights": [1]}))
    assert model.snapshot()["candidates"]["strategy"] == ["hash", "least_key", "least_count"]


def test_mixed_key_types_give_no_candidates_but_a_keyed_bound(caplog):
    model = DashboardModel()
    with caplog.at_level(logging.DEBUG, logger="trilink_spark.ui.model"):
        assert model.add_record(record(0, sample={"keys": ["u1", 17, None],
                                                  "weights": [900, 120, 3.5]}))
    assert "no candidates" in caplog.text
    snap = model.snapshot()
    assert snap["candidates"]["strategy"] == []
    assert snap["bound"]["keyed_bound"] == [pytest.approx(
        (1023.5 - 900) / (3 * 900))]


def test_runs_with_the_same_batch_ids_are_kept_apart():
    model = DashboardModel()
    for batch in range(3):
        assert model.add_record(record(batch, rows=[10, 10], run="even"))
        assert model.add_record(record(batch, rows=[30, 10, 20], run="skewed"))
    assert model.runs == ["even", "skewed"]
    assert model.batches("even") == model.batches("skewed") == [0, 1, 2]
    even, skewed = model.snapshot("even"), model.snapshot("skewed")
    assert even["balance"]["balance_degree"] == [1.0] * 3
    assert skewed["balance"]["balance_degree"] == [pytest.approx(1 / 3)] * 3
    assert set(skewed["cells"]["partition"]) == {0, 1, 2}
    assert even["headline"]["run"] == ["even", "skewed"]
    assert even["headline"]["shown"] == ["shown", ""]
    assert skewed["headline"]["shown"] == ["", "shown"]
    assert model.snapshot() is model.snapshot(None)  # default: the first run
    assert model.snapshot()["balance"] == even["balance"]
    assert model.snapshot("nobody")["balance"]["batch"] == []


def test_the_least_recently_changed_run_goes_beyond_max_runs():
    model = DashboardModel(max_runs=2)
    assert model.add_record(record(0, run="a"))
    assert model.add_record(record(0, run="b"))
    assert model.add_record(record(1, run="a"))
    assert model.add_record(record(0, run="c"))
    assert model.runs == ["a", "c"]


def test_hot_keys_are_the_top_ten_of_the_latest_batch():
    hot = [[f"k{i}", i * 10, i % 4] for i in range(15)] + [[17, 5000, 1], [None, 1, 2]]
    model = DashboardModel()
    assert model.add_record(record(0, hot_keys=[["old", 10**6, 0]]))
    assert model.add_record(record(1, hot_keys=hot))
    snap = model.snapshot()["hot_keys"]
    assert snap["key"] == ["17"] + [f"k{i}" for i in range(14, 5, -1)]
    assert snap["rows"][:2] == [5000.0, 140.0]
    assert snap["partition"][:2] == [1, 2]
    assert snap["rank"] == list(range(1, 11))


def test_the_timeline_shows_pending_and_carried_out_requests_swaps_and_rebalances():
    model = DashboardModel()
    assert model.add_event({"kind": "request", "time": 1795000001.5, "request_id": "r1",
                            "strategy": "least_count", "num_partitions": 8, "mode": "sync"})
    assert model.add_record(record(1))
    timeline = model.snapshot()["timeline"]
    assert timeline["kind"] == ["request"] and "pending" in timeline["what"][0]
    assert timeline["batch"] == [None]
    swap = {"mode": "sync", "partitions_before": 4, "partitions_after": 8,
            "keys_total": 1000, "moved_keys": 37, "moved_bytes": 52344, "seconds": 1.2,
            "complete": True, "refused": None}
    assert model.add_record(record(2, swap=swap, rebalance={"reason": "skew", "moves": 3},
                                   request={"request_id": "r1", "strategy": "least_count",
                                            "num_partitions": 8, "mode": "sync"}))
    assert model.add_record(record(3, swap={"refused": "state too large", "complete": False}))
    timeline = model.snapshot()["timeline"]
    rows = list(zip(timeline["kind"], timeline["batch"], timeline["moved_keys"],
                    timeline["pause_s"], timeline["refused"], timeline["lane"]))
    assert rows == [("refused", 3, None, None, "state too large", 1),
                    ("swap", 2, 37, 1.2, "", 1),
                    ("rebalance", 2, None, None, "", 0),
                    ("request", 2, None, None, "", 2)]
    assert "carried out in batch 2" in timeline["what"][3]
    assert "4 -> 8 partitions" in timeline["what"][1]
    assert timeline["time_ms"][0] == (1795000000.0 + 3) * 1000


def test_progress_comes_without_any_record():
    model = DashboardModel()
    assert model.add_event({"kind": "progress", "time": 5.0, "batch": 2, "query": 41,
                            "input_rows": 1200, "duration_ms": 80.5})
    snap = model.snapshot()
    assert snap["progress"] == {"time_ms": [5000.0], "batch": [2], "query": ["41"],
                                "input_rows": [1200.0], "duration_ms": [80.5]}
    assert snap["headline"]["run"] == [] and snap["balance"]["batch"] == []


def test_the_snapshot_is_computed_once_per_version_and_encoded_as_json():
    model = DashboardModel()
    assert model.add_record(record(0))
    first = model.snapshot()
    assert model.snapshot() is first
    encoded = model.snapshot_json()
    assert model.snapshot_json() is encoded
    assert {name: json.loads(body) for name, body in encoded.items()} == first
    version = model.version
    assert model.add_record(record(1))
    assert model.version == version + 1
    assert model.snapshot() is not first
    assert json.loads(model.snapshot_json()["headline"])["batch"] == [1]


def test_the_heat_map_keeps_the_newest_batches_that_fit():
    model = DashboardModel(history=20)
    for batch in range(8):
        assert model.add_record(record(batch, rows=[1] * 4096))
    cells = model.snapshot()["cells"]
    assert len(cells["batch"]) <= HEATMAP_CELLS
    assert sorted(set(cells["batch"])) == [4, 5, 6, 7]
    assert model.batches() == list(range(8))


def test_records_from_several_threads_are_all_held():
    model = DashboardModel(history=400)

    def feed(start: int) -> None:
        for batch in range(start, 400, 4):
            assert model.add_record(record(batch))
            model.snapshot()

    threads = [threading.Thread(target=feed, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert model.batches() == list(range(400))
    assert model.version == 400


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="history must be >= 1"):
        DashboardModel(history=0)
    with pytest.raises(TypeError, match="max_runs must be an int"):
        DashboardModel(max_runs="3")


def test_a_request_naming_a_run_shows_on_that_runs_view_only():
    model = DashboardModel()
    assert model.add_record(record(0, run="a"))
    assert model.add_record(record(0, run="b"))
    for run in ("b", "c", None):
        assert model.add_event({"kind": "request", "time": 5.0, "request_id": f"r-{run}",
                                "run": run})
    what = {run: model.snapshot(run)["timeline"]["what"] for run in ("a", "b", "c")}
    assert [w.split(",")[0] for w in what["a"]] == ["request r-None"]
    assert sorted(w.split(",")[0] for w in what["b"]) == ["request r-None", "request r-b"]
    assert sorted(w.split(",")[0] for w in what["c"]) == ["request r-None", "request r-c"]


def test_where_each_partition_ran_reaches_the_heat_map_cells():
    model = DashboardModel()
    assert model.add_record(record(0, rows=[1, 2, 3, 4]))  # written before the fields existed
    assert model.add_record(record(1, rows=[1, 2, 3, 4], executor=["0", "1", "1", ""],
                                   sync=["current", "current", "catch-up", ""]))
    cells = model.snapshot()["cells"]
    by_batch = [(b, e, s) for b, e, s in zip(cells["batch"], cells["executor"], cells["sync"])]
    assert by_batch[:4] == [(0, "", "")] * 4
    assert by_batch[4:] == [(1, "0", "current"), (1, "1", "current"), (1, "1", "catch-up"),
                            (1, "", "")]
