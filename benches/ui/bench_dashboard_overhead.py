"""What the live dashboard costs a running query: the same stream with and without it.

One file stream of skewed clicks (one user sends 40 % of them, 400 others the rest), ``--files``
parquet files of ``size`` rows each, one per trigger (``maxFilesPerTrigger=1``,
``availableNow``), a ``keyed_foreach_batch`` running count per user on 4 partitions (the
example ``examples/skew_dashboard.py``'s query). Three variants, on the same input:

- **plain**: the query alone (its run still writes its per-batch history record: that is
  the run's own report, present in both);
- **dashboard**: ``tl.dashboard(spark, runs=[run])`` started before the query (its
  ``StreamingQueryListener``, its feed thread reading each new history record, its server),
  and a client in the driver process asking what the page asks at its refresh rate (1 s):
  ``/data.json?since=<version>``, every source when something changed: the cost the driver
  pays;
- **browser** (``--browser``): the dashboard with the real page open in headless Chromium
  on this same machine (Bokeh rendering every update): the cost when the browser shares the
  driver's machine, as on a laptop.

Measure: each batch's ``triggerExecution`` duration (Spark's progress), batch 0 left out (it
pays the state store's start); the wall time from ``start()`` to the end of
``awaitTermination()``. Each variant runs ``--repeat`` times per size in the order plain,
dashboard, [browser], [browser], dashboard, plain, ... (one untimed run first warms the
JVM). Overhead = the median batch of all a variant's runs over the plain query's - 1 (also
reported: the best run's summed batches, and wall time). Target: at most 3 %.

Run: ``python benches/ui/bench_dashboard_overhead.py [--sizes 20000 100000 400000]
[--files 12] [--repeat 2] [--browser]`` (writes benches/results/dashboard_overhead.json). Run
it on a machine with nothing else running.
"""

from __future__ import annotations

import argparse
import json
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
FILES = 12
PARTITIONS = 4


def write_input(src: Path, size: int, files: int) -> None:
    import os

    src.mkdir(parents=True)
    stamp = time.time() - files - 10
    for b in range(files):
        path = src / f"clicks-{b:05d}.parquet"
        clicks(b, size).to_parquet(path)
        os.utime(path, (stamp + b, stamp + b))


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


def run_variant(variant: str, spark: Any, src: Path, root: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=root))
    run = tl.keyed_foreach_batch(
        lambda out, batch_id: out.write.format("noop").mode("overwrite").save(),
        "user", "ts", ClickCount(), delay=20, state_path=str(work / "state"),
        num_partitions=PARTITIONS, strategy="hash")
    url = client = None
    if variant != "plain":
        url = tl.dashboard(spark, runs={"clicks": run})
        client = PagePoller(url) if variant == "dashboard" else BrowserPage(url)
    query = None
    try:
        start = time.perf_counter()
        query = (spark.readStream.schema("user string, ts long")
                 .option("maxFilesPerTrigger", 1).parquet(str(src))
                 .writeStream.foreachBatch(run).trigger(availableNow=True)
                 .option("checkpointLocation", str(work / "checkpoint")).start())
        query.awaitTermination()
        wall = time.perf_counter() - start
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        durations = [p["durationMs"]["triggerExecution"] / 1000.0 for p in progress]
        shown = None if url is None else url.model.snapshot()
    finally:
        if query is not None and query.isActive:
            query.stop()
        if client is not None:
            client.stop()
        if url is not None:
            url.stop()
    held = -1 if shown is None else len(tl.keyed.history.read_history(run.store))
    shutil.rmtree(work, ignore_errors=True)
    return {"wall_s": wall, "batches": len(durations), "batch_s": sum(durations[1:]),
            "batch_s_each": [round(d, 4) for d in durations],
            "requests": getattr(client, "fetched", None),
            "changed_replies": getattr(client, "changed", None), "records_on_path": held}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--files", type=int, default=FILES)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--browser", action="store_true",
                        help="also run with the page open in headless Chromium")
    args = parser.parse_args()
    variants = ["plain", "dashboard"] + (["browser"] if args.browser else [])
    spark = tl.get_session("local[2]", shuffle_partitions=PARTITIONS)
    root = Path(tempfile.mkdtemp(prefix="trilink-dashboard-bench-"))
    results: dict[str, Any] = {}
    try:
        for i, size in enumerate(args.sizes):
            src = root / f"in-{size}"
            write_input(src, size, args.files)
            if i == 0:  # the JVM's, the workers' and the state store's first start: untimed
                run_variant("plain", spark, src, root)
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            for r in range(args.repeat):
                order = variants if r % 2 == 0 else variants[::-1]
                for v in order:
                    found = run_variant(v, spark, src, root)
                    runs[v].append(found)
                    print(f"{size:>9} rows/batch  {v:<9}  batches {found['batch_s']:.3f} s  "
                          f"wall {found['wall_s']:.3f} s", flush=True)
            best = {v: min(x["batch_s"] for x in runs[v]) for v in variants}
            wall = {v: min(x["wall_s"] for x in runs[v]) for v in variants}
            # every batch of every repeat (batch 0 left out): the median batch, robust to
            # the one slow batch a 2-core machine gives any run now and then
            median = {v: statistics.median(d for x in runs[v] for d in x["batch_s_each"][1:])
                      for v in variants}
            results[str(size)] = {
                "runs": runs, "best_batch_s": best, "best_wall_s": wall,
                "median_batch_s": median,
                "overhead": {v: median[v] / median["plain"] - 1.0 for v in variants[1:]},
                "overhead_best_sum": {v: best[v] / best["plain"] - 1.0 for v in variants[1:]},
                "overhead_wall": {v: wall[v] / wall["plain"] - 1.0 for v in variants[1:]}}
            print(f"{size:>9} rows/batch  overhead (median batch): " + ", ".join(
                f"{v} {100 * o:+.1f} %" for v, o in results[str(size)]["overhead"].items())
                + "; (best sum): " + ", ".join(
                f"{v} {100 * o:+.1f} %"
                for v, o in results[str(size)]["overhead_best_sum"].items()), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    path = write_json("dashboard_overhead", {
        "files": args.files, "partitions": PARTITIONS, "repeat": args.repeat,
        "sizes": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
