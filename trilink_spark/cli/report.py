"""``trilink-spark report STATE_PATH --html out.html``: a run's history as one HTML page.

Writes the history a ``keyed_foreach_batch`` run keeps on its state path (per-partition rows
and task time, balance degree beside the keyed bound, candidate strategies, hot keys, late
rows by key and partition watermark, swaps and rebalances) as one self-contained file that
opens offline. Needs the ``[ui]`` extra. No Spark, nothing written to the state path.

Examples
--------
::

    trilink-spark report /data/checkpoints/sensors-state --html sensors.html
    trilink-spark report s3://bucket/state --html last-hour.html --last 720
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..ui.report import write_state_report

__all__ = ["add_report_parser", "run_report"]


def add_report_parser(sub: Any) -> None:
    """Add the ``report`` subcommand to the ``trilink-spark`` parser."""
    cmd = sub.add_parser(
        "report", help="write a keyed run's history (per-partition load, balance, hot keys, "
        "late rows, swaps) as one self-contained HTML file")
    cmd.add_argument("path", help="the state_path of a keyed_foreach_batch run (a local "
                     "directory or a URI such as s3://bucket/state)")
    cmd.add_argument("--html", required=True, help="the HTML file to write")
    cmd.add_argument("--last", type=int, default=None,
                     help="only the newest LAST batches (default: all the path keeps)")
    cmd.add_argument("--title", default=None, help="the page's title")


def run_report(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``trilink-spark report``; returns the exit status (typed errors propagate)."""
    summary = write_state_report(args.path, args.html, last=args.last, title=args.title)
    out.write(f"wrote {summary['html']} ({summary['bytes']:,} bytes): batches "
              f"{summary['first']}..{summary['last']} ({summary['batches']} kept) of "
              f"{summary['path']}\n")
    return 0
