"""``trilink-spark balance`` on a local CSV: Arrow scoring (no Spark) against Spark's read.

A flights-shaped CSV (nycflights13's ``flights`` has 336,776 rows, about 4,000 tail numbers,
some of them null) is written at three sizes: 17,000 rows, 336,776 rows and ten times that.
Each size is timed, as a user runs it, in a fresh process:

- ``arrow``: ``trilink-spark balance FILE --key tailnum`` (the default: counted with Arrow);
- ``spark``: the same scoring on Spark's read of the file (what the command did before, and
  still does for inputs Arrow cannot read as Spark does): a local[2] session, one read and
  one aggregation;
- ``measure``: ``trilink-spark balance FILE --key tailnum --measure``, which also places the
  rows with Spark to measure hash and the chosen strategy.

Every run's figures must agree (the strategies' balance degrees), or the benchmark fails.
Target: the flights-sized file in at most 3 s with Arrow. Writes ``results/balance_cli.json``::

    python benches/cli/bench_balance_cli.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import write_json  # noqa: E402

FLIGHTS = 336_776
SIZES = (17_000, FLIGHTS, 10 * FLIGHTS)
TAILS = 4_043
TARGET_S = 3.0
BIN = Path(sys.executable).parent

SPARK_READ = r"""
import json, sys
from trilink_spark._internal.spark.session import get_session
from trilink_spark.cli import run_balance
spark = get_session("local[2]", shuffle_partitions=8)
df = spark.read.option("header", "true").option("inferSchema", "true").csv(sys.argv[1])
res = run_balance(df, "tailnum", sys.argv[1], 8, 1.0, 0, False, False, "group")
print(json.dumps({s.name: round(s.balance_degree, 6) for s in res.scores}))
spark.stop()
"""


def write_flights(path: Path, rows: int, seed: int = 0) -> None:
    """A CSV shaped like nycflights13's flights: a skewed tail number, some nulls."""
    rng = np.random.default_rng(seed)
    weight = 1.0 / np.arange(1, TAILS + 1) ** 0.6
    tail = rng.choice(TAILS, size=rows, p=weight / weight.sum())
    tails = np.array([f"N{100 + i}{'ABCDEFGHJK'[i % 10]}" for i in range(TAILS)], dtype=object)
    tailnum = tails[tail]
    tailnum[rng.random(rows) < 0.0075] = ""  # about 2,500 null tail numbers in 336,776
    month = rng.integers(1, 13, rows)
    day = rng.integers(1, 29, rows)
    dep = rng.integers(500, 2400, rows)
    delay = rng.normal(12, 40, rows).round().astype(np.int64)
    carrier = np.array(["UA", "B6", "EV", "DL", "AA", "MQ"], dtype=object)[tail % 6]
    flight = rng.integers(1, 8000, rows)
    origin = np.array(["EWR", "JFK", "LGA"], dtype=object)[rng.integers(0, 3, rows)]
    dist = rng.integers(80, 4983, rows)
    with open(path, "w") as fh:
        fh.write("year,month,day,dep_time,dep_delay,carrier,flight,tailnum,origin,distance\n")
        step = 200_000
        for lo in range(0, rows, step):
            hi = min(rows, lo + step)
            fh.write("".join(
                f"2013,{m},{d},{t},{dl},{c},{f},{n},{o},{s}\n" for m, d, t, dl, c, f, n, o, s in zip(
                    month[lo:hi], day[lo:hi], dep[lo:hi], delay[lo:hi], carrier[lo:hi],
                    flight[lo:hi], tailnum[lo:hi], origin[lo:hi], dist[lo:hi])))


def timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout


def degrees(text: str) -> dict[str, float]:
    data = json.loads(text)["datasets"][0]
    return {s["strategy"]: round(s["balance_degree"], 6) for s in data["strategies"]}


def main() -> dict:
    out: dict = {"target_s": TARGET_S, "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for rows in SIZES:
            path = Path(tmp) / f"flights-{rows}.csv"
            write_flights(path, rows)
            cli = [str(BIN / "trilink-spark"), "balance", str(path), "--key", "tailnum",
                   "--partitions", "8", "--json"]
            arrow = [timed(cli) for _ in range(3)]
            spark_s, spark_out = timed([sys.executable, "-c", SPARK_READ, str(path)])
            measure_s, measure_out = timed([*cli, "--measure"])
            got = degrees(arrow[0][1])
            if got != json.loads(spark_out.strip().splitlines()[-1]) or got != degrees(measure_out):
                raise SystemExit(f"{rows} rows: the Arrow and Spark figures differ")
            best = min(s for s, _ in arrow)
            entry = {"rows": rows, "file_mb": round(path.stat().st_size / 1e6, 1),
                     "arrow_s": round(best, 2), "spark_s": round(spark_s, 2),
                     "measure_s": round(measure_s, 2),
                     "spark_over_arrow": round(spark_s / best, 1), "balance": got}
            out["sizes"][str(rows)] = entry
            print(f"{rows:>9,} rows ({entry['file_mb']} MB): arrow {best:.2f} s, spark read "
                  f"{spark_s:.2f} s ({entry['spark_over_arrow']}x), --measure {measure_s:.2f} s")
    flights = out["sizes"][str(FLIGHTS)]
    out["target_met"] = flights["arrow_s"] <= TARGET_S
    print(f"flights-sized file: {flights['arrow_s']:.2f} s against a {TARGET_S} s target: "
          f"{'met' if out['target_met'] else 'NOT met'}")
    write_json("balance_cli", out)
    return out


if __name__ == "__main__":
    main()
