"""Keyed state that scales with the key count, against Spark's own streaming aggregation.

At each key count K (``--keys``, default 10,000, 1,000,000 and 10,000,000) the same Parquet
files feed every query, one file per micro-batch (each file is moved into the query's source
directory, ``maxFilesPerTrigger=1``, and the query drained with ``processAllAvailable``):

- load: ``ceil(K / --load-chunk)`` files that together give each of the K keys exactly one
  row, so every key has state (the keys in a random order);
- steady: ``--batches`` files of ``--rows`` rows on ``--rows`` distinct keys drawn uniformly
  from the K keys (when ``--rows`` > K: every key once, the remaining rows on keys drawn with
  replacement, so a batch has ``--rows`` rows over all K keys; the JSON records the distinct
  keys per batch);
- two more steady-like files for the restarts of our queries.

Columns: ``k`` (string, ``k0000001`` style), ``t`` (double seconds, rising over all files from
0 to below 3,000, so no window of 3,600 s closes and only a batch's keys are touched) and ``v``
(double). Queries:

- ours, per store (``--stores``, default ``rocksdb``; ``files`` only at K <= ``--files-max-keys``):
  ``keyed_foreach_batch(sink, "k", "t", KeyedWindowAggregate(size=3600.0, value="v",
  aggs=("count", "sum")), delay=60.0, state_path=..., idle_timeout=math.inf,
  num_partitions=4)``, the sink writing to ``noop``. The Spark conf ``spark.trilink.state.store``
  (the store implementation: ``rocksdb`` the executor-local store, ``files`` the full-rewrite
  store) and ``spark.trilink.state.localDir`` (a fresh directory per query) are set with
  ``spark.conf.set`` before the query starts; a build that does not know them runs its only
  store whatever they say. After the steady batches: stop the query, restart it on the same
  checkpoint and state path, run one batch (warm restart); stop it, delete the local store
  directory, restart, run one batch (cold restart).
- Spark: ``groupBy("k").agg(count("*"), sum("v"))`` in update mode, sink a foreachBatch that
  writes to ``noop``, ``spark.sql.shuffle.partitions=4``; once with the RocksDB state store
  provider (changelog checkpointing on) and once with the default HDFS-backed provider, each
  on a fresh checkpoint (the provider is fixed at a query's first start). Skipped at K >
  ``--spark-max-keys``.

Measured, per query:

- batch seconds: the query's own ``durationMs.triggerExecution`` of each batch; the median is
  over the steady batches (the wall time around each ``processAllAvailable`` is in the JSON);
- bytes written per steady batch: ``os.walk`` snapshots of ``{file: (size, inode, mtime)}``
  of the state path (ours) or the checkpoint directory (Spark) before the first steady batch
  and after each one; a batch's bytes are the sizes of the files that are new since the
  previous snapshot or were rewritten (another inode or mtime, not larger), plus the growth of
  the files that grew in place. Each interval ends where the next begins, so what a background
  writer writes between batches is counted in the next batch.
- snapshots: after the load batches the bench waits until no snapshot writer process
  (``python -m trilink_spark.keyed.durable.snapshot_writer``, any on the machine) runs, so the snapshot the
  load asks for (part of building the state) is not in the steady window; the wait is in the
  JSON (``load_snapshot_drain_seconds``), as are the snapshot files the steady batches started
  (``steady_snapshot_files``), the wait for them before the restarts, the bytes of each
  partition's newest snapshot (``snapshot_bytes``) and the writers' peak RSS. A snapshot is due
  once the changelogs since the last one hold as many rows as there are keys, at least 10
  batches apart, so the amortised snapshot bytes per batch are ``snapshot_bytes / max(10,
  K / distinct keys per batch)``; Also reported: the directory's
  total size after the steady batches, our Spark checkpoint's bytes per batch and the local
  store directory's size;
- Python worker memory: a background thread reads ``/proc/<pid>/status`` every 50 ms for the
  descendants of this process whose command line holds ``pyspark.daemon`` or ``pyspark.worker``
  (another user's Spark on the same machine is not counted), during the load batches and,
  separately, during the steady batches. Reported: the largest ``VmRSS`` of one process and
  of all of them together, and the largest ``VmHWM`` (peak RSS) at the end of the steady
  batches; the peaks are reset (``/proc/<pid>/clear_refs`` = 5) when the steady batches begin,
  and the JSON says whether that worked. The JVM's largest ``VmRSS`` comes along. MB = 2**20
  bytes. Python workers are reused (PySpark's default; ``--worker-reuse false`` forks one per
  task, whose imports then cost about 1.5 s a task), so a worker's memory can hold what an
  earlier query or the load batches left;
- restart: the seconds (triggerExecution) of the first batch after the warm and after the
  cold restart.

Ratios (printed and in the JSON under ``ratios``): ours at the largest K / ours at the smallest
K, batch seconds (target <= 1.3 at 10M / 10k) and peak worker RSS (target <= 1.5); ours /
Spark RocksDB batch seconds at each K (target <= 1.0 at 1M); and bytes written per batch
against the changed keys' state: the mean and median bytes per batch beside ``distinct keys
per batch x state path total / K`` (the average stored bytes per key; the targets, <= 2x plus
an amortised snapshot, are for the reader to judge).

Run from the repository root: ``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python -m
benches.state.bench_state_scale`` (writes benches/results/state_scale.json, or ``--out
NAME``.json, after every query). Options: ``--keys 10000,1000000,10000000 --rows 20000
--batches 5 --load-chunk 1000000 --stores rocksdb[,files] --files-max-keys 1000000
--spark-max-keys N --driver-memory 8g --work-dir DIR``; ``--quick`` is K = 10,000 and 100,000
with 3 steady batches, Spark included (a smoke run). Input files, checkpoints and state go
under ``--work-dir`` (default: the system's temporary directory), one K at a time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # run as a script (benches/run_all.py, python benches/state/...)
    sys.path.insert(0, ROOT)

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import trilink_spark as tl  # noqa: E402
from benches.common import write_json  # noqa: E402

KEYS = (10_000, 1_000_000, 10_000_000)
QUICK_KEYS = (10_000, 100_000)
ROWS = 20_000
BATCHES = 5
QUICK_BATCHES = 3
LOAD_CHUNK = 1_000_000
FILES_MAX_KEYS = 1_000_000
RESTARTS = 2  # files after the steady ones: the warm and the cold restart of our queries
T_SPAN = 3000.0  # event times rise from 0 to below this over all files of a K
WINDOW = 3600.0
DELAY = 60.0
PARTITIONS = 4
POLL_S = 0.05
SCHEMA = "k string, t double, v double"
STORE_CONF = "spark.trilink.state.store"
LOCAL_DIR_CONF = "spark.trilink.state.localDir"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": None,  # unset: Spark's default, HDFSBackedStateStoreProvider
}
WORKER_MARKS = ("pyspark.daemon", "pyspark.worker")
SNAPSHOT_MARK = "trilink_spark.keyed.durable.snapshot_writer"  # the snapshot writer's command line
SNAPSHOT_INTERVAL = 10  # spark.trilink.state.snapshotInterval's default (the bench keeps it)
DRAIN_TIMEOUT_S = 1800.0
JVM_MARKS = ("org.apache.spark.deploy.SparkSubmit",)


# ------------------------------------------------------------------ input files
@dataclass
class Files:
    """The staged input of one K, in feeding order."""

    load: list[Path]
    steady: list[Path]
    restart: list[Path]
    distinct_keys_per_batch: int
    rows_per_batch: int


def key_names(ids: np.ndarray, width: int) -> pa.Array:
    """``k`` + the zero-padded id, vectorised in Arrow."""
    digits = pc.utf8_lpad(pa.array(ids, pa.int64()).cast(pa.string()), width, "0")
    return pc.binary_join_element_wise("k", digits, "")


def steady_ids(rng: np.random.Generator, keys: int, rows: int) -> np.ndarray:
    """``rows`` ids on ``min(rows, keys)`` distinct keys drawn uniformly."""
    if rows <= keys:
        return rng.choice(keys, rows, replace=False)
    extra = rng.integers(0, keys, rows - keys)
    return rng.permutation(np.concatenate([np.arange(keys), extra]))


def make_files(staging: Path, keys: int, rows: int, batches: int, chunk: int,
               seed: int = 0) -> Files:
    """Load files (every key once, ``chunk`` keys a file), steady files, restart files."""
    rng = np.random.default_rng(seed)
    staging.mkdir(parents=True)
    width = max(7, len(str(keys - 1)))
    order = rng.permutation(keys)
    loads = [order[lo:lo + chunk] for lo in range(0, keys, chunk)]
    steadies = [steady_ids(rng, keys, rows) for _ in range(batches + RESTARTS)]
    step = T_SPAN / (keys + rows * (batches + RESTARTS))
    offset = 0
    paths: list[Path] = []
    for i, ids in enumerate(loads + steadies):
        t = (offset + np.arange(len(ids), dtype=np.float64)) * step
        offset += len(ids)
        table = pa.table({"k": key_names(ids, width), "t": pa.array(t),
                          "v": pa.array(rng.random(len(ids)))})
        path = staging / f"part-{i:05d}.parquet"
        pq.write_table(table, path)
        paths.append(path)
    n = len(loads)
    return Files(paths[:n], paths[n:n + batches], paths[n + batches:],
                 distinct_keys_per_batch=min(rows, keys), rows_per_batch=rows)


class Feed:
    """Moves one staged file into the source directory per micro-batch (copied beside it
    first, then renamed in, so the source never lists a half-written file)."""

    def __init__(self, work: Path) -> None:
        self.src, self.incoming = work / "in", work / "incoming"
        self.src.mkdir(parents=True)
        self.incoming.mkdir(parents=True)

    def push(self, staged: Path) -> None:
        tmp = self.incoming / staged.name
        shutil.copyfile(staged, tmp)
        now = time.time()
        os.utime(tmp, (now, now))
        os.replace(tmp, self.src / staged.name)


def stream(spark: Any, src: Path) -> Any:
    return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
            .parquet(str(src)))


def noop_sink(df: Any, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


# ------------------------------------------------------------------ bytes on disk
Snapshot = dict[str, tuple[int, int, int]]


def snapshot(path: Path) -> Snapshot:
    """``{file: (size, inode, mtime_ns)}`` of every file under ``path``."""
    out: Snapshot = {}
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:  # removed while walking
                continue
            out[full] = (st.st_size, st.st_ino, st.st_mtime_ns)
    return out


def written_bytes(before: Snapshot, after: Snapshot) -> int:
    """New and rewritten files' sizes, plus the growth of files that grew in place."""
    total = 0
    for name, (size, ino, mtime) in after.items():
        old = before.get(name)
        if old is None:
            total += size
        elif size > old[0]:
            total += size - old[0] if ino == old[1] else size
        elif ino != old[1] or mtime != old[2]:
            total += size
    return total


