"""Service URLs: check their scheme and hide their credentials in every message.

Examples
--------
>>> redact("redis://:hunter2@127.0.0.1:6379/0")
'redis://:***@127.0.0.1:6379/0'
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact"]


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs, errors and ``repr``).

    Notes
    -----
    O(len(url)); never raises.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>"
    if password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
