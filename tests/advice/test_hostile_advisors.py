"""Hostile inputs for the progress parser, the bottleneck advisor, ``advise``, flow and DS2.

Each test is named after what it protects; each was a raw traceback, a hang or a wrong number
before the fix it guards.
"""

from __future__ import annotations

import io
import json
import logging
import math
import random
import sys
import threading
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest

import trilink_spark as tl
from trilink_spark.advice.bottleneck import BottleneckAdvisor, BottleneckListener
from trilink_spark.advice.ds2 import TrueRate, ds2_parallelism, scaled_parallelism
from trilink_spark.elastic.pipeline import SimulatedOperator, SimulatedPipeline
from trilink_spark.advice.analysis import find_bottlenecks
from trilink_spark.advice.capacity import CapacityObservation, capacity_step
from trilink_spark.advice.cuts import operator_min_cut
from trilink_spark.advice.network import FlowNetwork, max_flow
from trilink_spark.measurement.metrics import TASK_METRIC_COLUMNS
from trilink_spark.measurement.progress import MAX_PROGRESS_BYTES, RATE_CAP, parse_progress
from trilink_spark.errors import (InvalidArgumentError, InvalidArgumentTypeError,
                                  TrilinkError)


def progress(batch: int, rows: int = 1000, rate: float = 900.0, ms: float = 1000.0,
             backlog: int | None = None, **extra: Any) -> dict[str, Any]:
    sources = []
    if backlog is not None:
        sources = [{"endOffset": {"t": {"0": 100}}, "latestOffset": {"t": {"0": 100 + backlog}}}]
    return {"batchId": batch, "numInputRows": rows, "inputRowsPerSecond": rate,
            "durationMs": {"triggerExecution": ms, "addBatch": ms * 0.9}, "sources": sources,
            **extra}


def strict_json(report: Any) -> Any:
    return json.loads(json.dumps(report.to_dict(), allow_nan=False))


# ---------------------------------------------------------------------- progress
@pytest.mark.parametrize("bad", [
    {"batchId": 10 ** 5000}, {"batchId": 2 ** 63}, {"batchId": 1, "numInputRows": 10 ** 5000},
    {"batchId": 1, "numInputRows": 2 ** 63}, {"batchId": 1, "durationMs": {"x": 10 ** 400}},
    {"batchId": 1, "inputRowsPerSecond": 10 ** 400},
])
def test_progress_integers_beyond_64_bits_or_floats_are_typed_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError, match="progress"):
        parse_progress(bad)


def test_progress_row_counts_stay_exact_above_2_53() -> None:
    assert parse_progress({"batchId": 1, "numInputRows": 2 ** 60 + 1}).input_rows == 2 ** 60 + 1


def test_progress_offsets_beyond_64_bits_leave_the_backlog_unknown() -> None:
    def backlog(end: Any, latest: Any) -> int | None:
        return parse_progress({"batchId": 1, "sources": [
            {"endOffset": end, "latestOffset": latest}]}).backlog_rows

    assert backlog({"t": {"0": 0}}, {"t": {"0": 10 ** 5000}}) is None
    assert backlog({"t": {"0": 100}}, {"t": {"0": 50}}) == 0          # backwards: no backlog
    assert backlog({"t": {"0": 1.5}}, {"t": {"0": 50}}) is None       # not integers
    assert backlog("[" * 100_000, {"t": {"0": 50}}) is None           # nested, not parsed
    assert parse_progress({"batchId": 1, "sources": {"a": 1}}).backlog_rows is None


def test_progress_size_and_shape_errors_name_what_was_wrong() -> None:
    with pytest.raises(InvalidArgumentError, match="bytes is larger"):
        parse_progress(b" " * (MAX_PROGRESS_BYTES + 1))
    with pytest.raises(InvalidArgumentTypeError, match="JSON of a list"):
        parse_progress("[1, 2]")
    with pytest.raises(InvalidArgumentError, match="durationMs.k+ must be a number") as err:
        parse_progress({"batchId": 1, "durationMs": {"k" * 1_000_000: "x"}})
    assert len(str(err.value)) < 300  # the 1 MB key is not copied into the message


