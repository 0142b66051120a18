"""Incremental snapshots against whole-partition snapshots, at three state sizes.

One partition's executor-local copy (:class:`trilink_spark.state.local.LocalState`) is loaded
with K keys (``--keys``, default 25,000, 250,000 and 2,500,000: one partition's share of
100,000, 1M and 10M keys over 4 partitions), each a row of the shape a windowed count and sum
keeps (``key`` string, ``count`` long, ``sum`` double), written in load chunks of 500,000 and
compacted. Then ``--rounds`` rounds: each changes ``--changed`` keys (default 5,000: a
20,000-row batch over 4 partitions; a tenth of them new) and takes a snapshot.

Measured, per snapshot, in the same run:

- **ours** (incremental, :func:`trilink_spark.state.incremental.upload` through the writer
  :func:`~trilink_spark.keyed.durable.snapshot_writer.write_snapshot`): the seconds from the
  checkpoint to the record written, the bytes uploaded and the bytes shared with the snapshot
  before (referred to, not written);
- **the baseline it replaces** (the whole partition as one Arrow state file, the format of
  the snapshots before, :meth:`~trilink_spark.state.KeyedStateStore.save_table`): the
  seconds to write the same state as a table, and its bytes. The table is read from our
  snapshot first (not timed), so the baseline's time leaves out the row decoding the earlier
  writer also paid: it is a lower bound of what it cost.

Also: the seconds of a restore from our snapshot (download, size and SHA-256 checks,
RocksDB open) against reading the Arrow snapshot back.

Run from the repository root: ``.venv/bin/python -m benches.state.bench_snapshots`` (writes
``benches/results/snapshots.json``, or ``--out NAME``). Options: ``--keys
25000,250000,2500000 --changed 5000 --rounds 4 --work-dir DIR``; ``--quick`` is K = 25,000
and 100,000, two rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from trilink_spark.keyed.durable.snapshot_writer import write_snapshot
from trilink_spark.state import KeyedStateStore
from trilink_spark.state.incremental import download, load_tables_table, stamp_checkpoint
from trilink_spark.state.local import LocalState, head
from trilink_spark.state.rows import encode_rows

RESULTS = Path(__file__).resolve().parents[1] / "results"
SCHEMA = pa.schema([("key", pa.string()), ("count", pa.int64()), ("sum", pa.float64())])
LOAD_CHUNK = 500_000


def rows(keys: np.ndarray, rng: np.random.Generator) -> list[tuple[bytes, bytes]]:
    """The local rows of ``keys`` (string keys ``k0000001`` style) with random figures."""
    names = [f"k{int(i):08d}" for i in keys]
    table = pa.table({"key": names, "count": rng.integers(1, 100, len(names)),
                      "sum": rng.random(len(names))}, schema=SCHEMA)
    return [(n.encode(), b) for n, b in zip(names, encode_rows(table))]


def apply(local: LocalState, version: int, keyed: list[tuple[bytes, bytes]]) -> None:
    sid = local.register(SCHEMA)
    puts = [(k, head(float("inf"), sid) + body) for k, body in keyed]
    before = dict(zip([k for k, _ in puts], local.get([k for k, _ in puts])))
    local.apply(version, f"a{version}", {}, puts, [], before)


def take(local: LocalState, store: KeyedStateStore, version: int) -> dict[str, Any]:
    directory = tempfile.mkdtemp(dir=os.path.dirname(local.directory))
    os.rmdir(directory)
    start = time.perf_counter()
    local.checkpoint(directory)
    stamp_checkpoint(local.directory, directory)
    stats = write_snapshot(directory, store, 0, version, {})
    seconds = time.perf_counter() - start
    if stats is None:
        raise RuntimeError(f"snapshot {version} was there already")
    return {"version": version, "seconds": seconds, **stats}


def one_size(keys: int, changed: int, rounds: int, work: Path, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    root = work / f"k{keys}"
    shutil.rmtree(root, ignore_errors=True)
    store = KeyedStateStore(str(root / "state"))
    baseline = KeyedStateStore(str(root / "arrow"))
    out: dict[str, Any] = {"keys": keys, "changed_per_round": changed, "snapshots": []}
    with LocalState.open(str(root / "local"), "bench", 0) as local:
        start = time.perf_counter()
        order = rng.permutation(keys)
        for lo in range(0, keys, LOAD_CHUNK):
            apply(local, 0, rows(order[lo:lo + LOAD_CHUNK], rng))
        out["load_seconds"] = time.perf_counter() - start
        out["settle_seconds"] = local.settle(timeout=600.0)
        version, total = 0, keys
        for r in range(rounds + 1):
            if r:
                fresh = max(1, changed // 10)
                old = rng.choice(total, changed - fresh, replace=False)
                new = np.arange(total, total + fresh)
                total += fresh
                version += 1
                apply(local, version, rows(np.concatenate([old, new]), rng))
                local.settle(timeout=600.0)
            ours = take(local, store, version)
            start = time.perf_counter()
            table = load_tables_table(store, 0, version)
            arrow_bytes = baseline.save_table(0, version, table)
            ours["arrow_seconds"] = time.perf_counter() - start
            ours["arrow_bytes"] = arrow_bytes
            ours["keys"] = table.num_rows
            out["snapshots"].append(ours)
            print(f"K={keys:,} snapshot {version}: ours {ours['seconds']:.2f} s, "
                  f"{ours['uploaded'] / 2**20:.1f} MB uploaded, {ours['shared'] / 2**20:.1f} MB "
                  f"shared | whole Arrow {ours['arrow_seconds']:.2f} s, "
                  f"{arrow_bytes / 2**20:.1f} MB", flush=True)
        target = str(root / "restored")
        start = time.perf_counter()
        download(store, 0, version, target)
        with LocalState.open(str(root / "other"), "bench", 0) as other:
            other.restore(target)
            restored_keys = other.keys
        out["restore_seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        baseline.load_snapshot(0, version)
        out["arrow_read_seconds"] = time.perf_counter() - start
        out["restored_keys"] = restored_keys
    later = out["snapshots"][1:]
    if later:
        out["median_uploaded_bytes_after_first"] = statistics.median(s["uploaded"] for s in later)
        out["median_arrow_bytes"] = statistics.median(s["arrow_bytes"] for s in later)
        out["bytes_ratio"] = out["median_uploaded_bytes_after_first"] / out["median_arrow_bytes"]
        out["median_seconds_after_first"] = statistics.median(s["seconds"] for s in later)
        out["median_arrow_seconds"] = statistics.median(s["arrow_seconds"] for s in later)
        out["seconds_ratio"] = out["median_seconds_after_first"] / out["median_arrow_seconds"]
    shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", default="25000,250000,2500000")
    parser.add_argument("--changed", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default="snapshots")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    sizes = [25_000, 100_000] if args.quick else [int(k) for k in args.keys.split(",")]
    rounds = 2 if args.quick else args.rounds
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-snapshots-"))
    result = {"command": "python -m benches.state.bench_snapshots" + (" --quick" if args.quick
                                                                       else ""),
              "sizes": [one_size(k, args.changed, rounds, work, seed=k) for k in sizes]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1))
    for size in result["sizes"]:
        if "bytes_ratio" in size:
            print(f"K={size['keys']:,}: after the first, ours uploads "
                  f"{size['bytes_ratio']:.4f}x the whole snapshot's bytes in "
                  f"{size['seconds_ratio']:.3f}x its time; restore {size['restore_seconds']:.2f} s "
                  f"(Arrow read {size['arrow_read_seconds']:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
