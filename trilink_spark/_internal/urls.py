"""Service URLs: hide their credentials in every message.

:func:`redact` is what every error, ``repr`` and log line of the package prints in place of a
service URL; :func:`scrub` hides the same credentials inside a text that may quote them (the
message of an exception raised by a client library).

Every credential form that redis-py reads from a URL is hidden, in any scheme (so a URL refused
for its scheme is still safe to print), and in URLs that do not parse:

- the password of a ``user:password@`` userinfo (the user name is kept);
- a password-only ``:password@`` userinfo;
- the values of ``password=`` and ``username=`` query parameters, whatever their case or
  percent-encoding, and of any parameter whose name mentions a password, a secret, a token,
  a user or an authentication (``ssl_password=``, ``auth_token=``...).

The reading is deliberately more suspicious than redis-py's. Credential parameters are looked
for after every ``?``, ``&`` and ``#``, and a value runs to the next ``&name=`` or ``#name=``.
Then everything before the *last* ``@`` left counts as userinfo, so a raw ``@``, ``/``, ``?``
or ``#`` in a password (which should have been percent-encoded) cannot move part of it into the
host or the path. The price is that a URL with an ``@`` in its path or query shows less than it
could. Control characters are escaped, so that a URL cannot forge a log line.

Examples
--------
>>> redact("redis://:hunter2@127.0.0.1:6379/0")
'redis://:***@127.0.0.1:6379/0'
>>> redact("rediss://alice:hunter2@cache:6380/0?ssl_cert_reqs=none")
'rediss://alice:***@cache:6380/0?ssl_cert_reqs=none'
>>> redact("redis://cache:6379/0?username=alice&password=hunter2&db=2")
'redis://cache:6379/0?username=***&password=***&db=2'
>>> redact("http://:hunter2@[::1")
'http://:***@[::1'
>>> scrub("AUTH hunter2 failed", "redis://:hunter2@cache:6379/0")
'AUTH *** failed'
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit

__all__ = ["redact", "scrub", "MASK"]

#: What a hidden credential is replaced with.
MASK = "***"

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
#: A query parameter's name: after a ``?``, ``&`` or ``#``, up to its ``=``.
_PARAM_NAME = re.compile(r"(?<=[?&#])([^?&#=]+)=")
#: Where a value ends: at an ``&`` or ``#`` followed by ``name=`` (where redis-py ends it, or
#: earlier); any other ``&`` or ``#`` stays inside the value.
_PARAM_SPLIT = re.compile(r"[&#](?=[^&#=]+=)")
#: A user name shown as is: nothing in it that could belong to a path, a query or a password.
_CLEAN_USER = re.compile(r"[^/?#@&=;:\s]*")
#: Words that make a query parameter's value a credential (matched in its name, lower case,
#: letters and digits only).
_SENSITIVE = ("pass", "pwd", "secret", "token", "user", "auth", "cred")


def _is_sensitive(raw_name: str) -> bool:
    try:
        name = unquote_plus(raw_name)
    except Exception:  # noqa: BLE001 - a name that does not decode is judged as written
        name = raw_name
    letters = "".join(ch for ch in name.lower() if ch.isalnum())
    return any(word in letters for word in _SENSITIVE)


def _printable(text: str) -> str:
    """Control characters escaped, so that a URL cannot forge a log line."""
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


def _mask(url: str) -> tuple[str, list[str]]:
    """``url`` with its credentials masked (control characters not escaped yet), and the
    texts it masked."""
    hidden: list[str] = []
    match = _SCHEME.match(url)
    head = match.group(0) if match else ""
    rest = url[len(head):]
    # 1. Credential query parameters: every 'name=' after a '?', '&' or '#', wherever it is
    #    (a raw '?' or '#' in a password cannot hide the query behind it). Done first, so that
    #    an '@' inside a hidden value cannot turn the text before it into "userinfo" and show
    #    the rest of the value as a host.
    spans: list[tuple[int, int]] = []
    for param in _PARAM_NAME.finditer(rest):
        if _is_sensitive(param.group(1)):
            end = _PARAM_SPLIT.search(rest, param.end())
            spans.append((param.end(), end.start() if end else len(rest)))
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(spans):
        if merged and start <= merged[-1][1]:  # inside (or touching) a value already hidden
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    if merged:
        pieces, last = [], 0
        for start, stop in merged:
            pieces += [rest[last:start], MASK]
            hidden.append(rest[start:stop])
            last = stop
        rest = "".join(pieces) + rest[last:]
    # 2. The userinfo: everything before the last '@' left, whatever it holds.
    at = rest.rfind("@")
    if at >= 0:
        info, after = rest[:at], rest[at + 1:]
        user, colon, password = info.partition(":")
        if colon:
            hidden.append(password)
            shown = f"{user if _CLEAN_USER.fullmatch(user) else MASK}:{MASK}"
        elif _CLEAN_USER.fullmatch(info):
            shown = info  # a user name alone: redis-py sends no password with it
        else:
            hidden.append(info)
            shown = MASK
        rest = f"{shown}@{after}"
    return head + rest, hidden


def redact(url: object) -> str:
    """``url`` with every credential replaced by ``***`` (for logs, errors and ``repr``).

    Parameters
    ----------
    url : str
        Any text meant as a URL, well formed or not, of any scheme.

    Returns
    -------
    str
        The URL with the password of its userinfo and the values of its credential query
        parameters hidden, control characters escaped. Something that is not a ``str`` is
        described by its type only.

    Notes
    -----
    O(len(url)); never raises.

    Examples
    --------
    >>> redact("unix://alice:hunter2@/run/redis.sock?db=0")
    'unix://alice:***@/run/redis.sock?db=0'
    >>> redact("redis://cache:6379/0?pass%77ord=hunter2")
    'redis://cache:6379/0?pass%77ord=***'
    """
    if not isinstance(url, str):
        return f"<{type(url).__name__}, not a URL>"
    try:
        return _printable(_mask(url)[0])
    except Exception:  # noqa: BLE001 - a redaction must never be the error
        return "<unparsable URL>"


def _credentials(url: str) -> set[str]:
    """Every credential in ``url`` as written and decoded, read suspiciously and as urllib
    (and so redis-py) reads it."""
    found = set(_mask(url)[1])
    match = _SCHEME.match(url)
    info = (url[match.end():] if match else url).rpartition("@")[0]
    user, colon, password = info.partition(":")  # the userinfo as written, query and all
    found.add(password if colon else ("" if _CLEAN_USER.fullmatch(info) else info))
    try:
        parts = urlsplit(url)
        found.add(parts.password or "")
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if _is_sensitive(name):
                found.add(value)
    except Exception:  # noqa: BLE001 - what urllib cannot read, redis-py cannot use either
        pass
    decoded: set[str] = set()
    for text in found:
        try:
            decoded.update((unquote(text), unquote_plus(text)))
        except Exception:  # noqa: BLE001 - keep the form as written
            pass
    return {text for text in found | decoded if text}


def scrub(text: str, url: object) -> str:
    """``text`` with every credential of ``url`` (as written or decoded) replaced by ``***``.

    For messages that may quote a URL's secrets, such as a client library's exception text;
    credentials are replaced longest first, and control characters escaped.

    Notes
    -----
    O(len(text) * number of credentials); never raises.

    Examples
    --------
    >>> scrub("WRONGPASS for hunter2", "redis://:hunter2@h:6379/0?password=x%2By")
    'WRONGPASS for ***'
    """
    try:
        if isinstance(url, str):
            for secret in sorted(_credentials(url), key=len, reverse=True):
                text = text.replace(secret, MASK)
        return _printable(text)
    except Exception:  # noqa: BLE001 - scrubbing must never be the error
        return "<message withheld>"
