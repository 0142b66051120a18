"""``trilink-spark config get|set``: read or publish the dynamic configuration from a shell.

Examples
--------
::

    trilink-spark config get --redis redis://127.0.0.1:6379/0
    trilink-spark config set --redis redis://:pw@host:6379/0 mode=threshold threshold=0.6
    trilink-spark config set --redis rediss://host:6380/0 candidates=hash,least_count
    TRILINK_CONFIG_SECRET=s3cret trilink-spark config set --redis URL strategy=least_count
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, TextIO

from ..switching.config_center import RedisConfigCenter
from ..switching.settings import CONFIG_FIELDS
from ..errors import ConfigError, InvalidArgumentError

__all__ = ["add_config_parser", "run_config", "parse_assignment"]

SECRET_ENV = "TRILINK_CONFIG_SECRET"


def add_config_parser(sub: Any) -> None:
    """Register ``config get`` and ``config set`` on the top-level subparsers."""
    cfg = sub.add_parser(
        "config",
        help="read or publish the dynamic configuration (Redis pub/sub)",
        description=(
            "Read the stored configuration, or publish an update that running jobs apply at "
            f"their next batch boundary. Fields: {', '.join(CONFIG_FIELDS)}."
        ),
    )
    actions = cfg.add_subparsers(dest="action", required=True)
    get = actions.add_parser("get", help="print the stored configuration as JSON")
    put = actions.add_parser("set", help="publish an update (merged into the stored one)")
    put.add_argument("assignments", nargs="+", metavar="field=value",
                     help="values are JSON (0.05, null, [\"hash\"]) or plain text; a comma "
                     "makes a list (candidates=hash,least_count)")
    for p in (get, put):
        p.add_argument("--redis", required=True, metavar="URL",
                       help="redis:// or rediss:// URL, password included if needed")
        p.add_argument("--channel", default="trilink:config", help="pub/sub channel")
        p.add_argument("--secret", default=None,
                       help=f"HMAC-SHA256 secret (default: ${SECRET_ENV} when set)")


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"field=value"`` to ``(field, value)``: JSON when it parses, lists on commas, else text.

    Examples
    --------
    >>> parse_assignment("sample_rate=0.05")
    ('sample_rate', 0.05)
    >>> parse_assignment("candidates=hash,least_count")
    ('candidates', ['hash', 'least_count'])
    >>> parse_assignment("mode=quantity")
    ('mode', 'quantity')
    """
    field, sep, raw = text.partition("=")
    if not sep or not field:
        raise InvalidArgumentError(f"expected field=value, got {text!r}")
    try:
        return field, json.loads(raw)
    except json.JSONDecodeError:
        pass
    if "," in raw:
        return field, [part.strip() for part in raw.split(",") if part.strip()]
    return field, raw


def run_config(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``config get`` / ``config set``; returns the exit status."""
    secret = args.secret if args.secret is not None else os.environ.get(SECRET_ENV) or None
    update = dict(parse_assignment(a) for a in getattr(args, "assignments", []))
    center = RedisConfigCenter(args.redis, args.channel, secret=secret)
    try:
        if args.action == "get":
            snapshot = center.stored()
            json.dump(snapshot or {}, out, sort_keys=True)
            out.write("\n")
            return 0
        accepted = center.publish(update)
        if accepted is None:
            raise ConfigError(f"update refused: {center.last_rejection}")
        json.dump(accepted, out, sort_keys=True)
        out.write("\n")
        return 0
    finally:
        center.close()