# ---------------------------------------------------------------------- the advisor
@pytest.mark.parametrize("rows", [0, 1000])
def test_a_node_that_spent_no_time_is_never_the_bottleneck_and_reports_strict_json(
        rows: int) -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    for b in range(3):
        adv.observe_operator("x", rows, 0, 1)
        adv.observe_progress(progress(b, rows=rows, rate=900.0 if rows else 0.0))
    r = adv.report()
    assert r.bottleneck == [] and r.actions == []
    assert math.isinf(r.max_flow) and r.utilisation == 0.0
    out = strict_json(r)
    assert out["max_flow"] is None and out["nodes"][0]["true_rate"] is None


@pytest.mark.parametrize("case", ["tiny duration", "huge rate", "huge backlog", "tiny busy"])
def test_absurd_figures_give_a_finite_report_not_an_error(case: str) -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    for b in range(3):
        adv.observe_operator("a", 1000, 1e-298 if case == "tiny busy" else 100, 1)
        adv.observe_operator("b", 1000, 1e-298 if case == "tiny busy" else 200, 1)
        adv.observe_progress(progress(
            b, ms=1e-300 if case == "tiny duration" else 1000.0,
            rate=1.7e308 if case == "huge rate" else 900.0,
            backlog=2 ** 62 if case in ("huge backlog", "tiny duration") else None))
    r = adv.report()
    assert 0 < r.offered_rate <= 2 * RATE_CAP
    if case == "tiny busy":
        assert r.bottleneck == [] and r.max_flow == pytest.approx(RATE_CAP)
    else:  # b (5,000 rows/s) cannot carry what is offered
        assert r.bottleneck == ["b"] and r.max_flow == pytest.approx(5000.0)
    assert all(math.isfinite(n.ds2_parallelism) for n in r.nodes)
    strict_json(r)


def test_max_flow_honours_capacities_twelve_orders_of_magnitude_apart() -> None:
    net = FlowNetwork({("s", "a"): 1e13, ("a", "b"): 1.0, ("b", "t"): 1e13})
    assert max_flow(net, "s", "t").value == pytest.approx(1.0)
    assert find_bottlenecks(net, "s", "t", demand=5.0).operators == ("b",)
    assert max_flow(net, "s", "t", limit=0.5).value == pytest.approx(0.5)


def test_a_replayed_batch_id_counts_once_and_a_restart_counts_anew() -> None:
    once, twice = BottleneckAdvisor(warmup_batches=0), BottleneckAdvisor(warmup_batches=0)
    for b in (0, 1, 2):
        once.observe_operator("x", 1000, 500, 1)
        once.observe_progress(progress(b, backlog=100 * b))
    for b in (0, 1, 2, 2, 2):
        twice.observe_operator("x", 1000, 500, 1)
        twice.observe_progress(progress(b, backlog=100 * b))
    assert twice.report().batches == once.report().batches == 3
    assert twice.report().to_dict() == once.report().to_dict()
    for b in (0, 1):  # the query restarted: new batches, the latest backlog counts
        twice.observe_operator("x", 1000, 500, 1)
        twice.observe_progress(progress(b, backlog=7))
    assert twice.report().batches == 5 and twice.report().backlog_rate == pytest.approx(7.0)


def test_progress_with_only_trigger_execution_is_one_phase_node() -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    for b in range(2):
        adv.observe_progress({"batchId": b, "numInputRows": 100, "inputRowsPerSecond": 10.0,
                              "durationMs": {"triggerExecution": 1000}})
    r = adv.report()
    assert [n.name for n in r.nodes] == ["phase triggerExecution"]
    assert r.max_flow == pytest.approx(100.0)


def frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    # the ten columns observe_stages needs; the shuffle-write ones are optional
    return pd.DataFrame(rows, columns=list(TASK_METRIC_COLUMNS)[:10])


