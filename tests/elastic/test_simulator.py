"""The CRAA simulator: determinism, the model's pieces (Kalman, FAA, judgement), the paper's figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trilink_spark import elastic as el
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError, TrilinkError
from trilink_spark.elastic.policies import ChainState

OPS = el.paper_operators()


# ---------------------------------------------------------------------- determinism
@pytest.mark.parametrize("policy", [el.TA(), el.KPA(), el.CRAA()], ids=lambda p: p.name)
def test_same_seed_same_result(policy):
    work = el.Workload.random(1000, 50000)  # drawn from the simulation's seed
    a = el.simulate(OPS, work, policy, duration_s=300, seed=7)
    b = el.simulate(OPS, work, policy, duration_s=300, seed=7)
    pd.testing.assert_frame_equal(a.per_operator, b.per_operator)
    pd.testing.assert_frame_equal(a.timeline, b.timeline)
    c = el.simulate(OPS, work, policy, duration_s=300, seed=8)
    assert not np.array_equal(a.input_rates, c.input_rates)


def test_noisy_sine_is_seeded():
    work = el.Workload.sine(5000, 2500, 500, noise=400)
    a = el.simulate(OPS, work, el.CRAA(), duration_s=100, seed=3)
    b = el.simulate(OPS, work, el.CRAA(), duration_s=100, seed=3)
    assert np.array_equal(a.input_rates, b.input_rates)


# ---------------------------------------------------------------------- results
def test_result_shapes_and_columns():
    res = el.simulate(OPS, el.paper_workload("step"), el.CRAA(), window_s="5 seconds",
                      duration_s="1 minute")
    assert list(res.per_operator.columns) == ["data_loss", "utilisation", "adjustments",
                                              "throughput"]
    assert res.per_operator.index.tolist() == ["O1", "O2", "O3", "O4", "O5"]
    assert len(res.timeline) == 12 * 5
    assert {"window", "operator", "buffer", "units", "lost", "held_back"} <= set(res.timeline)
    assert res.per_operator["utilisation"].between(0, 1).all()
    assert res.policy == "CRAA" and res.workload == "step"


@settings(max_examples=25, deadline=None)
@given(low=st.floats(0, 20000), span=st.floats(0, 30000), seed=st.integers(0, 2**31),
       delay=st.integers(1, 3), which=st.sampled_from(["TA", "KPA", "CRAA"]))
def test_every_tuple_is_processed_lost_or_buffered(low, span, seed, delay, which):
    policy = {"TA": el.TA(), "KPA": el.KPA(), "CRAA": el.CRAA()}[which]
    res = el.simulate(OPS, el.Workload.random(low, low + span), policy, duration_s=200,
                      adjust_delay_windows=delay, seed=seed)
    tl = res.timeline
    for name, g in tl.groupby("operator"):
        arrived = (g["input_rate"] * res.window_s).sum()
        kept = g["processed"].sum() + g["lost"].sum() + g["buffer"].iloc[-1]
        assert arrived == pytest.approx(kept, rel=1e-9, abs=1e-6), name
        assert (g["buffer"] <= OPS[int(name[1]) - 1].buffer_size + 1e-9).all()
        assert (g["units"] >= 1).all()


def test_adjustments_land_after_the_delay():
    for delay in (1, 2, 3):
        res = el.simulate(OPS, el.paper_workload("random"), el.TA(), duration_s=200,
                          adjust_delay_windows=delay)
        tl = res.timeline
        assert not tl.loc[tl["window"] < delay, "adjusted"].any()
        assert tl["adjusted"].any()
        # one adjustment at a time: two effects on one operator are >= delay windows apart
        for _, g in tl[tl["adjusted"]].groupby("operator"):
            assert (np.diff(g["window"].to_numpy()) >= delay).all()


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(InvalidArgumentError, match="buffer_size must be a finite number > 0"):
        el.Operator("x", 0, 10)
    with pytest.raises(InvalidArgumentError, match="efficiency must be in"):
        el.Operator("x", 10, 10, efficiency=1.5)
    with pytest.raises(InvalidArgumentError, match="adjust_delay_windows must be >= 1"):
        el.simulate(OPS, el.paper_workload("step"), el.TA(), adjust_delay_windows=0)
    with pytest.raises(InvalidArgumentError, match="unknown workload 'nope'; choose from"):
        el.paper_workload("nope")
    with pytest.raises(InvalidArgumentError, match="operator names must be unique"):
        el.simulate([OPS[0], OPS[0]], el.paper_workload("step"), el.TA())
    with pytest.raises(InvalidArgumentTypeError, match="policy must be"):
        el.simulate(OPS, el.paper_workload("step"), "craa")
    with pytest.raises(InvalidArgumentError, match="delta must lie in"):
        el.CRAA(delta=0.9)
    with pytest.raises(InvalidArgumentError, match="durations_s must be one duration or one"):
        el.Workload.step([1, 2, 3], [1, 2])
    with pytest.raises(TrilinkError):
        el.Workload.sine(100, 200, 10)


def test_paper_workloads_follow_the_text():
    assert el.paper_workload("step").rates(5, 7).tolist() == [1000, 2000, 5000, 6000, 5000,
                                                              2000, 1000]
    jit = el.paper_workload("jitter").rates(5, 32)
    assert jit[:10].tolist() == [3000] * 10 and jit[10] == 6000 and jit[31] == 1000
    sine = el.paper_workload("sine").rates(5, 100)
    assert sine.mean() == pytest.approx(5000, abs=1e-6)
    assert sine.max() == pytest.approx(7500, rel=1e-3)
    rnd = el.paper_workload("random").rates(5, 120, seed=1)
    assert rnd.min() >= 1000 and rnd.max() <= 50000


# ---------------------------------------------------------------------- Kalman
@pytest.mark.parametrize("seed", range(5))
def test_kalman_beats_the_last_value_on_a_noisy_sine(seed):
    rng = np.random.default_rng(seed)
    n = np.arange(400)
    truth = 5000 + 2500 * np.sin(2 * np.pi * n / 100)
    z = truth + rng.normal(0, 300, n.size)
    err_last = np.sqrt(np.mean((z[20:-1] - z[21:]) ** 2))
    for kf in (el.KalmanFilter(), el.KalmanFilter(trend=False),
               el.KalmanFilter(level_noise=1e3, slope_noise=100.0, measurement_noise=300.0**2)):
        pred = np.empty(n.size - 1)
        for i in range(n.size - 1):
            kf.update(z[i])
            pred[i] = kf.predict(1)
        err_kf = np.sqrt(np.mean((pred[20:] - z[21:]) ** 2))
        assert err_kf < err_last, (kf.level_noise, kf.trend, err_kf, err_last)


def test_kalman_follows_a_ramp_and_copies_are_independent():
    kf = el.KalmanFilter()
    for z in range(0, 1000, 100):
        kf.update(float(z))
    assert kf.predict(1) == pytest.approx(1000, rel=0.02)
    assert kf.predict(2) > kf.predict(1)
    twin = kf.copy()
    twin.update(0.0)
    assert kf.predict(1) == pytest.approx(1000, rel=0.02)
    kf.reset()
    assert kf.predict(1) == 0.0 and kf.count == 0


# ---------------------------------------------------------------------- FAA (Algorithm 1)
def _up(name, processed, flag=0, buffer=0.0):
    return el.Upstream(name, flag, processed, buffer, 10_000, 0.0, 1.0, 5.0)


def test_faa_picks_the_fewest_upstreams_largest_first():
    ups = [_up("a", 300), _up("b", 900), _up("c", 600), _up("d", 100)]
    got = el.feedback_adjustment(ups, expected_input=2400, limit=1000)  # needs 1400
    assert [f.name for f in got] == ["b", "c"]
    assert [f.output_cut for f in got] == [900, 600]
    assert got[0].rate == 0.0  # b holds back everything it processed: UP = 0
    # one large upstream suffices: it alone is chosen
    assert [f.name for f in el.feedback_adjustment(ups, 1800, 1000)] == ["b"]


def test_faa_skips_busy_upstreams_and_cancels_when_short():
    ups = [_up("a", 300), _up("b", 900, flag=1), _up("c", 600)]
    assert [f.name for f in el.feedback_adjustment(ups, 1700, 1000)] == ["c", "a"]
    assert el.feedback_adjustment(ups, 2000, 1000) == []        # 900 free < 1000 needed
    assert el.feedback_adjustment(ups, 900, 1000) == []         # already within the limit
    assert el.feedback_adjustment([_up("b", 900, flag=-1)], 2000, 1000) == []


def test_faa_respects_tau_and_the_next_window():
    # Eq. 7: buffer 7000 of 10000, tau 0.8 -> at most 1000 more
    u = _up("a", 5000, buffer=7000)
    rate, cut = el.feedback_capacity(u, tau=0.8)
    assert cut == pytest.approx(1000) and rate == pytest.approx(800)
    # Eq. 6: the upstream's own buffer must not overflow next window
    v = el.Upstream("v", 0, 5000, 0.0, 10_000, 9_500.0, 1.0, 5.0)
    assert el.feedback_capacity(v, tau=1.0)[1] == pytest.approx(500)


# ---------------------------------------------------------------------- judgement (Eq. 12-13)
def test_cooperative_judgement_refuses_against_the_trend():
    assert el.trend_relation(1, 1.2) == 0 and el.trend_relation(-1, 0.8) == 0
    assert el.trend_relation(1, 0.8) == 1 and el.trend_relation(-1, 1.2) == -1
    assert not el.cooperative_judgement(-1, 1.2, 0.0, 1000)      # down while rising
    assert not el.cooperative_judgement(1, 0.8, 999.0, 1000)     # up while falling, fits
    assert el.cooperative_judgement(1, 0.8, 1000.0, 1000)        # ... unless it overflows
    assert el.cooperative_judgement(1, 1.0, 0.0, 1000)
    with pytest.raises(InvalidArgumentError):
        el.trend_relation(0, 1.0)


def _dip_state():
    """O1 ran on 2 units (1000/s) for an input of 4000/s, so O2 saw a dip to 1000/s; O1 is
    about to scale up, so O2's input comes back next window."""
    return ChainState(window=10, window_s=5.0, delay=1,
                      input_rate=np.array([4000.0, 1000.0]), buffer=np.array([50.0, 0.0]),
                      processed=np.array([5000.0, 5000.0]), transit=np.array([5000.0, 5000.0]),
                      units=np.array([2, 10]), pending=[None, None])