def total_bytes(snap: Snapshot) -> int:
    return sum(size for size, _, _ in snap.values())


# ------------------------------------------------------------------ worker memory
def read_status(pid: int) -> dict[str, int]:
    """PPid, VmRSS and VmHWM (kB) of a process; empty if it is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("PPid", "VmRSS", "VmHWM"):
                    out[name] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def read_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


class MemoryMonitor:
    """Polls the RSS of this process's Python workers (and its JVM) in a background thread."""

    def __init__(self, reset_peaks: bool = False) -> None:
        self.root = os.getpid()
        self.reset_peaks = reset_peaks
        self.kind: dict[int, str] = {}  # pid -> "worker", "jvm" or "" (not ours)
        self.peak_worker_kb = 0
        self.peak_workers_total_kb = 0
        self.peak_jvm_kb = 0
        self.peak_snapshot_kb = 0
        self.hwm_kb: dict[int, int] = {}  # last VmHWM seen per worker
        self.samples = 0
        self.reset: dict[str, int] = {"tried": 0, "done": 0}
        self._first = True  # peaks are reset for the workers alive at the first poll only
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-monitor", daemon=True)

    def _ancestry_is_ours(self, pid: int) -> bool:
        seen = 0
        while pid > 1 and seen < 64:
            if pid == self.root:
                return True
            known = self.kind.get(pid)
            if known in ("worker", "jvm"):
                return True
            pid = read_status(pid).get("PPid", 0)
            seen += 1
        return False

    def _classify(self, pid: int) -> str:
        cmd = read_cmdline(pid)
        if not cmd:
            return ""
        if SNAPSHOT_MARK in cmd:
            kind = "snapshot"
        elif any(m in cmd for m in WORKER_MARKS):
            kind = "worker"
        elif any(m in cmd for m in JVM_MARKS):
            kind = "jvm"
        else:
            return ""
        return kind if self._ancestry_is_ours(read_status(pid).get("PPid", 0)) else ""

    def _clear_peak(self, pid: int) -> None:
        self.reset["tried"] += 1
        try:
            with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
                f.write("5")
            self.reset["done"] += 1
        except OSError:
            pass

    def poll(self) -> None:
        workers_kb = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if pid not in self.kind:
                self.kind[pid] = self._classify(pid)
                if self.kind[pid] == "worker" and self.reset_peaks and self._first:
                    self._clear_peak(pid)
            kind = self.kind[pid]
            if not kind:
                continue
            status = read_status(pid)
            rss = status.get("VmRSS", 0)
            if kind == "jvm":
                self.peak_jvm_kb = max(self.peak_jvm_kb, rss)
                continue
            if kind == "snapshot":
                self.peak_snapshot_kb = max(self.peak_snapshot_kb, rss)
                continue
            workers_kb += rss
            self.peak_worker_kb = max(self.peak_worker_kb, rss)
            if "VmHWM" in status:
                self.hwm_kb[pid] = status["VmHWM"]
        self.peak_workers_total_kb = max(self.peak_workers_total_kb, workers_kb)
        self.samples += 1
        self._first = False

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def __enter__(self) -> MemoryMonitor:
        self.poll()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()

    def report(self) -> dict[str, Any]:
        mb = 1024.0
        out: dict[str, Any] = {
            "peak_worker_rss_mb": self.peak_worker_kb / mb,
            "peak_workers_total_rss_mb": self.peak_workers_total_kb / mb,
            "worker_hwm_mb": max(self.hwm_kb.values(), default=0) / mb,
            "peak_jvm_rss_mb": self.peak_jvm_kb / mb,
            "peak_snapshot_writer_rss_mb": self.peak_snapshot_kb / mb,
            "workers_seen": sum(1 for k in self.kind.values() if k == "worker"),
            "samples": self.samples,
        }
        if self.reset_peaks:
            out["hwm_reset"] = dict(self.reset)
        return out


