"""JSON records with a checksum: the small files of the keyed state store.

The manifest, placement records, swap plans and task timings are JSON objects. :func:`seal`
adds two keys to such an object before it is written, and :func:`unseal` checks and removes
them after it is parsed:

==================== =====================================================================
key                  value
==================== =====================================================================
``trilink.sealed``   :data:`SEAL_VERSION` (``1``)
``trilink.checksum`` ``"crc32:<8 hex>"``: the CRC-32 (``zlib.crc32``) of the object's
                     canonical JSON (keys sorted, no spaces, ASCII) without this key
==================== =====================================================================

The checksum is of what a reader parses, recomputed canonically, so a byte changed in a
sealed file is refused (:class:`~trilink_spark.errors.StateCorruptError`) unless it leaves
every parsed value as it was (``1e5`` read as ``1E5``): a damaged record is not read as
another one (CRC-32: every damage within 32 consecutive bits is seen, other damage but for a
chance of 2**-32; a guard against accidents, not against forgery). A record with neither key was written before sealing and is returned as it is
(still read, with nothing to check); a record with only one of them is a sealed one whose
other key was damaged, and is refused. The file stays JSON: other tools still read it.

Examples
--------
>>> import json
>>> data = json.dumps(seal({"committed": [3, 4]}))
>>> unseal(json.loads(data), "manifest.json")
{'committed': [3, 4]}
>>> unseal(json.loads(data.replace("4", "5")), "manifest.json")
Traceback (most recent call last):
...
trilink_spark.errors.StateCorruptError: manifest.json fails its checksum: ...
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from typing import Any

from ...errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError

__all__ = ["seal", "unseal", "SEALED_KEY", "CHECKSUM_KEY", "SEAL_VERSION"]

#: Key whose presence says the record is sealed.
SEALED_KEY = "trilink.sealed"
#: Key of the record's checksum.
CHECKSUM_KEY = "trilink.checksum"
#: Version of the seal.
SEAL_VERSION = 1
_SUM = re.compile(r"crc32:[0-9a-f]{8}")


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=True).encode("ascii")


def _crc(value: Any) -> str:
    return f"crc32:{zlib.crc32(_canonical(value)):08x}"


def seal(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` as JSON values, with :data:`SEALED_KEY` and its :data:`CHECKSUM_KEY`.

    Parameters
    ----------
    body : mapping of str
        JSON values (non-str keys of nested objects become str, as JSON writes them).

    Returns
    -------
    dict
        What to write (with any JSON formatting): :func:`unseal` of it parsed gives ``body``
        as JSON reads it back.

    Raises
    ------
    InvalidArgumentTypeError
        ``body`` is not a mapping, or holds a value JSON cannot write.
    InvalidArgumentError
        ``body`` already has one of the two keys.

    Notes
    -----
    Cost: two JSON encodings and one decoding of ``body``, O(size).
    """
    if not isinstance(body, Mapping):
        raise InvalidArgumentTypeError(f"a sealed record is a mapping, got {type(body).__name__}")
    clash = sorted(k for k in (SEALED_KEY, CHECKSUM_KEY) if k in body)
    if clash:
        raise InvalidArgumentError(
            f"the record already has {', '.join(clash)}: the keys seal() adds; pass the record "
            "unseal() returned")
    try:  # as a reader will parse it: int keys become str, tuples lists
        plain = json.loads(json.dumps({**body, SEALED_KEY: SEAL_VERSION}, allow_nan=True))
    except (TypeError, ValueError) as err:
        raise InvalidArgumentTypeError(f"a sealed record holds JSON values only ({err})") \
            from None
    out: dict[str, Any] = {**plain, CHECKSUM_KEY: _crc(plain)}
    return out


def unseal(value: Any, where: str) -> Any:
    """``value`` (a parsed JSON record) without its seal, once its checksum is checked.

    Parameters
    ----------
    value : any
        What ``json.loads`` gave. Anything but an object with either key is returned as it is
        (written before sealing, or not a record: the caller checks its shape).
    where : str
        The file, for error messages.

    Returns
    -------
    any
        ``value`` with the two keys removed (a new dict), or ``value`` itself.

    Raises
    ------
    StateCorruptError
        ``value`` has one of the two keys without the other, a malformed checksum, another
        seal version, or a checksum that does not match its content.

    Notes
    -----
    Cost: one canonical JSON encoding of ``value``, O(size).
    """
    if not isinstance(value, dict) or (SEALED_KEY not in value and CHECKSUM_KEY not in value):
        return value
    if SEALED_KEY not in value or CHECKSUM_KEY not in value:
        has, lacks = ((SEALED_KEY, CHECKSUM_KEY) if SEALED_KEY in value
                      else (CHECKSUM_KEY, SEALED_KEY))
        raise StateCorruptError(
            f"{where} has {has} but no {lacks}: a sealed record whose {lacks} key was "
            f"damaged{_DAMAGED}")
    body = dict(value)
    stored = body.pop(CHECKSUM_KEY)
    if not isinstance(stored, str) or not _SUM.fullmatch(stored):
        raise StateCorruptError(
            f"{where} has a malformed {CHECKSUM_KEY} ({str(stored)[:40]!r}; a sealed record has "
            f"'crc32:<8 hex digits>'){_DAMAGED}")
    found = _crc(body)
    if found != stored:
        raise StateCorruptError(
            f"{where} fails its checksum: its content has {found}, it was written with "
            f"{stored}; the file was damaged after it was written{_DAMAGED}")
    version = body.pop(SEALED_KEY)
    if version != SEAL_VERSION or isinstance(version, bool):
        raise StateCorruptError(
            f"{where} is sealed with version {str(version)[:20]!r}; this release reads seal "
            f"version {SEAL_VERSION} (written by another release?)")
    return body


_DAMAGED = " (restore it from a copy, or start over with an empty state path)"
