"""What the live dashboard costs a running query: the same stream with and without it.

One query per size: a file stream of skewed clicks (one user sends 40 % of them, 400 others
the rest), ``size`` rows per batch, a ``keyed_foreach_batch`` running count per user on 4
partitions (the query of ``examples/skew_dashboard.py``). The driver writes one file and waits
for its batch (``processAllAvailable``), ``--blocks`` blocks of ``--block`` batches each; the
blocks alternate between

- **plain**: no dashboard (the run still writes its per-batch history record: that is the
  run's own report, there in both);
- **dashboard**: ``tl.dashboard(spark, runs=[run])`` started before the block and stopped
  after it (its ``StreamingQueryListener``, its feed thread reading each new history record,
  its server), and a client in the driver process asking what the open page asks at its
  refresh rate (1 s: ``/data.json?since=<version>``, every source when something changed):
  the cost the driver pays;
- **browser** (``--browser``, a third kind of block): the dashboard with the real page open
  in headless Chromium on this same machine (Bokeh drawing each change): the cost when the
  browser shares the driver's 2 cores, as on a laptop.

Measure: each batch's ``triggerExecution`` (Spark's progress); the first batch of each block
is left out (it pays the start or the stop of the dashboard, or the browser's launch), and
the first block of all (the JVM's warm-up). Alternating blocks in one query cancel the drift a
shared machine shows over minutes (background snapshot writers, caches), which separate runs
of a few seconds each do not (an earlier form of this benchmark saw +-15 % between identical
runs). Overhead = median batch of a kind / median plain batch - 1, also the mean.

CPU, measured per block and per batch (what wall-clock noise cannot hide): the driver
process's CPU time (``time.process_time``: the query's own driver work and, in dashboard
blocks, every thread of the dashboard), the JVM's (``/proc``), and in browser blocks every
Chromium process's, from the moment the page is open and drawn to the block's last batch
(the dashboard's start and the page's first rendering, a one-off cost of each dashboard, are
reported apart: here every block starts one). The dashboard's cost = its blocks' driver CPU
per batch minus the plain blocks', as a share of the plain batch's median time. Target: at
most 3 %.

Run: ``python benches/ui/bench_dashboard_overhead.py [--sizes 20000 100000 400000]
[--blocks 13] [--block 5] [--browser]`` (writes benches/results/dashboard_overhead.json). Run
it on a machine with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "benches"))
sys.path.insert(0, str(ROOT / "examples"))
from common import write_json  # noqa: E402
from skew_dashboard import ClickCount, clicks  # noqa: E402

import trilink_spark as tl  # noqa: E402

SIZES = (20_000, 100_000, 400_000)
BLOCKS = 13
BLOCK = 5
PARTITIONS = 4


class PagePoller:
    """Asks what the live page asks, every ``refresh_s``, from a thread of this process:
    ``/data.json?since=<version>`` (every source when something changed, else the version
    alone): what an open page costs the driver."""

    def __init__(self, url: str, refresh_s: float = 1.0) -> None:
        base = url.split("?", 1)[0].rstrip("/")
        token = url.split("token=", 1)[1] if "token=" in url else None
        html = urllib.request.urlopen(url, timeout=10).read().decode()
        if '"/data.json?' not in html:
            raise RuntimeError(f"the page at {url} polls no /data.json")
        self.base = base + "/data.json?since="
        self.headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self.refresh_s = refresh_s
        self.fetched = 0
        self.changed = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        version = -1
        while not self.stopped.wait(self.refresh_s):
            request = urllib.request.Request(f"{self.base}{version}", headers=self.headers)
            with urllib.request.urlopen(request, timeout=10) as r:
                doc = json.loads(r.read())
            self.fetched += 1
            self.changed += "sources" in doc
            version = doc["version"]

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


class BrowserPage:
    """The page open in headless Chromium (Debian's), in a thread of its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ready = threading.Event()
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()
        if not self.ready.wait(60) or self.error is not None:
            raise RuntimeError(f"the page did not open: {self.error}")

    def loop(self) -> None:
        from playwright.sync_api import sync_playwright

        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                            headless=True)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(self.url)
                page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0")
                self.ready.set()
                while not self.stopped.is_set():
                    page.wait_for_timeout(200)
                browser.close()
        except BaseException as err:  # noqa: BLE001 - reported by the caller
            self.error = err
            self.ready.set()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)


TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from /proc; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime


def jvm_pid() -> int | None:
    """The driver's JVM: this process's child running java."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and name == "java":
            return int(stat.parent.name)
    return None


def browser_cpu_s() -> float:
    """CPU seconds of every Chromium process alive now (the page's renderer included)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "chrom" in text[text.index("(") + 1:text.rindex(")")].lower():
            total += process_cpu_s(int(stat.parent.name))
    return total


def block_kinds(blocks: int, browser: bool) -> list[str]:
    """The blocks' kinds in order: plain first (the warm-up), then alternating, so each kind
    sees early and late blocks alike."""
    kinds = ["plain", "dashboard"] + (["browser"] if browser else [])
    order: list[str] = []
    while len(order) < blocks:
        order += kinds if (len(order) // len(kinds)) % 2 == 0 else kinds[::-1]
    return order[:blocks]


def measure(spark: Any, root: Path, size: int, blocks: int, block: int,
            browser: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"size-{size}-", dir=root))
    (work / "in").mkdir()
    run = tl.keyed_foreach_batch(
        lambda out, batch_id: out.write.format("noop").mode("overwrite").save(),
        "user", "ts", ClickCount(), delay=20, state_path=str(work / "state"),
        num_partitions=PARTITIONS, strategy="hash")
    query = (spark.readStream.schema("user string, ts long").option("maxFilesPerTrigger", 1)
             .parquet(str(work / "in")).writeStream.foreachBatch(run)
             .option("checkpointLocation", str(work / "checkpoint")).start())
    per_kind: dict[str, list[float]] = {}
    cpu: dict[str, dict[str, float]] = {}  # kind -> driver / jvm / browser CPU s, batches
    requests = changed = 0
    pushed = 0
    jvm = jvm_pid()
    try:
        for i, kind in enumerate(block_kinds(blocks, browser)):
            url = client = None
            inputs = [clicks(b, size) for b in range(pushed, pushed + block)]  # untimed
            started = time.process_time()
            if kind != "plain":
                url = tl.dashboard(spark, runs={"clicks": run})
                client = PagePoller(url) if kind == "dashboard" else BrowserPage(url)
            # from here on, the steady state: the page is open and drawn (the dashboard's
            # start, the page's first rendering and the browser's launch are one-off costs,
            # reported apart)
            start_cpu = time.process_time() - started
            driver0, jvm0 = time.process_time(), process_cpu_s(jvm) if jvm else 0.0
            browser0 = browser_cpu_s() if kind == "browser" else 0.0
            first = pushed
            browser_used = 0.0
            try:
                for frame in inputs:
                    frame.to_parquet(work / "in" / f"c-{pushed:05d}.parquet")
                    pushed += 1
                    query.processAllAvailable()
                browser_used = browser_cpu_s() - browser0 if kind == "browser" else 0.0
            finally:
                stopped_cpu = time.process_time()
                if client is not None:
                    client.stop()
                    requests += getattr(client, "fetched", 0)
                    changed += getattr(client, "changed", 0)
                if url is not None:
                    url.stop()
            if i == 0:
                continue  # the warm-up block
            spent = cpu.setdefault(kind, {"driver_s": 0.0, "jvm_s": 0.0, "browser_s": 0.0,
                                          "batches": 0, "start_s": []})
            spent["start_s"].append(round(start_cpu, 4))
            spent["driver_s"] += stopped_cpu - driver0
            spent["jvm_s"] += (process_cpu_s(jvm) if jvm else 0.0) - jvm0
            spent["browser_s"] += browser_used
            spent["batches"] += block
            durations = {int(p["batchId"]): p["durationMs"]["triggerExecution"] / 1000.0
                         for p in query.recentProgress if p["numInputRows"] > 0}
            kept = [durations[b] for b in range(first + 1, pushed) if b in durations]
            per_kind.setdefault(kind, []).extend(kept)
            print(f"{size:>9} rows/batch  block {i:>2} {kind:<9} median "
                  f"{statistics.median(kept):.3f} s", flush=True)
    finally:
        query.stop()
    records = len(tl.keyed.history.read_history(run.store))
    shutil.rmtree(work, ignore_errors=True)
    median = {k: statistics.median(v) for k, v in per_kind.items()}
    mean = {k: statistics.fmean(v) for k, v in per_kind.items()}
    per_batch = {k: {name: 1000.0 * c[name] / c["batches"]
                     for name in ("driver_s", "jvm_s", "browser_s")} for k, c in cpu.items()}
    plain_ms = per_batch["plain"]
    # the dashboard's own work: the driver process's CPU beyond the plain blocks' per batch
    # (its threads all run there; the JVM side is one json() call per batch), as a share of
    # the plain batch's time; the page's: Chromium's CPU per batch
    cost = {k: {"start_driver_ms": 1000.0 * statistics.median(cpu[k]["start_s"]),
                "driver_ms_per_batch": v["driver_s"] - plain_ms["driver_s"],
                "jvm_ms_per_batch": v["jvm_s"] - plain_ms["jvm_s"],
                "browser_ms_per_batch": v["browser_s"],
                "driver_share_of_batch": (v["driver_s"] - plain_ms["driver_s"])
                / (1000.0 * median["plain"])}
            for k, v in per_batch.items() if k != "plain"}
    return {"batches": {k: [round(d, 4) for d in v] for k, v in per_kind.items()},
            "cpu_ms_per_batch": per_batch, "cost": cost,
            "median_batch_s": median, "mean_batch_s": mean,
            "overhead": {k: median[k] / median["plain"] - 1.0 for k in median if k != "plain"},
            "overhead_mean": {k: mean[k] / mean["plain"] - 1.0 for k in mean if k != "plain"},
            "page_requests": requests, "page_replies_with_data": changed,
            "history_records_kept": records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--blocks", type=int, default=BLOCKS)
    parser.add_argument("--block", type=int, default=BLOCK)
    parser.add_argument("--browser", action="store_true",
                        help="also blocks with the page open in headless Chromium")
    args = parser.parse_args()
    spark = tl.get_session("local[2]", shuffle_partitions=PARTITIONS)
    root = Path(tempfile.mkdtemp(prefix="trilink-dashboard-bench-"))
    results: dict[str, Any] = {}
    try:
        for size in args.sizes:
            found = measure(spark, root, size, args.blocks, args.block, args.browser)
            results[str(size)] = found
            for k, c in found["cost"].items():
                print(f"{size:>9} rows/batch  {k}: start {c['start_driver_ms']:.0f} ms CPU; "
                      f"driver CPU {c['driver_ms_per_batch']:+.1f} "
                      f"ms/batch ({100 * c['driver_share_of_batch']:+.2f} % of a batch), JVM "
                      f"{c['jvm_ms_per_batch']:+.1f} ms, browser {c['browser_ms_per_batch']:.1f} "
                      "ms", flush=True)
            print(f"{size:>9} rows/batch  overhead (median batch): " + ", ".join(
                f"{k} {100 * o:+.1f} %" for k, o in found["overhead"].items())
                + "; (mean): " + ", ".join(
                f"{k} {100 * o:+.1f} %" for k, o in found["overhead_mean"].items()),
                flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    path = write_json("dashboard_overhead", {
        "blocks": args.blocks, "block": args.block, "partitions": PARTITIONS,
        "sizes": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
