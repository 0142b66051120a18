"""What a background snapshot writer takes from the running tasks, by its CPU priority.

A snapshot writer runs at ``nice`` 19 in a session of its own. With the kernel's autogroups a
new session is a scheduling group of its own, and the nice of a process only counts inside
its group: the writer's group competes with the worker's whole group as an equal. This bench
measures it on the machine's cores: ``cores`` busy "task" processes each do a fixed amount of
work (a Python loop), alone and beside one busy "writer" process started the way the package
starts its snapshot writer,

- ``nice``: ``nice`` 19, a new session (the package before ``background_priority``);
- ``background``: :func:`~trilink_spark.keyed.durable.snapshot_writer.background_priority`
  (``nice`` 19 and the session's group lowered too);

and reports the tasks' time beside each writer against their time alone (1.0: the writer
took nothing). Usage::

    python -m benches.state.bench_writer_priority [--work 30000000] [--runs 3] [--out NAME]

writes ``benches/results/NAME.json`` (default ``writer_priority``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trilink_spark.keyed.durable.snapshot_writer import background_priority

BURN = "import sys\nn = 0\nwhile True:\n    n += 1\n"
TASK = "import sys, time\nt = time.perf_counter()\nn = 0\nfor _ in range(int(sys.argv[1])):\n" \
       "    n += 1\nprint(time.perf_counter() - t)\n"


def plain_nice() -> None:
    os.nice(19)


def tasks(cores: int, work: int) -> float:
    """The slowest of ``cores`` task processes doing ``work`` steps each, seconds."""
    procs = [subprocess.Popen([sys.executable, "-c", TASK, str(work)], stdout=subprocess.PIPE)
             for _ in range(cores)]
    return max(float(p.communicate()[0]) for p in procs)


def beside(writer: str | None, cores: int, work: int) -> float:
    if writer is None:
        return tasks(cores, work)
    pre = plain_nice if writer == "nice" else background_priority
    burn = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True,
                            preexec_fn=pre)  # noqa: PLW1509 - the package's own way
    try:
        time.sleep(0.2)  # running before the tasks start, as a writer of the last batch
        return tasks(cores, work)
    finally:
        burn.kill()
        burn.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=int, default=30_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="writer_priority")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    seconds: dict[str, list[float]] = {"alone": [], "nice": [], "background": []}
    for _ in range(args.runs):
        for name in seconds:
            seconds[name].append(beside(None if name == "alone" else name, cores, args.work))
    alone = statistics.median(seconds["alone"])
    out: dict[str, Any] = {
        "benchmark": "writer_priority", "cores": cores, "work": args.work,
        "machine": platform.platform(),
        "autogroup": autogroup.read_text().strip() if autogroup.exists() else None,
        "seconds": seconds,
        "median_seconds": {k: statistics.median(v) for k, v in seconds.items()},
        "slowdown": {k: statistics.median(v) / alone for k, v in seconds.items()},
    }
    print(f"cores {cores}, autogroup {out['autogroup']}: tasks alone {alone:.2f} s")
    for name in ("nice", "background"):
        print(f"  beside a writer ({name}): {out['median_seconds'][name]:.2f} s, "
              f"{out['slowdown'][name]:.2f}x")
    path = Path(__file__).resolve().parents[1] / "results" / f"{args.out}.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
