"""``python -m benches.ysb``: the Yahoo Streaming Benchmark end to end, plain Spark against
trilink.

Starts tansu and redis-server on free loopback ports (or uses ``--bootstrap`` and
``--redis``), runs the chosen variants one after another, prints a table and writes JSON.
Run it from the repository root::

    python -m benches.ysb --events 100000 --rate 5000 --json ysb.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from trilink_spark import get_session
from trilink_spark.errors import InvalidArgumentError, TrilinkError

from .runner import parse_variants, run_ysb

__all__ = ["build_parser", "run_ysb_command", "format_table", "COLUMNS",
           "main"]

#: The program name in usage and error lines.
PROG = "python -m benches.ysb"

#: The figures of each variant, in the table's and the JSON's order.
COLUMNS: tuple[str, ...] = ("events", "mismatches", "exchanges", "throughput", "p50_latency_ms",
                            "p99_latency_ms", "redis_round_trips_per_1000")


def build_parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Yahoo Streaming Benchmark: Kafka -> PySpark -> Redis, baseline vs trilink. "
            "Produce YSB ad events to Kafka at --rate events/s, count views per campaign and "
            "10-second window with each variant (plain Spark and the trilink variants), write "
            "the windows to Redis, check them against the events sent, and report throughput, "
            "latency, shuffle exchanges and Redis round trips."),
    )
    parser.add_argument("--events", type=int, default=100_000,
                        help="events per variant (default 100000)")
    parser.add_argument("--rate", type=float, default=10_000.0,
                        help="events per second (default 10000)")
    parser.add_argument("--variants", default="baseline,key_by,local_merge,global_merge,ahead",
                        help="comma-separated variants (default: all five)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: start tansu)")
    parser.add_argument("--redis", help="redis:// URL (default: start redis-server)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="Kafka partitions of each run's topic (default 4)")
    parser.add_argument("--strategy", default="least_key",
                        help="placement of campaigns (default least_key)")
    parser.add_argument("--trigger", default="1 second",
                        help="micro-batch trigger interval (default '1 second')")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--producer-processes", type=int, default=1, metavar="N",
                        help="processes that produce the events, each with its own Kafka client "
                             "and share of the rate (default 1; more to drive higher rates)")
    return parser


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The results as a fixed-width text table (one row per variant). O(variants)."""
    header = ["variant", *COLUMNS]
    cells = [[str(r["variant"]), *[_cell(r.get(c)) for c in COLUMNS]] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in
                       enumerate(zip(header, widths)))]
    for row in cells:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                               enumerate(zip(row, widths))))
    return "\n".join(lines) + "\n"


def run_ysb_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run the variants, print the table, write ``--json``.

    Returns
    -------
    int
        0 when every variant ended with 0 mismatches, 1 otherwise.

    Raises
    ------
    InvalidArgumentError
        A bad ``--events``, ``--rate``, ``--partitions``, ``--producer-processes`` or variant
        name (:func:`main` prints it and exits 2).

    Notes
    -----
    Cost: per variant ``events / rate`` seconds of production plus the query's start and
    drain.
    """
    if args.events < 1 or args.rate <= 0 or args.partitions < 1 or args.producer_processes < 1:
        raise InvalidArgumentError(
            "--events, --rate, --partitions and --producer-processes must be positive, got "
            f"{args.events}, {args.rate}, {args.partitions} and {args.producer_processes}")
    variants = parse_variants(args.variants)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = get_session(args.master, app_name="trilink-ysb", shuffle_partitions=args.partitions)
    spark.sparkContext.setLogLevel("ERROR")
    rows: list[dict[str, Any]] = []

    def shown(result: Any) -> None:
        rows.append(result.to_dict())
        out.write(f"{result.variant}: {result.events} events, {result.mismatches} mismatches, "
                  f"{result.throughput:,.0f} events/s\n")
        out.flush()

    run_ysb(variants, events=args.events, rate=args.rate, bootstrap=args.bootstrap,
            redis_url=args.redis, spark=spark, partitions=args.partitions,
            strategy=args.strategy, trigger=args.trigger, seed=args.seed, on_result=shown,
            producer_processes=args.producer_processes)
    out.write(format_table(rows))
    if args.json is not None:
        payload = {"events": args.events, "rate": args.rate, "partitions": args.partitions,
                   "strategy": args.strategy, "trigger": args.trigger,
                   "producer_processes": args.producer_processes,
                   "variants": {r["variant"]: r for r in rows}}
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        out.write(f"JSON written to {args.json}\n")
    return 0 if all(r["mismatches"] == 0 for r in rows) else 1


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of ``python -m benches.ysb``; returns the exit status.

    0 when every variant ended with 0 mismatches, 1 otherwise, 2 on a refused argument or a
    missing server (the error goes to standard error).
    """
    args = build_parser().parse_args(argv)
    try:
        return run_ysb_command(args, out if out is not None else sys.stdout)
    except TrilinkError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
