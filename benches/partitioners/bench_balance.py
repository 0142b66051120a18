"""Seed 002 Figure 15 and Table 3: balance degree of every strategy, parallelism 60, 1M records.

Hash is Spark's placement, exact (the tests prove ``HashPartitioner`` equals Spark's own
``hash()``). Beside it, for Table 3, the paper's own baseline: Flink's keyBy, emulated with
Flink's ``MathUtils.murmurHash`` and key groups (max parallelism 128 for parallelism 60).

Run: ``python benches/partitioners/bench_balance.py`` (writes benches/results/balance.json and balance.png).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import RESULTS, write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402
from trilink_spark.partitioners import balance_degree, choose_best  # noqa: E402
from trilink_spark.partitioners import extra_compute_time  # noqa: E402
from trilink_spark.partitioners.choosing.scenarios import PAPER_SCENARIOS, make_scenario, records  # noqa: E402

N = 60
RECORDS = 1_000_000
PAPER_FIG15 = {  # Trilink §6.4.1 text (Figure 15)
    "hash_min": 0.26,
    "modulo": {"uniform": 1.0, "skewed_keys": 0.66, "skewed_records": 0.41, "skewed_both": 0.24},
    "least_count_history_min_in_3_scenarios": 0.97,
}


def flink_keyby(keys: np.ndarray, parallelism: int, max_parallelism: int = 128) -> np.ndarray:
    """Flink's subtask for Long keys: murmurHash(Long.hashCode) % maxP * p // maxP."""
    u = np.uint32
    v = keys.astype(np.int64)
    code = ((v ^ (v >> 32)) & 0xFFFFFFFF).astype(np.uint32)
    code = code * u(0xCC9E2D51)
    code = (code << u(15)) | (code >> u(17))
    code = code * u(0x1B873593)
    code = (code << u(13)) | (code >> u(19))
    code = code * u(5) + u(0xE6546B64)
    code ^= u(4)
    code ^= code >> u(16)
    code *= u(0x85EBCA6B)
    code ^= code >> u(13)
    code *= u(0xC2B2AE35)
    code ^= code >> u(16)
    signed = code.view(np.int32).astype(np.int64)
    positive = np.where(signed >= 0, signed, np.where(signed == -(2**31), 0, -signed))
    key_group = positive % max_parallelism
    return (key_group * parallelism // max_parallelism).astype(np.int32)


def main() -> dict:
    scenarios = {}
    for name in PAPER_SCENARIOS:
        sc = make_scenario(name, RECORDS, 10_000, seed=0)
        stream = records(sc, seed=0)
        scores = tl.evaluate_strategies(stream, N)
        flink = np.bincount(flink_keyby(sc.keys, N), weights=sc.counts, minlength=N)
        entry = {s.name: s.to_dict(with_loads=False) for s in scores}
        entry["flink_keyby"] = {
            "balance_degree": balance_degree(flink),
            "extra_compute_time": extra_compute_time(flink),
        }
        entry["keyed_bound"] = scores[0].keyed_bound
        entry["best"] = choose_best(scores).name
        entry["distinct_keys"] = int((sc.counts > 0).sum())
        entry["loads"] = {s.name: s.loads.tolist() for s in scores}
        scenarios[name] = entry
        print(f"{name:15s} bound={entry['keyed_bound']:.3f} " + " ".join(
            f"{s.name}={s.balance_degree:.3f}" for s in scores
        ) + f" flink={entry['flink_keyby']['balance_degree']:.3f}")

    auto = make_scenario("autoincrement", RECORDS)
    spark_hash = np.bincount(tl.HashPartitioner(N).assign(auto.keys), minlength=N)
    flink = np.bincount(flink_keyby(auto.keys, N), minlength=N)
    share = lambda loads: (loads / loads.sum() * 100)  # noqa: E731
    bins = [1.27, 1.57, 1.87, 2.17, 2.47, 2.77]
    table3 = {}
    for label, loads in (("spark_hash", spark_hash), ("flink_keyby", flink)):
        pct = share(loads)
        hist = np.histogram(np.clip(pct, bins[0], bins[-1]), bins=bins)[0].tolist()
        table3[label] = {
            "balance_degree": balance_degree(loads),
            "max_over_min_extra": float(loads.max() / loads.min() - 1),
            "extra_compute_time": extra_compute_time(loads),
            "min_pct": float(pct.min()),
            "max_pct": float(pct.max()),
            "subtasks_per_load_bin": hist,
        }
        print(f"table3 {label}: balance={table3[label]['balance_degree']:.3f} "
              f"max/min-1={table3[label]['max_over_min_extra']:.1%} bins={hist}")
    table3["paper"] = {
        "max_over_min_extra": 1.11,
        "extra_compute_time": 0.608,
        "subtasks_per_load_bin": [33, 19, 0, 4, 4],
        "balance_degree_all_distinct_fig7": 0.47,
    }
    payload = {
        "partitions": N,
        "records": RECORDS,
        "scenarios": scenarios,
        "table3_autoincrement": table3,
        "paper_fig15": PAPER_FIG15,
        "command": "python benches/partitioners/bench_balance.py",
    }
    write_json("balance", payload)
    _plot(scenarios)
    return payload


def _plot(scenarios: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = ["flink_keyby", "hash", "modulo", "least_key", "least_count_no_history", "least_count"]
    labels = ["Flink keyBy\n(emulated)", "Spark hash", "Modulo", "LeastKey", "LeastCount\nno history", "LeastCount\nhistory"]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        vals = [scenarios[s][name]["balance_degree"] for s in PAPER_SCENARIOS]
        ax.bar(np.arange(4) + i * width, vals, width, label=labels[i].replace("\n", " "))
    bounds = [scenarios[s]["keyed_bound"] for s in PAPER_SCENARIOS]
    ax.scatter(np.arange(4) + 0.4 - width / 2, bounds, marker="_", s=900, color="black", label="keyed bound", zorder=3)
    ax.set_xticks(np.arange(4) + 0.4 - width / 2)
    ax.set_xticklabels(["keys uniform\nrecords uniform", "keys skewed\nrecords uniform", "keys uniform\nrecords skewed", "keys skewed\nrecords skewed"])
    ax.set_ylabel("balance degree (min/max)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    ax.set_title("Balance degree per strategy, 1,000,000 records, 60 partitions (cf. Trilink Figure 15)", fontsize=9)
    fig.tight_layout()
    fig.savefig(RESULTS / "balance.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