def test_observe_stages_ignores_failed_killed_and_unrecorded_figures() -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    adv.observe_stages(frame([]), close=True)
    assert adv.report().nodes == []
    adv.observe_stages(frame([
        (0, 0, 0, 0, "FAILED", 100, 100, 100, 0, 100),
        (0, 0, 0, 1, "SUCCESS", 100, 50, 40, 0, 100),
        (1, 0, 0, 0, "KILLED", -1, -1, -1, -1, -1),
        (1, 0, 1, 0, "SUCCESS", -1, -1, -1, -1, -1)]), close=True)
    r = adv.report()
    assert [(n.name, n.kind, n.rows_per_batch, n.tasks) for n in r.nodes] == [
        ("stage 0", "source read", 100.0, 1), ("stage 1", "operator", 0.0, 1)]
    assert r.nodes[0].true_rate == pytest.approx(2500.0)  # 100 rows in 40 ms of run time
    strict_json(r)


def test_observe_stages_refuses_frames_that_are_not_task_metrics() -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    good = frame([(0, 0, 0, 0, "SUCCESS", 100, 50, 40, 0, 100)])
    nan_stage = good.astype({"stage_id": float})
    nan_stage.loc[0, "stage_id"] = np.nan
    with pytest.raises(InvalidArgumentError, match="stage_id"):
        adv.observe_stages(nan_stage)
    words = good.astype({"rows": object})
    words.loc[0, "rows"] = "many"
    with pytest.raises(InvalidArgumentTypeError, match="'rows' must hold numbers"):
        adv.observe_stages(words)
    with pytest.raises(InvalidArgumentTypeError):
        adv.observe_stages(good.drop(columns=["run_ms"]))
    missing = good.astype({"rows": float})
    missing.loc[0, "rows"] = np.nan  # not recorded: counts -1, i.e. nothing
    adv.observe_stages(missing, close=True)
    assert adv.report().nodes[0].rows_per_batch == 0.0


def test_observe_operator_types_and_ranges() -> None:
    adv = BottleneckAdvisor()
    with pytest.raises(InvalidArgumentTypeError, match="name must be a str"):
        adv.observe_operator(5, 1, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="kind"):
        adv.observe_operator("a", 1, 1, 1, kind=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="rows must be in"):
        adv.observe_operator("a", 1e308, 1, 1)
    with pytest.raises(InvalidArgumentError, match="busy_ms"):
        adv.observe_operator("a", 1, float("nan"), 1)


def test_200_operators_report_quickly() -> None:
    adv = BottleneckAdvisor(warmup_batches=0)
    for b in range(5):
        for i in range(200):
            adv.observe_operator(f"op{i}", 1000, 100 + (400 if i == 117 else i), 2)
        adv.observe_progress(progress(b, rate=5000.0))  # op117 carries 4,000
    start = time.perf_counter()
    r = adv.report()
    assert time.perf_counter() - start < 5.0
    assert r.bottleneck == ["op117"] and len(r.nodes) == 200


def test_observe_from_four_threads_while_report_runs() -> None:
    adv = BottleneckAdvisor(warmup_batches=0, window_batches=3)
    errors: list[BaseException] = []

    def feed(k: int) -> None:
        try:
            for b in range(200):
                adv.observe_operator(f"op{b % 3}", 1000, 100, 2)
                adv.observe_progress(progress(k * 1000 + b))
        except BaseException as err:  # noqa: BLE001 - collected for the assertion
            errors.append(err)

    def report() -> None:
        try:
            for _ in range(200):
                strict_json(adv.report())
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=feed, args=(k,)) for k in range(4)]
    threads.append(threading.Thread(target=report))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert adv.report().batches == 3


def test_the_listener_callback_never_raises_into_the_listener_bus(
        caplog: pytest.LogCaptureFixture) -> None:
    listener = BottleneckListener(BottleneckAdvisor(warmup_batches=0))

    class NoProgress:
        @property
        def progress(self) -> Any:
            raise RuntimeError("gone")

    class Progress:
        def __init__(self, text: str) -> None:
            self.json, self.batchId, self.runId = text, 1, "run"

    class Event:
        def __init__(self, text: str) -> None:
            self.progress = Progress(text)

    with caplog.at_level(logging.WARNING):
        for event in (NoProgress(), Event("[" * 100_000), Event("\xff junk"), object(),
                      Event(json.dumps(progress(0)))):
            listener.onQueryProgress(event)
        listener.onQueryStarted(None)
        listener.onQueryIdle(None)
        listener.onQueryTerminated(None)
    assert caplog.text.count("BottleneckListener") == 4
    assert len(listener.reports) == 1


