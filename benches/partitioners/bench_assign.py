"""Vectorised ``assign`` throughput (keys/s) per strategy, beside Python's per-key loop.

Target (issue 2): >= 2,000,000 keys/s. Table strategies are measured on keys they already
know (the hot path); their first-time placement (``fit``) is reported separately.

Run: ``python benches/partitioners/bench_assign.py`` (writes benches/results/assign.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import median_time, write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402
from trilink_spark.partitioners import kafka_murmur2  # noqa: E402
from trilink_spark.partitioners.choosing.scenarios import make_scenario, records  # noqa: E402

N = 60
SIZE = 1_000_000


def main() -> dict:
    sc = make_scenario("skewed_records", SIZE, 100_000, seed=0)
    ints = records(sc, seed=0)
    strs = pa.array([f"user-{k}" for k in ints.tolist()])
    results = {}
    for label, keys in (("int", ints), ("string", strs)):
        strategies = {
            "hash": tl.HashPartitioner(N),
            "weight_hash": tl.WeightPartitioner([100 / N] * N),
            "least_key": tl.LeastKeyPartitioner(N).fit(keys),
            "least_count": tl.LeastCountPartitioner(N).fit(keys),
            "weight_random": tl.WeightPartitioner([100 / N] * N, mode="random").fit(keys),
        }
        if label == "int":
            strategies["modulo"] = tl.ModuloPartitioner(N)
        for name, p in strategies.items():
            seconds = median_time(lambda: p.assign(keys), repeat=5)
            sample = keys[:20_000] if label == "int" else keys.slice(0, 20_000).to_pylist()
            loop = median_time(lambda: [p.partition(k) for k in sample], repeat=3)
            rate = SIZE / seconds
            results[f"{name}/{label}"] = {
                "keys_per_s": rate,
                "per_key_loop_keys_per_s": 20_000 / loop,
                "speedup_vs_loop": rate / (20_000 / loop),
            }
            print(f"{name:14s} {label:6s} {rate / 1e6:6.2f} M keys/s  (loop {20_000 / loop / 1e6:5.2f} M/s)")
    fit = {}
    for name, cls in (("least_key", tl.LeastKeyPartitioner), ("least_count", tl.LeastCountPartitioner)):
        seconds = median_time(lambda: cls(N).fit(sc.as_mapping()), repeat=3, warmup=0)
        fit[name] = {"new_keys_per_s": len(sc.as_mapping()) / seconds}
        print(f"fit {name}: {fit[name]['new_keys_per_s'] / 1e6:.2f} M new keys/s")
    # long keys among short ones: Spark's hash and Kafka's murmur2 stay linear in the bytes
    # (a key of 1 MB once cost a numpy pass per 4-byte block of it)
    long_keys = strs.to_pylist()
    for i, size in enumerate((1 << 20, 1 << 16, 4096, 1024, 300)):
        long_keys[i * 1000] = "L" * size
    long_arr = pa.array(long_keys)
    hash_long = tl.HashPartitioner(N)
    seconds = median_time(lambda: hash_long.assign(long_arr), repeat=5)
    plain_s = median_time(lambda: hash_long.assign(strs), repeat=5)
    encoded = [k.encode() for k in long_keys[:100_000]]
    murmur_s = median_time(lambda: kafka_murmur2(encoded), repeat=3)
    results["hash/string_with_long_keys"] = {
        "keys_per_s": SIZE / seconds, "vs_short_keys_only": plain_s / seconds,
        "kafka_murmur2_keys_per_s": 100_000 / murmur_s,
        "long_key_bytes": [1 << 20, 1 << 16, 4096, 1024, 300]}
    print(f"hash, 5 long keys (300 B-1 MB) among 1M: {SIZE / seconds / 1e6:.2f} M keys/s "
          f"({plain_s / seconds:.2f}x the short keys alone); kafka_murmur2 "
          f"{100_000 / murmur_s / 1e6:.2f} M keys/s")
    stream_s = median_time(lambda: tl.LeastCountPartitioner(N).fit(ints), repeat=3, warmup=0)
    fit["least_count_stream"] = {"records_per_s": SIZE / stream_s}
    print(f"fit least_count over the record stream: {SIZE / stream_s / 1e6:.2f} M records/s")
    payload = {"partitions": N, "keys": SIZE, "assign": results, "fit": fit,
               "target_keys_per_s": 2_000_000, "command": "python benches/partitioners/bench_assign.py"}
    write_json("assign", payload)
    return payload


if __name__ == "__main__":
    main()
