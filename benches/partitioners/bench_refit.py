"""Minimal-move rebalancing: balance reached and keys moved, against a fresh fit and pmod(hash, n).

1. 400 Zipf keys (s = 0.8, keyed bound ~1.0) on 8 partitions placed by Spark's hash:
   ``rebalance_minimal`` to 0.97 against a fresh LeastCount fit (history = the counts), ten seeds.
2. The same with s = 1.2 (keyed bound ~0.44): how close to the bound, and at what cost in moves.
3. Rescales 4->5, 8->6 and 60->61 over 100,000 keys with log-normal record counts: share of keys
   (and of records) that change partition with ``pmod(hash, n)``, with 4096 blocks and the range
   table, and with 4096 blocks and a minimal refit, against the lower bound
   ``|n' - n| / max(n, n')``.
4. Time of ``rebalance_minimal`` at 10^3, 10^4 and 10^5 units on 8 partitions: blocks with
   log-normal loads from a random table (balancing, and a rescale to 9 that fills the new
   partition), and keys from hash (that path also hashes the keys
   and builds the LeastCount table), beside a fresh LeastCount fit of the same keys.

Run: ``python benches/partitioners/bench_refit.py`` (writes benches/results/refit.json).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import median_time, write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402
from trilink_spark.partitioners import balance_degree, keyed_bound  # noqa: E402
from trilink_spark.partitioners import BlockPartitioner, moved_units, rebalance_minimal  # noqa: E402
from trilink_spark.partitioners.choosing.scenarios import make_scenario  # noqa: E402

SEEDS = range(10)
TARGET = 0.97
SCALING_PARTITIONS = 8


def _loads(p: tl.Partitioner, keys: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.bincount(p.assign(keys), weights=w, minlength=p.num_partitions)


def zipf_from_hash(s: float) -> dict:
    rows = []
    for seed in SEEDS:
        sc = make_scenario("zipf", 1_000_000, 400, zipf_s=s, seed=seed)
        counts = sc.as_mapping()
        keys, w = sc.keys, sc.counts.astype(np.float64)
        start = tl.HashPartitioner(8)
        t0 = time.perf_counter()
        minimal = rebalance_minimal(start, counts, target_balance=TARGET)
        t_min = time.perf_counter() - t0
        t0 = time.perf_counter()
        fresh = tl.LeastCountPartitioner(8, history=counts)
        t_fresh = time.perf_counter() - t0
        rows.append({
            "seed": seed,
            "keyed_bound": keyed_bound(w, 8),
            "hash_balance": balance_degree(_loads(start, keys, w)),
            "minimal_balance": balance_degree(_loads(minimal, keys, w)),
            "fresh_balance": balance_degree(_loads(fresh, keys, w)),
            "minimal_moved_keys": float(moved_units(start, minimal, keys).mean()),
            "fresh_moved_keys": float(moved_units(start, fresh, keys).mean()),
            "minimal_moved_records": float(w[moved_units(start, minimal, keys)].sum() / w.sum()),
            "fresh_moved_records": float(w[moved_units(start, fresh, keys)].sum() / w.sum()),
            "minimal_seconds": t_min,
            "fresh_seconds": t_fresh,
        })
    summary = {}
    for field in rows[0]:
        if field == "seed":
            continue
        values = np.array([r[field] for r in rows])
        summary[field] = {"mean": float(values.mean()), "min": float(values.min()),
                          "max": float(values.max())}
    summary["moved_ratio_fresh_over_minimal"] = (
        summary["fresh_moved_keys"]["mean"] / summary["minimal_moved_keys"]["mean"])
    print(f"zipf s={s}: bound {summary['keyed_bound']['mean']:.3f}, hash "
          f"{summary['hash_balance']['mean']:.3f} -> minimal "
          f"{summary['minimal_balance']['mean']:.3f} (min {summary['minimal_balance']['min']:.3f})"
          f" moving {summary['minimal_moved_keys']['mean']:.1%} of keys "
          f"(max {summary['minimal_moved_keys']['max']:.1%}); fresh LeastCount "
          f"{summary['fresh_balance']['mean']:.3f} moving "
          f"{summary['fresh_moved_keys']['mean']:.1%} "
          f"(x{summary['moved_ratio_fresh_over_minimal']:.1f})")
    return {"zipf_s": s, "keys": 400, "partitions": 8, "target": TARGET, "summary": summary,
            "seeds": rows}


def rescales() -> dict:
    sc = make_scenario("skewed_records", 10_000_000, 100_000, seed=0)
    keep = sc.counts > 0
    keys, w = sc.keys[keep], sc.counts[keep].astype(np.float64)
    counts = dict(zip(keys.tolist(), w.tolist()))
    out = {}
    for n_old, n_new in ((4, 5), (8, 6), (60, 61)):
        bound = abs(n_new - n_old) / max(n_old, n_new)
        h_old, h_new = tl.HashPartitioner(n_old), tl.HashPartitioner(n_new)
        r_old, r_new = BlockPartitioner(n_old), BlockPartitioner(n_new)
        b_old = rebalance_minimal(r_old, counts, target_balance=TARGET)  # steady state at n
        t0 = time.perf_counter()
        b_new = rebalance_minimal(b_old, counts, num_partitions=n_new, target_balance=TARGET)
        seconds = time.perf_counter() - t0
        entry = {"lower_bound": bound, "refit_seconds": seconds}
        for name, before, after in (("pmod_hash", h_old, h_new),
                                    ("blocks_range_table", r_old, r_new),
                                    ("blocks_minimal_refit", b_old, b_new)):
            moved = moved_units(before, after, keys)
            entry[name] = {
                "moved_keys": float(moved.mean()),
                "moved_records": float(w[moved].sum() / w.sum()),
                "balance_before": balance_degree(_loads(before, keys, w)),
                "balance_after": balance_degree(_loads(after, keys, w)),
            }
        entry["blocks_minimal_refit"]["moved_blocks"] = float(moved_units(b_old, b_new).mean())
        entry["ratio_hash_over_minimal"] = (entry["pmod_hash"]["moved_keys"]
                                            / entry["blocks_minimal_refit"]["moved_keys"])
        entry["ratio_minimal_over_bound"] = entry["blocks_minimal_refit"]["moved_keys"] / bound
        out[f"{n_old}->{n_new}"] = entry
        print(f"rescale {n_old}->{n_new}: bound {bound:.1%}; keys moved: pmod(hash) "
              f"{entry['pmod_hash']['moved_keys']:.1%}, range blocks "
              f"{entry['blocks_range_table']['moved_keys']:.1%}, minimal blocks "
              f"{entry['blocks_minimal_refit']['moved_keys']:.1%} (balance "
              f"{entry['blocks_minimal_refit']['balance_after']:.3f}, range "
              f"{entry['blocks_range_table']['balance_after']:.3f}, hash "
              f"{entry['pmod_hash']['balance_after']:.3f}); {seconds * 1000:.0f} ms")
    return {"keys": int(keys.size), "records": int(w.sum()), "blocks": 4096,
            "scenario": "skewed_records (log-normal sigma 1.5)", "target": TARGET, "cases": out}


def scaling() -> dict:
    out = {}
    for units in (1_000, 10_000, 100_000):
        rng = np.random.default_rng(0)
        w = rng.lognormal(0.0, 1.5, units)
        start = BlockPartitioner(SCALING_PARTITIONS, units,
                                 rng.integers(0, SCALING_PARTITIONS, units))
        seconds = median_time(lambda: rebalance_minimal(start, w, unit="block"), repeat=5)
        result = rebalance_minimal(start, w, unit="block")
        grow = SCALING_PARTITIONS + 1  # a rescale: the new partition is filled from the others
        grow_seconds = median_time(
            lambda: rebalance_minimal(start, w, num_partitions=grow, unit="block"), repeat=5)
        grown = rebalance_minimal(start, w, num_partitions=grow, unit="block")
        sc = make_scenario("skewed_records", 10 * units, units, seed=0)
        counts = sc.as_mapping()
        hash_start = tl.HashPartitioner(SCALING_PARTITIONS)
        key_seconds = median_time(lambda: rebalance_minimal(hash_start, counts), repeat=3)
        fresh_seconds = median_time(
            lambda: tl.LeastCountPartitioner(SCALING_PARTITIONS, history=counts), repeat=3)
        out[str(units)] = {
            "block_units_seconds": seconds,
            "block_units_us_per_unit_log_unit": seconds / (units * math.log2(units)) * 1e6,
            "blocks_moved": int(moved_units(start, result).sum()),
            "balance_before": balance_degree(np.bincount(start.table, w, SCALING_PARTITIONS)),
            "balance_after": balance_degree(np.bincount(result.table, w, SCALING_PARTITIONS)),
            "rescale_seconds": grow_seconds,
            "rescale_us_per_unit_log_unit": grow_seconds / (units * math.log2(units)) * 1e6,
            "rescale_blocks_moved": int(moved_units(start, grown.with_table(grown.table)).sum()),
            "rescale_balance_after": balance_degree(np.bincount(grown.table, w, grow)),
            "keys_from_hash": len(counts),
            "keys_from_hash_seconds": key_seconds,
            "fresh_least_count_seconds": fresh_seconds,
        }
        print(f"{units:>7} units: blocks {seconds * 1000:7.1f} ms "
              f"({out[str(units)]['block_units_us_per_unit_log_unit']:.3f} us per u log2 u, "
              f"{out[str(units)]['blocks_moved']} moved); rescale to {grow}: "
              f"{grow_seconds * 1000:7.1f} ms ({out[str(units)]['rescale_blocks_moved']} moved, "
              f"{out[str(units)]['rescale_us_per_unit_log_unit']:.3f} us per u log2 u); "
              f"{len(counts)} keys from hash "
              f"{key_seconds * 1000:7.1f} ms (fresh LeastCount fit {fresh_seconds * 1000:.1f} ms)")
    return {"partitions": SCALING_PARTITIONS, "sizes": out}


def main() -> dict:
    payload = {
        "zipf_08": zipf_from_hash(0.8),
        "zipf_12": zipf_from_hash(1.2),
        "rescale": rescales(),
        "scaling": scaling(),
        "command": "python benches/partitioners/bench_refit.py",
    }
    write_json("refit", payload)
    return payload


if __name__ == "__main__":
    main()