# ---------------------------------------------------------------------- advise
def advise(path: str, stdin: Any = None) -> tuple[int, str]:
    from trilink_spark.cli import main

    out = io.StringIO()
    old = sys.stdin
    if stdin is not None:
        sys.stdin = stdin
    try:
        return main(["advise", "--progress", path, "--warmup", "0", "--json"], out), \
            out.getvalue()
    finally:
        sys.stdin = old


def test_advise_refuses_junk_files_with_an_error_naming_the_line(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(json.dumps(progress(0)).encode() + b"\n\xff\xfe\x00\x88binary\n")
    assert advise(str(junk))[0] == 2
    assert "junk.bin, line 2: not UTF-8" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert advise(str(tmp_path / "empty.jsonl"))[0] == 2
    assert "holds no progress event" in capsys.readouterr().err
    (tmp_path / "adir").mkdir()
    assert advise(str(tmp_path / "adir"))[0] == 2
    assert "cannot read" in capsys.readouterr().err
    assert advise(str(tmp_path / "missing.jsonl"))[0] == 2
    long = tmp_path / "long.jsonl"
    long.write_bytes(b"x" * (MAX_PROGRESS_BYTES + 10))
    assert advise(str(long))[0] == 2
    assert "line 1: longer than" in capsys.readouterr().err


def test_advise_reads_stdin_without_closing_it() -> None:
    class Stdin(io.TextIOWrapper):
        pass

    text = "\n".join(json.dumps(progress(b)) for b in (0, 1, 1)) + "\n"
    stdin = Stdin(io.BytesIO(text.encode()), encoding="utf-8")
    rc, out = advise("-", stdin)
    assert rc == 0 and not stdin.closed
    report = json.loads(out)
    assert report["events"] == 3 and report["batches"] == 2  # batch 1 twice counts once


# ---------------------------------------------------------------------- flow
@pytest.mark.parametrize("caps", [{("s", "t"): 10 ** 400},
                                  {("s", "a"): 1e308, ("s", "b"): 1e308, ("a", "t"): 1e308,
                                   ("b", "t"): 1e308}])
def test_capacities_beyond_the_float_range_are_typed_errors(caps: dict[Any, Any]) -> None:
    with pytest.raises(InvalidArgumentError, match="finite|sum to"):
        FlowNetwork(caps)


def test_cut_flows_given_by_the_caller_are_checked() -> None:
    net = FlowNetwork({("s", "a"): 1, ("a", "t"): 1})
    with pytest.raises(InvalidArgumentError, match="finite"):
        operator_min_cut(net, "s", "t", flows={("s", "a"): float("nan")})
    with pytest.raises(InvalidArgumentTypeError):
        operator_min_cut(net, "s", "t", flows={("s", "a"): "x"})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentTypeError):
        operator_min_cut(net, "s", "t", flows=[1])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        net.violations("s", "t", {("s", "a"): "x"})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentTypeError):
        net.value("s", {("s", "a"): "x"})  # type: ignore[dict-item]
    assert net.violations("s", "t", {("s", "a"): float("nan")}) != []
    with pytest.raises(InvalidArgumentTypeError, match="not hashable"):
        operator_min_cut(net, "s", "t", operator_of=lambda n: [n])


def test_capacity_step_never_overflows() -> None:
    tiny = capacity_step(1e-300, CapacityObservation(1.0, 1.0, 0.5), threshold_ms=100.0)
    assert tiny.direction == 1 and math.isfinite(tiny.capacity) and tiny.capacity >= 1e-300
    fast = capacity_step(1e-3, CapacityObservation(1.0, 1.0, 1e-300), threshold_ms=100.0)
    assert math.isfinite(fast.capacity)
    big = capacity_step(1e308, CapacityObservation(1e308, 1.0, 0.5), threshold_ms=100.0,
                        step=1e308)
    assert big.capacity == sys.float_info.max