def test_craa_refuses_a_scale_down_against_the_trend_that_ta_makes():
    ops = (el.Operator("O1", 50, 500), el.Operator("O2", 500, 400, units=10))
    craa = el.CRAA().controller(ops).decide(_dip_state())
    assert craa.targets.get(0, 0) >= 8        # O1 scales up (fed forward to O2)
    assert 1 not in craa.targets              # O2 keeps its units: the input rises again
    ta = el.TA().controller(ops).decide(_dip_state())
    assert ta.targets[1] < 10                 # TA shrinks O2 on the dip


# ---------------------------------------------------------------------- the paper's figures
def _run(workload, policy, delay=1):
    return el.simulate(OPS, el.paper_workload(workload), policy, adjust_delay_windows=delay)


@pytest.mark.parametrize("workload", ["step", "random"])
def test_craa_halves_the_data_loss_of_ta_on_step_and_random(workload):
    ta = _run(workload, el.TA()).per_operator["data_loss"].sum()
    craa = _run(workload, el.CRAA()).per_operator["data_loss"].sum()
    assert craa <= 0.5 * ta


def test_craa_adjusts_o4_o5_less_in_jitter_without_more_loss():
    ta, craa = _run("jitter", el.TA()).per_operator, _run("jitter", el.CRAA()).per_operator
    for op in ("O4", "O5"):
        assert craa.loc[op, "adjustments"] <= ta.loc[op, "adjustments"]
        assert craa.loc[op, "data_loss"] <= ta.loc[op, "data_loss"]


def test_craa_keeps_utilisation_on_sine():
    ta, craa = _run("sine", el.TA()).per_operator, _run("sine", el.CRAA()).per_operator
    assert craa["utilisation"].mean() >= ta["utilisation"].mean() - 0.02


def test_downstream_operators_lose_nothing_under_craa_on_step2():
    per = _run("step2", el.CRAA()).per_operator
    assert per.loc[["O4", "O5"], "data_loss"].sum() == 0
