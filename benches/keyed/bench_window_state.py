"""The task-side cost of KeyedWindowAggregate's open windows per batch, for two checkouts.

One partition's work per micro-batch, without Spark: a ``KeyedRuntime`` resumes from the
decoded state, processes the batch (lateness, the window hooks, emission), and its state is
encoded and decoded again, as a task of ``keyed_foreach_batch`` does with the touched keys'
state. 12 batches per size (the first 2 are left out), event time moving 100 s a batch,
10 s delay, 300 s windows, keys at random; the median per batch is reported for each phase.

With ``--trees OLD NEW`` the same measurement runs once per checkout (each in its own
interpreter with ``PYTHONPATH`` at the tree), so a change to the window state is measured
beside the code it replaces, in one run, and the ratio OLD / NEW is reported. Usage::

    git worktree add /tmp/before <commit>
    python -m benches.keyed.bench_window_state --trees /tmp/before .

writes ``benches/results/window_state.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SIZES = ((5_000, 5_000), (20_000, 20_000), (100_000, 50_000))  # (rows a batch, keys)


def measure(rows: int, keys: int, batches: int = 12) -> dict[str, float]:
    """Median milliseconds per batch of the runtime with its hooks, the encode and the
    decode, at ``rows`` rows a batch over ``keys`` keys."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import types as T

    import trilink_spark as tl
    from trilink_spark.keyed.durable.codec import decode_state, encode_state
    from trilink_spark.keyed.semantics.process import EVENT_TIME_COL, KeyedRuntime

    schema = T.StructType([T.StructField("k", T.LongType()),
                           T.StructField("t", T.DoubleType()),
                           T.StructField("v", T.DoubleType())])
    agg = tl.KeyedWindowAggregate(300.0, value="v", aggs=("count", "sum"))
    agg.bind(schema, "k", "t", "fractional")
    rng = np.random.default_rng(0)
    state, clock = None, 0.0
    phases: dict[str, list[float]] = {"process_ms": [], "encode_ms": [], "decode_ms": []}
    open_windows = 0
    for b in range(batches):
        frame = pd.DataFrame({"k": rng.integers(0, keys, rows),
                              "t": clock + rng.random(rows) * 100, "v": rng.random(rows)})
        frame[EVENT_TIME_COL] = frame["t"]
        clock += 100
        a = time.perf_counter()
        rt = KeyedRuntime(agg, "k", 10.0, math.inf, state=state)
        list(rt.process(frame))
        c = time.perf_counter()
        table = encode_state(rt.snapshot(), pa.int64())
        d = time.perf_counter()
        state = decode_state(table)
        e = time.perf_counter()
        open_windows = agg.open_windows(rt)
        if b >= 2:
            phases["process_ms"].append((c - a) * 1e3)
            phases["encode_ms"].append((d - c) * 1e3)
            phases["decode_ms"].append((e - d) * 1e3)
    out = {k: statistics.median(v) for k, v in phases.items()}
    out["total_ms"] = sum(out.values())
    out["open_windows"] = float(open_windows)
    return out


def one_tree() -> None:
    """The measurement at every size, as JSON on stdout (run inside one checkout)."""
    import trilink_spark

    print(json.dumps([{"rows": r, "keys": k, "package": trilink_spark.__file__,
                       **measure(r, k)} for r, k in SIZES]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs=2, metavar=("OLD", "NEW"),
                        help="two checkouts to measure in one run (default: this one only)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_tree()
        return
    trees = args.trees or [str(Path(__file__).resolve().parents[2])]
    found: dict[str, Any] = {}
    # each tree's own trilink_spark (PYTHONPATH comes before an installed copy)
    for tree in trees:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one"], env=env,
                              check=True, capture_output=True, text=True)
        found[os.path.abspath(tree)] = json.loads(done.stdout.strip().splitlines()[-1])
    names = list(found)
    for i, (rows, keys) in enumerate(SIZES):
        line = f"{rows:>7,} rows {keys:>6,} keys"
        for name in names:
            line += f" | {os.path.basename(name) or name}: {found[name][i]['total_ms']:.1f} ms"
        if len(names) == 2:
            old, new = (found[n][i]["total_ms"] for n in names)
            line += f" | old / new {old / new:.2f}"
        print(line)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from common import write_json

    print(write_json("window_state", {"argv": sys.argv[1:], "trees": found}))


if __name__ == "__main__":
    main()
