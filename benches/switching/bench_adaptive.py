"""Sampling-based switching: Trilink Table 9, decision quality, and the cost of sampling.

1. Table 9 in shape. A simulated stream of 1-second micro-batches, 20 minutes long, whose key
   distribution (cycling through the paper's four scenarios) and rate (x(1 + a) or x(1 - a),
   a = 0.5, kept within [R/4, 4R]) change v = 0.1, 1, 5, 10 and 30 times per minute. Each batch
   is drawn from the current distribution, observed by an AdaptivePartitioner at 1 % (binomial
   thinning, as Bernoulli sampling of the rows does), a decision is taken per its mode, and the
   batch is placed as ``key_by(fit="full")`` would place it. Reported per configuration:
   effective throughput relative to perfect balance, sum(records) / sum(n x max partition
   load), and the number of switches. Initial strategy Modulo, as in the paper.
2. Decision quality: 1,000,000 records, 60 partitions, four scenarios x 5 seeds; the strategy
   chosen on a 1 % sample, used as key_by(fit="full") uses it, against the best candidate
   fitted on all the data (balance degree on all the data).
3. Sampling overhead: a 5,000,000-row DataFrame placed with key_by and counted per key (the
   work of one micro-batch), with and without ``observe_df`` at 1 % in front, in one run.

Run: ``python benches/switching/bench_adaptive.py`` (writes benches/results/adaptive.json;
``--quick`` for a shorter stream, ``--only table9|quality|overhead`` to rerun one part).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import RESULTS, median_time, write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402
from trilink_spark.partitioners import balance_degree  # noqa: E402
from trilink_spark.switching import adaptive_foreach_batch  # noqa: E402
from trilink_spark.partitioners.choosing.scenarios import PAPER_SCENARIOS, make_scenario  # noqa: E402

N = 16
RATE = 100_000
CHANGE_FACTOR = 0.5
SPEEDS = (0.1, 1, 5, 10, 30)
CONFIGS: dict[str, dict[str, Any]] = {
    "quantity (75 s of input)": {"mode": "quantity", "quantity": 75 * RATE},
    "quantity (7.5 s of input)": {"mode": "quantity", "quantity": 75 * RATE // 10},
    "periodic (20 s)": {"mode": "periodic", "period_s": 20.0},
    "periodic (5 s)": {"mode": "periodic", "period_s": 5.0},
    "threshold (0.6)": {"mode": "threshold", "threshold": 0.6},
    "threshold (0.4)": {"mode": "threshold", "threshold": 0.4},
    "fixed Modulo": {"mode": "manual"},
    "fixed Hash": {"mode": "manual", "initial": "hash"},
}
PAPER_TABLE9 = {  # 10^4 records/s, Trilink Table 9, v = 0.1, 1, 5, 10, 30
    "quantity (75 s of input)": [130.1, 128.4, 76.2, 61.8, 47.8],
    "quantity (7.5 s of input)": [101.2, 97.2, 72.7, 70.5, 68.1],
    "periodic (20 s)": [96.1, 95.7, 74.9, 70.1, 67.2],
    "periodic (5 s)": [82.2, 83.1, 81.9, 80.3, 75.4],
    "threshold (0.6)": [131.1, 129.2, 90.1, 82.1, 64.2],
    "threshold (0.4)": [130.2, 128.7, 85.4, 89.2, 78.8],
}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def distributions(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for name in PAPER_SCENARIOS:
        sc = make_scenario(name, 1_000_000, 10_000, seed=seed)
        out.append((sc.keys, sc.counts / sc.counts.sum()))
    return out


def simulate(config: dict[str, Any], speed: float, minutes: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    dists = distributions(seed)
    clock = Clock()
    settings = {k: v for k, v in config.items() if k != "initial"}
    ap = tl.AdaptivePartitioner(
        N, sample_rate=0.01, initial=config.get("initial", "modulo"), clock=clock, seed=seed,
        **settings,
    )
    interval = 60.0 / speed
    scenario, rate = 0, float(RATE)
    records = weighted_max = 0.0
    next_change = interval
    for second in range(minutes * 60):
        clock.now = float(second)
        if second >= next_change:
            scenario = (scenario + 1) % len(dists)
            factor = 1 + CHANGE_FACTOR if rng.random() < 0.5 else 1 - CHANGE_FACTOR
            rate = float(np.clip(rate * factor, RATE / 4, RATE * 4))
            next_change += interval
        keys, probs = dists[scenario]
        counts = rng.multinomial(int(rate), probs)
        present = counts > 0
        keys, counts = keys[present], counts[present]
        ap.batch_boundary()
        sampled = rng.binomial(counts, ap.sample_rate)
        hit = sampled > 0
        ap.observe(dict(zip(keys[hit].tolist(), sampled[hit].tolist())), represents=float(rate))
        ap.decide()
        p = ap.unwrap(refit=True)
        if p.is_stateful:  # key_by(fit="full"): the table learns the batch's keys
            if isinstance(p, tl.LeastCountPartitioner):
                p.fit(dict(zip(keys.tolist(), counts.tolist())))
            else:
                p.fit(keys)
            pids = p.lookup(keys)  # type: ignore[attr-defined]
        else:
            pids = p.assign(keys)
        loads = np.bincount(pids, weights=counts, minlength=N)
        records += counts.sum()
        weighted_max += N * loads.max()
    switches = sum(d.switched for d in ap.decisions)
    return {"efficiency": records / weighted_max, "switches": switches,
            "decisions": len(ap.decisions)}


def table9(minutes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, config in CONFIGS.items():
        row = {}
        for speed in SPEEDS:
            start = time.perf_counter()
            row[str(speed)] = simulate(config, speed, minutes)
            row[str(speed)]["seconds"] = round(time.perf_counter() - start, 2)
        out[name] = row
        cells = "  ".join(
            f"{row[str(v)]['efficiency']:.3f}/{row[str(v)]['switches']}" for v in SPEEDS
        )
        print(f"{name:28s} {cells}", flush=True)
    return out


def decision_quality(seeds: int = 5, partitions: int = 60) -> dict[str, Any]:
    rows = []
    for name in PAPER_SCENARIOS:
        for seed in range(seeds):
            sc = make_scenario(name, 1_000_000, 10_000, seed=seed)
            full = sc.as_mapping()
            keys = np.asarray(list(full))
            weights = np.asarray(list(full.values()), dtype=np.float64)
            rng = np.random.default_rng(seed + 100)
            sampled = rng.binomial(sc.counts, 0.01)
            hit = sampled > 0
            ap = tl.AdaptivePartitioner(partitions, mode="manual", seed=seed)
            ap.observe(dict(zip(sc.keys[hit].tolist(), sampled[hit].tolist())),
                       represents=float(sc.num_records))
            decision = ap.decide(force=True)
            p = ap.unwrap(refit=True).copy()
            if p.is_stateful:
                p.fit(full if isinstance(p, tl.LeastCountPartitioner) else keys)
            chosen = balance_degree(np.bincount(p.assign(keys), weights, partitions))
            scores = tl.evaluate_strategies(full, partitions)
            best = max(scores, key=lambda s: s.balance_degree)
            rows.append({
                "scenario": name, "seed": seed, "chosen": decision.chosen,
                "chosen_balance": chosen, "best": best.name,
                "best_balance": best.balance_degree, "ratio": chosen / best.balance_degree,
            })
    worst = min(r["ratio"] for r in rows)
    print(f"decision quality: worst chosen/best = {worst:.4f}")
    return {"partitions": partitions, "sample_rate": 0.01, "rows": rows, "worst_ratio": worst}


def sampling_overhead(rows: int = 5_000_000, repeat: int = 9) -> dict[str, Any]:
    """One micro-batch's work through adaptive_foreach_batch: observe off, sync and async."""
    spark = tl.get_session("local[2]", shuffle_partitions=8,
                           extra_conf={"spark.driver.memory": "4g"})
    df = spark.range(rows).selectExpr("id % 100000 AS key", "id AS v")

    def count(placed: Any, batch_id: int) -> None:
        placed.groupBy(tl.PARTITION_COL, "key").count().write.format("noop").mode(
            "overwrite").save()

    runners = {}
    for mode in ("off", "sync", "async"):
        ap = tl.AdaptivePartitioner(8, sample_rate=0.01, mode="threshold",
                                    initial=tl.HashPartitioner(8))
        runners[mode] = adaptive_foreach_batch(count, ap, "key", observe=mode)
    batch_ids = iter(range(10**6))
    for runner in runners.values():  # warm-up
        runner(df, next(batch_ids))
    times: dict[str, list[float]] = {mode: [] for mode in runners}
    for _ in range(repeat):  # interleaved: drift of a shared machine hits every mode alike
        for mode, runner in runners.items():
            start = time.perf_counter()
            runner(df, next(batch_ids))
            times[mode].append(time.perf_counter() - start)
    ap = tl.AdaptivePartitioner(8, sample_rate=0.01)
    observe_only = median_time(lambda: ap.observe_df(df, "key"), repeat=repeat)
    spark.stop()
    med = {mode: statistics.median(t) for mode, t in times.items()}
    out = {
        "rows": rows, "median_s": med, "observe_df_s": observe_only,
        "sync_ratio": med["sync"] / med["off"], "async_ratio": med["async"] / med["off"],
        "times": times,
    }
    print(f"sampling overhead: sync {out['sync_ratio']:.3f}x, async {out['async_ratio']:.3f}x "
          f"(no sampling {med['off']:.2f} s; observe_df alone {observe_only:.2f} s)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5-minute stream instead of 20")
    parser.add_argument("--only", choices=("table9", "quality", "overhead"), action="append",
                        help="run only these parts (repeatable); the others keep their figures")
    args = parser.parse_args()
    parts = set(args.only or ("table9", "quality", "overhead"))
    minutes = 5 if args.quick else 20
    previous = RESULTS / "adaptive.json"
    payload: dict[str, Any] = {}
    if args.only and previous.exists():
        payload = {k: v for k, v in json.loads(previous.read_text()).items()
                   if k in ("table9", "decision_quality", "sampling_overhead")}
    if "table9" in parts:
        payload["table9"] = {
            "partitions": N, "rate": RATE, "minutes": minutes, "sample_rate": 0.01,
            "change_factor": CHANGE_FACTOR, "speeds_per_min": list(SPEEDS),
            "configs": table9(minutes), "paper": PAPER_TABLE9,
        }
    if "quality" in parts:
        payload["decision_quality"] = decision_quality()
    if "overhead" in parts:
        payload["sampling_overhead"] = sampling_overhead()
    print(write_json("adaptive", payload))


if __name__ == "__main__":
    main()