# ------------------------------------------------------------------ snapshots
def drain_snapshot_writers() -> float:
    """Wait until no snapshot writer process runs (any on this machine: run the bench on a
    quiet one); returns the seconds waited."""
    start = time.perf_counter()
    while any(SNAPSHOT_MARK in read_cmdline(int(e)) for e in os.listdir("/proc")
              if e.isdigit()):
        if time.perf_counter() - start > DRAIN_TIMEOUT_S:
            raise RuntimeError(f"snapshot writers still running after {DRAIN_TIMEOUT_S} s")
        time.sleep(0.2)
    return time.perf_counter() - start


def latest_snapshots(state: Path) -> dict[str, int]:
    """Each partition's newest snapshot and its bytes: a whole-partition ``.state`` file, or
    an incremental ``.tables`` record with the bytes of the table files it lists."""
    from trilink_spark.state import KeyedStateStore
    from trilink_spark.state.incremental import read_record, referenced_bytes

    out: dict[str, int] = {}
    store = None
    for part in sorted(state.glob("partition=*")):
        found = sorted([*part.glob("*.state"), *part.glob("*.tables")], key=lambda p: p.stem)
        if not found:
            continue
        newest = found[-1]
        if newest.suffix == ".tables":
            store = store or KeyedStateStore(str(state))
            record = read_record(store, int(part.name.split("=")[1]), int(newest.stem))
            out[str(newest)] = referenced_bytes(record) if record else 0
        else:
            out[str(newest)] = newest.stat().st_size
    return out