def _random_net(edges: int) -> FlowNetwork:
    rng = random.Random(edges)
    nodes = max(4, edges // 10)
    cap: dict[tuple[int, int], float] = {}
    while len(cap) < edges:
        u, v = rng.randrange(nodes), rng.randrange(nodes)
        if u != v:
            cap[(u, v)] = float(rng.randint(1, 100))
    return FlowNetwork(cap)


def test_max_flow_stays_polynomial_at_three_sizes() -> None:
    times = []
    for edges in (1_000, 3_000, 10_000):
        net = _random_net(edges)
        sink = net.nodes[-1]
        start = time.perf_counter()
        res = max_flow(net, net.nodes[0], sink)
        operator_min_cut(net, net.nodes[0], sink)
        times.append(time.perf_counter() - start)
        assert res.value == pytest.approx(res.cut_capacity)
    assert times[-1] < 10.0
    # 10x the edges: far below the O(|V| |E|^2) bound of 10^4
    assert times[-1] < 1000 * max(times[0], 1e-3)


# ---------------------------------------------------------------------- DS2
def test_ds2_targets_beyond_the_float_range_are_typed_or_capped() -> None:
    with pytest.raises(InvalidArgumentError, match="max_parallelism"):
        ds2_parallelism({"s": ["a"]}, {"a": 1e-3}, {"s": 1e308})
    assert ds2_parallelism({"s": ["a"]}, {"a": 1e-3}, {"s": 1e308}, max_parallelism=10) == \
        {"a": 10}
    with pytest.raises(InvalidArgumentError):
        ds2_parallelism({"s": ["a"], "s2": ["a"]}, {"a": 1.0}, {"s": 1e308, "s2": 1e308})
    with pytest.raises(InvalidArgumentError, match="bits"):
        ds2_parallelism({"s": ["a"]}, {"a": 1.0}, {"s": 10 ** 400})
    with pytest.raises(InvalidArgumentError, match="cycle"):
        ds2_parallelism({"s": ["a"], "a": ["b"], "b": ["a"]}, {"a": 1.0, "b": 1.0}, {"s": 1.0})
    with pytest.raises(InvalidArgumentError, match="> 0"):
        ds2_parallelism({"s": ["a"]}, {"a": 0.0}, {"s": 1.0})
    assert ds2_parallelism({"s": ["a"]}, {"a": 5.0}, {"s": 0.0}) == {"a": 1}


def test_scaled_parallelism_never_hangs_on_huge_rates() -> None:
    start = time.perf_counter()
    assert scaled_parallelism(1e25, 1, 1.0) >= 10 ** 24
    assert scaled_parallelism(1e300, 1, 1.0) >= 10 ** 299
    assert scaled_parallelism(1e17, 1, 1.0, max_parallelism=64) == 64
    with pytest.raises(InvalidArgumentError, match="max_parallelism"):
        scaled_parallelism(1e200, 1, 1.0, 0.1)
    assert scaled_parallelism(1e200, 1, 1.0, 0.1, max_parallelism=7) == 7
    assert time.perf_counter() - start < 1.0
    assert scaled_parallelism(4000.0, 2, 1000.0, 0.8) == 5  # the exact answer is unchanged


def test_simulated_pipeline_overflow_is_a_typed_error() -> None:
    sim = SimulatedPipeline({"s": ["a"]}, {"s": SimulatedOperator(1.0),
                                           "a": SimulatedOperator(1e-300, exponent=0.1)})
    with pytest.raises(InvalidArgumentError):
        sim.minimal_parallelism({"s": 1e300})
    with pytest.raises(InvalidArgumentError, match="2\\*\\*53"):
        sim.run({"s": 10 ** 400, "a": 1}, {"s": 1.0})
    wide = SimulatedPipeline({"s": ["a"]}, {"s": SimulatedOperator(1.0, selectivity=1e308),
                                            "a": SimulatedOperator(1.0)})
    with pytest.raises(InvalidArgumentError, match="float range"):
        wide.run({"s": 1, "a": 1}, {"s": 1e300})
    with pytest.raises(TrilinkError):
        TrueRate.from_counts(1e300, 1e-300)
