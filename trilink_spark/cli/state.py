"""``trilink-spark state PATH``: what a keyed stream's state path holds.

Prints the last committed batch, the placement in force, keys, bytes and stored versions per
partition, and the swaps, from :func:`~trilink_spark.keyed.state_summary` (no Spark, nothing
written). ``--json`` prints the summary as one JSON object.

Examples
--------
::

    trilink-spark state /data/checkpoints/sensors-state
    trilink-spark state s3://bucket/state --json
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from ..keyed.records.state_reader import state_summary

__all__ = ["add_state_parser", "run_state", "format_summary"]


def add_state_parser(sub: Any) -> None:
    """Add the ``state`` subcommand to the ``trilink-spark`` parser."""
    cmd = sub.add_parser(
        "state", help="summarise a keyed stream's state path (keys and bytes per partition, "
        "versions, last committed batch, swaps)")
    cmd.add_argument("path", help="the state_path of a keyed_foreach_batch stream (a local "
                     "directory or a URI such as s3://bucket/state)")
    cmd.add_argument("--json", action="store_true", help="print the summary as JSON")


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a few lines of text. O(partitions + swaps)."""
    lines = [f"state path      {summary['path']}"]
    if summary["last_committed"] is None:
        lines.append("nothing committed yet")
        return "\n".join(lines) + "\n"
    placement = summary["placement"] or {}
    lines += [
        f"last committed  batch {summary['last_committed']} (committed kept: "
        f"{summary['committed']})",
        f"placement       {placement.get('strategy', '?')} on {len(summary['partitions'])} "
        "partitions",
        f"keys            {summary['keys']:,} in {summary['bytes']:,} bytes",
        "",
        f"{'partition':>9}  {'keys':>10}  {'bytes':>12}  versions stored",
    ]
    for part in summary["partitions"]:
        versions = part["versions"]
        shown = f"{versions[0]}..{versions[-1]} ({len(versions)})" if versions else "none"
        lines.append(f"{part['partition']:>9}  {part['keys']:>10,}  {part['bytes']:>12,}  "
                     f"{shown}")
    if summary["swaps"]:
        lines += ["", f"{'swap batch':>10}  {'partitions':>12}  moved keys"]
        for swap in summary["swaps"]:
            lines.append(f"{swap['batch']:>10}  {swap['partitions_before']!s:>5} -> "
                         f"{swap['partitions_after']!s:<4}  {swap['moved_keys']}")
    else:
        lines += ["", "no swaps"]
    return "\n".join(lines) + "\n"


def run_state(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``trilink-spark state``; returns the exit status (typed errors propagate)."""
    summary = state_summary(args.path)
    out.write(json.dumps(summary) + "\n" if args.json else format_summary(summary))
    return 0