# ------------------------------------------------------------------ driving a query
@dataclass
class Driver:
    """Feeds one file per micro-batch and keeps each batch's progress."""

    query: Any
    feed: Feed
    seen: set[int] = field(default_factory=set)

    def step(self, staged: Path, label: str) -> dict[str, Any]:
        self.feed.push(staged)
        start, started_at = time.perf_counter(), time.time()
        self.query.processAllAvailable()
        wall = time.perf_counter() - start
        progress = self._new_progress()
        secs = progress["durationMs"]["triggerExecution"] / 1000.0
        print(f"    {label}: batch {progress['batchId']} {secs:.2f} s "
              f"({progress['numInputRows']} rows)", flush=True)
        return {"batch_id": int(progress["batchId"]), "seconds": secs, "wall_seconds": wall,
                "rows": int(progress["numInputRows"]),
                "add_batch_seconds": progress["durationMs"].get("addBatch", 0) / 1000.0,
                "duration_ms": dict(progress["durationMs"]),
                "started_at": started_at, "ended_at": started_at + wall,
                "state_operators": progress.get("stateOperators", [])}

    def _new_progress(self, timeout: float = 120.0) -> dict[str, Any]:
        """The progress of the batch that just ran (it is posted as the batch finishes)."""
        deadline = time.monotonic() + timeout
        while True:
            fresh = [p for p in self.query.recentProgress
                     if p["numInputRows"] and int(p["batchId"]) not in self.seen]
            if fresh:
                latest: dict[str, Any] = max(fresh, key=lambda p: int(p["batchId"]))
                self.seen.update(int(p["batchId"]) for p in fresh)
                return latest
            if time.monotonic() > deadline:
                raise RuntimeError("no progress posted for the batch")
            time.sleep(POLL_S)


def steady_phase(driver: Driver, files: list[Path], watched: dict[str, Path],
                 tasks: Callable[[], list[dict[str, Any]]] | None = None,
                 ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Snapshot]]:
    """The steady batches, with bytes written under each watched directory per batch, and
    what each task measured of its own work (``tasks``: ours only) to tell a slow batch's
    task time from the driver's and Spark's."""
    snaps = {name: snapshot(path) for name, path in watched.items()}
    batches: list[dict[str, Any]] = []
    with MemoryMonitor(reset_peaks=True) as monitor:
        for i, staged in enumerate(files):
            batch = driver.step(staged, f"steady {i}")
            for name, path in watched.items():
                after = snapshot(path)
                batch[f"{name}_bytes_written"] = written_bytes(snaps[name], after)
                snaps[name] = after
            if tasks is not None:
                batch["tasks"] = tasks()
            batches.append(batch)
    return batches, monitor.report(), snaps


def background_work(local: Path, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """RocksDB's own flushes and compactions in the local copies during each steady batch.

    Read from the ``EVENT_LOG_v1`` lines of each copy's ``LOG`` files (RocksDB's info log:
    ``compaction_finished`` and ``flush_finished`` events with their end time and duration),
    so that a slow batch can be told apart: its tasks' own work, or RocksDB's background
    threads sharing the cores with them. Per batch: the events that overlap it, their
    seconds inside it and the bytes they wrote.
    """
    spans: list[tuple[float, float, str, int, str]] = []
    for log in local.rglob("LOG*"):
        copy = log.parent.name  # p00002.db: partition 2's copy
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            at = line.find("EVENT_LOG_v1 ")
            if at < 0:
                continue
            try:
                event = json.loads(line[at + len("EVENT_LOG_v1 "):])
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "compaction_finished":
                took = event.get("compaction_time_micros", 0) / 1e6
                written = int(event.get("total_output_size", 0))
            elif kind == "flush_finished":
                took, written = 0.0, 0  # the flush's own time is in flush_started's job
            else:
                continue
            end = event.get("time_micros", 0) / 1e6
            spans.append((end - took, end, str(kind), written, copy))
    out = []
    for b in batches:
        lo, hi = b["started_at"], b["ended_at"]
        inside = [(max(s, lo), min(e, hi), w, copy) for s, e, kind, w, copy in spans
                  if s < hi and e > lo and kind == "compaction_finished"]
        by_copy: dict[str, float] = {}
        for s, e, _, copy in inside:
            by_copy[copy] = round(by_copy.get(copy, 0.0) + e - s, 3)
        out.append({"batch_id": b["batch_id"], "compactions": len(inside),
                    "compaction_seconds": round(sum(e - s for s, e, _, _ in inside), 3),
                    "compaction_bytes": sum(w for _, _, w, _ in inside),
                    "compaction_seconds_by_copy": dict(sorted(by_copy.items()))})
    return out


def summary(batches: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    secs = [b["seconds"] for b in batches]
    out: dict[str, Any] = {"median_batch_seconds": statistics.median(secs),
                           "steady_batch_seconds": secs,
                           "steady_wall_seconds": [b["wall_seconds"] for b in batches]}
    for name in names:
        written = [b[f"{name}_bytes_written"] for b in batches]
        out[f"{name}_bytes_per_batch"] = written
        out[f"{name}_bytes_per_batch_median"] = statistics.median(written)
        out[f"{name}_bytes_per_batch_mean"] = statistics.fmean(written)
    return out


def stop(query: Any) -> None:
    try:
        query.stop()
    except Exception as exc:  # reported, the run goes on to the next query
        print(f"    stop failed: {type(exc).__name__}: {exc}", flush=True)


# ------------------------------------------------------------------ the queries
def run_ours(spark: Any, files: Files, work: Path, store: str) -> dict[str, Any]:
    """Our keyed state with the store ``store``: load, steady, warm and cold restart."""
    state, ckpt, local = work / "state", work / "ckpt", work / "local"
    spark.conf.set(STORE_CONF, store)
    spark.conf.set(LOCAL_DIR_CONF, str(local))
    feed = Feed(work)

    runs: list[Any] = []

    def start() -> Any:
        agg = tl.KeyedWindowAggregate(size=WINDOW, value="v", aggs=("count", "sum"))
        run = tl.keyed_foreach_batch(noop_sink, "k", "t", agg, delay=DELAY,
                                     state_path=str(state), idle_timeout=math.inf,
                                     num_partitions=PARTITIONS)
        runs.append(run)
        return (stream(spark, feed.src).writeStream.foreachBatch(run)
                .option("checkpointLocation", str(ckpt)).start())

    out: dict[str, Any] = {"store_conf": store, "local_dir_conf": str(local)}
    query = start()
    try:
        driver = Driver(query, feed)
        with MemoryMonitor() as monitor:
            load = [driver.step(f, f"load {i}") for i, f in enumerate(files.load)]
            # the snapshot the load asks for is part of building the state: the steady
            # batches start once it is written (its cost is reported, amortised, apart)
            out["load_snapshot_drain_seconds"] = drain_snapshot_writers()
        out["load_batch_seconds"] = [b["seconds"] for b in load]
        out["load_memory"] = monitor.report()
        loaded = latest_snapshots(state)
        out["snapshot_bytes_after_load"] = sum(loaded.values())
        watched = {"state": state, "checkpoint": ckpt}
        batches, memory, snaps = steady_phase(
            driver, files.steady, watched,
            tasks=lambda: runs[-1].task_timings().to_dict("records"))
        out.update(summary(batches, list(watched)))
        out["steady_batches"] = [{k: b[k] for k in ("batch_id", "seconds", "duration_ms",
                                                    "tasks")} for b in batches]
        out["rocksdb_background"] = background_work(local, batches)
        out["memory"] = memory
        out["steady_snapshot_files"] = sorted(
            os.path.basename(f) for f in snaps["state"]
            if f.endswith((".state", ".tables")) and f not in loaded and os.path.exists(f))
        out["steady_snapshot_drain_seconds"] = drain_snapshot_writers()
        newest = latest_snapshots(state)
        out["snapshot_bytes"] = sum(newest.values())
        out["state_total_bytes"] = total_bytes(snaps["state"])
        out["state_files"] = len(snaps["state"])
        out["checkpoint_total_bytes"] = total_bytes(snaps["checkpoint"])
        out["local_dir_total_bytes"] = total_bytes(snapshot(local))
        stop(query)
        query = start()
        warm = Driver(query, feed).step(files.restart[0], "restart, local store kept")
        out["restart_warm_batch_seconds"] = warm["seconds"]
        stop(query)
        out["local_dir_existed_at_restart"] = local.exists()
        shutil.rmtree(local, ignore_errors=True)
        query = start()
        cold = Driver(query, feed).step(files.restart[1], "restart, local store deleted")
        out["restart_cold_batch_seconds"] = cold["seconds"]
        out["restart_cold_wall_seconds"] = cold["wall_seconds"]
    finally:
        stop(query)
    return out


def run_spark(spark: Any, files: Files, work: Path, provider: str) -> dict[str, Any]:
    """``groupBy("k").agg(count("*"), sum("v"))`` in update mode on a fresh checkpoint."""
    from pyspark.sql import functions as F

    ckpt = work / "ckpt"
    feed = Feed(work)
    # read at the query's first start and fixed in its checkpoint from then on
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
    if PROVIDERS[provider] is None:
        spark.conf.unset(PROVIDER_CONF)
        spark.conf.unset(CHANGELOG_CONF)
    else:
        spark.conf.set(PROVIDER_CONF, PROVIDERS[provider])
        spark.conf.set(CHANGELOG_CONF, "true")
    query = (stream(spark, feed.src).groupBy("k").agg(F.count("*").alias("n"),
                                                       F.sum("v").alias("s"))
             .writeStream.outputMode("update").foreachBatch(noop_sink)
             .option("checkpointLocation", str(ckpt)).start())
    out: dict[str, Any] = {"provider": PROVIDERS[provider] or "default (HDFSBacked)"}
    try:
        driver = Driver(query, feed)
        load = [driver.step(f, f"load {i}") for i, f in enumerate(files.load)]
        out["load_batch_seconds"] = [b["seconds"] for b in load]
        batches, memory, snaps = steady_phase(driver, files.steady, {"checkpoint": ckpt})
        out.update(summary(batches, ["checkpoint"]))
        out["memory"] = memory
        out["checkpoint_total_bytes"] = total_bytes(snaps["checkpoint"])
        out["state_dir_total_bytes"] = total_bytes(snapshot(ckpt / "state"))
        out["state_operators_last_batch"] = batches[-1]["state_operators"]
    finally:
        stop(query)
        spark.conf.unset(PROVIDER_CONF)
        spark.conf.unset(CHANGELOG_CONF)
    return out


def guarded(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One query's results, or the error that ended it (the other queries still run)."""
    print(f"  {name}", flush=True)
    started = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:  # reported in the JSON, not hidden
        first = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else ""
        print(f"  {name} failed: {type(exc).__name__}: {first}", flush=True)
        out = {"error": f"{type(exc).__name__}: {first}"}
    out["run_seconds"] = time.perf_counter() - started
    return out


# ------------------------------------------------------------------ ratios and the table
def _ok(run: dict[str, Any] | None) -> bool:
    return run is not None and "error" not in run


def ratios(runs: dict[str, Any], stores: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for store in stores:
        done = sorted(int(k) for k, r in runs.items() if _ok(r["ours"].get(store)))
        if len(done) >= 2:
            small, big = runs[str(done[0])]["ours"][store], runs[str(done[-1])]["ours"][store]
            out[f"{store}_batch_seconds_largest_over_smallest_k"] = {
                "keys": [done[-1], done[0]], "target": 1.3,
                "ratio": big["median_batch_seconds"] / small["median_batch_seconds"]}
            rss_small = small["memory"]["peak_worker_rss_mb"]
            out[f"{store}_peak_worker_rss_largest_over_smallest_k"] = {
                "keys": [done[-1], done[0]], "target": 1.5,
                "ratio": (big["memory"]["peak_worker_rss_mb"] / rss_small
                          if rss_small else None)}
        versus: dict[str, Any] = {}
        state_bytes: dict[str, Any] = {}
        for k in done:
            run = runs[str(k)]
            ours = run["ours"][store]
            for provider in PROVIDERS:
                theirs = run["spark"].get(provider)
                if _ok(theirs):
                    versus.setdefault(provider, {})[str(k)] = (
                        ours["median_batch_seconds"] / theirs["median_batch_seconds"])
            per_key = ours["state_total_bytes"] / k
            reference = run["distinct_keys_per_batch"] * per_key
            # snapshot_due: one once the changelogs since hold as many rows as there are keys,
            # at least SNAPSHOT_INTERVAL batches apart
            period = max(SNAPSHOT_INTERVAL, k / max(run["distinct_keys_per_batch"], 1))
            state_bytes[str(k)] = {
                "bytes_per_batch_median": ours["state_bytes_per_batch_median"],
                "bytes_per_batch_mean": ours["state_bytes_per_batch_mean"],
                "state_total_bytes": ours["state_total_bytes"],
                "avg_stored_bytes_per_key": per_key,
                "changed_keys_state_bytes": reference,
                "mean_over_changed_keys_state": (ours["state_bytes_per_batch_mean"] / reference
                                                 if reference else None),
                "snapshot_bytes": ours.get("snapshot_bytes"),
                "batches_per_snapshot": period,
                "amortised_snapshot_bytes_per_batch": (ours["snapshot_bytes"] / period
                                                       if ours.get("snapshot_bytes") else None),
            }
        out[f"{store}_over_spark_batch_seconds"] = {
            "target_vs_rocksdb_at_1000000": 1.0, **versus}
        out[f"{store}_bytes_per_batch_vs_changed_keys_state"] = state_bytes
    return out


def print_table(runs: dict[str, Any]) -> None:
    head = (f"{'K':>10} {'query':<14} {'median s':>9} {'bytes/batch':>12} {'total bytes':>12} "
            f"{'ref bytes':>11} {'rss MB':>7} {'hwm MB':>7} {'jvm MB':>7} {'warm s':>6} "
            f"{'cold s':>6}")
    print(head)
    print("-" * len(head))
    for key, run in runs.items():
        rows = [(f"ours:{s}", r) for s, r in run["ours"].items()]
        rows += [(f"spark:{p}", r) for p, r in run["spark"].items()]
        for name, r in rows:
            if not _ok(r):
                print(f"{key:>10} {name:<14} {r.get('error', 'missing')[:70]}")
                continue
            ours = name.startswith("ours")
            where = "state" if ours else "checkpoint"
            total = r["state_total_bytes"] if ours else r["checkpoint_total_bytes"]
            ref = (f"{run['distinct_keys_per_batch'] * total / int(key):>11.0f}" if ours
                   else f"{'':>11}")
            restart = (f"{r['restart_warm_batch_seconds']:>6.2f} "
                       f"{r['restart_cold_batch_seconds']:>6.2f}" if ours else "")
            mem = r["memory"]
            print(f"{key:>10} {name:<14} {r['median_batch_seconds']:>9.3f} "
                  f"{r[f'{where}_bytes_per_batch_mean']:>12.0f} {total:>12d} {ref} "
                  f"{mem['peak_worker_rss_mb']:>7.1f} {mem['worker_hwm_mb']:>7.1f} "
                  f"{mem['peak_jvm_rss_mb']:>7.0f} {restart}")


def print_ratios(found: dict[str, Any]) -> None:
    for name, value in found.items():
        if "ratio" in value:
            ratio = "n/a" if value["ratio"] is None else f"{value['ratio']:.3f}"
            print(f"{name} {value['keys']}: {ratio} (target <= {value['target']})")
        elif name.endswith("_over_spark_batch_seconds"):
            for provider, per_k in value.items():
                if isinstance(per_k, dict):
                    text = ", ".join(f"K={k}: {v:.3f}" for k, v in per_k.items())
                    print(f"{name} / {provider}: {text}")
        else:
            for k, v in value.items():
                amortised = v.get("amortised_snapshot_bytes_per_batch")
                print(f"{name} K={k}: mean {v['bytes_per_batch_mean']:.0f} B/batch, "
                      f"changed keys' state {v['changed_keys_state_bytes']:.0f} B, snapshot "
                      f"{'n/a' if amortised is None else f'{amortised:.0f}'} B/batch "
                      f"amortised (every {v['batches_per_snapshot']:.0f} batches)")


# ------------------------------------------------------------------ main
def int_list(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def parse(argv: list[str]) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--keys", type=int_list, default=None,
                        help="key counts K, comma-separated (default 10000,1000000,10000000)")
    parser.add_argument("--rows", type=int, default=ROWS, help="rows per steady batch")
    parser.add_argument("--batches", type=int, default=None, help="steady batches (default 5)")
    parser.add_argument("--load-chunk", type=int, default=LOAD_CHUNK,
                        help="keys per loading micro-batch")
    parser.add_argument("--stores", default="rocksdb",
                        help="values of spark.trilink.state.store to run, comma-separated")
    parser.add_argument("--files-max-keys", type=int, default=FILES_MAX_KEYS,
                        help="run the files store only at K up to this")
    parser.add_argument("--spark-max-keys", type=int, default=None,
                        help="run Spark's baselines only at K up to this (default: all)")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--worker-reuse", choices=("true", "false"), default="true",
                        help="spark.python.worker.reuse (false: a fresh worker per task)")
    parser.add_argument("--work-dir", default=None, help="where input and state go (temp)")
    parser.add_argument("--out", default="state_scale", help="results/<out>.json")
    parser.add_argument("--quick", action="store_true",
                        help="K = 10000,100000 and 3 steady batches (a smoke run)")
    args = parser.parse_args(argv)
    if args.keys is None:
        args.keys = list(QUICK_KEYS if args.quick else KEYS)
    if args.batches is None:
        args.batches = QUICK_BATCHES if args.quick else BATCHES
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if min(args.keys) < 1 or args.rows < 1 or args.batches < 1 or args.load_chunk < 1:
        parser.error("--keys, --rows, --batches and --load-chunk must be positive")
    if not args.stores:
        parser.error("--stores names no store")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    import pyspark

    spark = tl.get_session("local[2]", shuffle_partitions=PARTITIONS, extra_conf={
        "spark.driver.memory": args.driver_memory, "spark.ui.enabled": "false",
        "spark.python.worker.reuse": args.worker_reuse})
    root = Path(tempfile.mkdtemp(prefix="tl-state-scale-", dir=args.work_dir))
    payload: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else argv, "keys": args.keys, "rows": args.rows,
        "steady_batches": args.batches, "load_chunk": args.load_chunk, "stores": args.stores,
        "files_max_keys": args.files_max_keys, "spark_max_keys": args.spark_max_keys,
        "driver_memory": args.driver_memory, "worker_reuse": args.worker_reuse,
        "partitions": PARTITIONS, "window": WINDOW,
        "delay": DELAY, "pyspark": pyspark.__version__, "runs": {}}
    started = time.perf_counter()
    try:
        for keys in args.keys:
            print(f"K = {keys:,}", flush=True)
            base = root / f"k{keys}"
            files = make_files(base / "staging", keys, args.rows, args.batches,
                               args.load_chunk)
            run: dict[str, Any] = {
                "distinct_keys_per_batch": files.distinct_keys_per_batch,
                "rows_per_batch": files.rows_per_batch, "load_batches": len(files.load),
                "ours": {}, "spark": {}}
            payload["runs"][str(keys)] = run
            for store in args.stores:
                if store == "files" and keys > args.files_max_keys:
                    continue
                run["ours"][store] = guarded(f"ours, store {store}", partial(
                    run_ours, spark, files, base / f"ours-{store}", store))
                write_json(args.out, payload)
            if args.spark_max_keys is None or keys <= args.spark_max_keys:
                for provider in PROVIDERS:
                    run["spark"][provider] = guarded(f"spark, {provider} provider", partial(
                        run_spark, spark, files, base / f"spark-{provider}", provider))
                    write_json(args.out, payload)
            shutil.rmtree(base, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        payload["bench_seconds"] = time.perf_counter() - started
        payload["ratios"] = ratios(payload["runs"], args.stores)
        print(write_json(args.out, payload))
    print_table(payload["runs"])
    print_ratios(payload["ratios"])
    spark.stop()


if __name__ == "__main__":
    main()
