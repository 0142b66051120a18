"""The wire format of the configuration centers, and the validators they check snapshots with.

A configuration center (:mod:`trilink_spark.switching.config_center`) sends and stores every
snapshot as one message: this module signs, frames, bounds and parses it, and holds the
validator a center uses when it is given none (:func:`set_default_validator`; the package
installs :func:`~trilink_spark.switching.validate_update`).

Wire format (``tl2``), one line of ASCII::

    tl2.<signature>.<payload>

``payload`` is the canonical JSON (sorted keys, no spaces) of
``{"config": {...snapshot...}, "epoch": "<32 hex digits>" | null}`` and ``signature`` is the
lowercase hex HMAC-SHA256 of ``b"tl2." + payload`` under the secret, or empty without one. The
JSON envelope of earlier releases (``{"config": {...}, "sig": "..."}``) is still read by
centers without a secret; centers with a secret refuse it, since its signature could only be
checked after parsing it. After upgrading a signed channel, publish its full configuration once.

Examples
--------
>>> raw = encode_message({"version": 3, "mode": "manual"}, "s")
>>> raw.startswith("tl2.")
True
>>> decode_message(raw, "s", accept_any)
{'mode': 'manual', 'version': 3}
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from .._internal.validation import short_repr
from ..errors import ConfigError, ConfigTypeError, InvalidArgumentError, InvalidArgumentTypeError

__all__ = [
    "Validator",
    "MAX_VERSION",
    "MAX_MESSAGE_BYTES",
    "MAX_JSON_DEPTH",
    "SignatureMismatch",
    "sign_config",
    "encode_message",
    "decode_message",
    "decode_snapshot",
    "accept_any",
    "set_default_validator",
    "default_validator",
    "check_version",
    "secret_bytes",
    "short_repr",
    "describe_error",
]

#: Checks one update and returns its validated copy, or raises ConfigError with the reason.
Validator = Callable[[Mapping[str, Any]], dict[str, Any]]

#: Largest version (2**53 - 1): the largest integer a double, and so Redis' Lua, holds exactly.
MAX_VERSION: int = 2**53 - 1
#: Largest message, in bytes, a center reads; a longer one is refused before it is looked at.
MAX_MESSAGE_BYTES: int = 64 * 1024
#: Deepest nesting of JSON arrays and objects in a message (a snapshot needs 3).
MAX_JSON_DEPTH: int = 8
#: Longest integer literal, in digits, in a message (a version needs 16).
_MAX_INT_DIGITS = 24
_FRAME = b"tl2."
_SIG = re.compile(rb"[0-9a-f]{64}")
_EPOCH = re.compile(r"[0-9a-f]{32}")
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


class SignatureMismatch(ConfigError):
    """A message signed, but not with this center's secret (a publisher that reads one back
    stops: its own secret is not the channel's)."""


def describe_error(err: BaseException, limit: int = 200) -> str:
    """``Type: message``, shortened to ``limit`` characters; never raises. O(limit)."""
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 - a message that cannot be rendered
        text = ""
    if len(text) > limit:
        text = f"{text[: limit - 3]}..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def check_version(version: Any) -> int:
    """A snapshot's version: an ``int`` in ``[1, MAX_VERSION]``, else a
    :class:`~trilink_spark.errors.ConfigError` (:class:`~trilink_spark.errors.ConfigTypeError` for
    another
    type). O(1)."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigTypeError(f"version must be an integer, got {type(version).__name__}")
    if not 1 <= version <= MAX_VERSION:
        raise ConfigError(f"version must be in [1, {MAX_VERSION}], got {short_repr(version)}")
    return version


def accept_any(update: Mapping[str, Any]) -> dict[str, Any]:
    """A validator that checks only the shape: a mapping with string field names and a
    ``version`` in ``[1, MAX_VERSION]`` when one is given.

    Notes
    -----
    O(number of fields).
    """
    if not isinstance(update, Mapping):
        raise ConfigTypeError(f"a config update must be a mapping, got {type(update).__name__}")
    if any(not isinstance(k, str) for k in update):
        raise ConfigTypeError("config field names must be str")
    version = update.get("version")
    if version is not None:
        check_version(version)
    return dict(update)


_default_validator: Validator = accept_any


def set_default_validator(validator: Validator) -> None:
    """The validator of centers created without one (the package installs the checks of
    :data:`~trilink_spark.switching.CONFIG_FIELDS` when it is imported)."""
    global _default_validator
    if not callable(validator):
        raise InvalidArgumentTypeError("validator must be callable")
    _default_validator = validator


def default_validator() -> Validator:
    """The validator of centers created without one (see :func:`set_default_validator`)."""
    return _default_validator


# ---------------------------------------------------------------------- the format
def secret_bytes(secret: str | bytes | None) -> bytes | None:
    """A center's secret as bytes (``None`` for none); an empty or non-text secret is an
    :class:`~trilink_spark.errors.InvalidArgumentError`. O(len(secret))."""
    if secret is None:
        return None
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, bytes) or not secret:
        raise InvalidArgumentError("secret must be a non-empty str or bytes")
    return secret


def _payload(config: Mapping[str, Any], epoch: str | None) -> bytes:
    envelope = {"config": dict(config), "epoch": epoch}
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode("ascii")


def _mac(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, _FRAME + payload, hashlib.sha256).hexdigest().encode("ascii")


def sign_config(config: Mapping[str, Any], secret: str | bytes, epoch: str | None = None) -> str:
    """The signature of a ``tl2`` message: HMAC-SHA256 (hex) of ``b"tl2." + payload``.

    Notes
    -----
    O(size of the snapshot).
    """
    key = secret_bytes(secret) or b""
    return _mac(key, _payload(config, epoch)).decode("ascii")


def encode_message(config: Mapping[str, Any], secret: str | bytes | None,
                   epoch: str | None = None) -> str:
    """The wire form ``tl2.<signature>.<payload>`` of a snapshot (see the module's notes).

    Notes
    -----
    O(size of the snapshot).
    """
    payload = _payload(config, epoch)
    key = secret_bytes(secret)
    sig = _mac(key, payload) if key is not None else b""
    return (_FRAME + sig + b"." + payload).decode("ascii")


def _parse_int(text: str) -> int:
    if len(text) > _MAX_INT_DIGITS:
        raise ConfigError(f"message has an integer of {len(text)} characters "
                          f"(at most {_MAX_INT_DIGITS})")
    return int(text)


def _refuse_constant(name: str) -> Any:
    raise ConfigError(f"message holds {name}, which is not JSON")


def _parse_json(data: bytes) -> Any:
    """Bounded JSON: nesting, integer length and constants checked, only ConfigError raised."""
    depth = deepest = 0
    for bracket in _BRACKET.finditer(_JSON_STRING.sub(b"", data)):
        depth += 1 if bracket.group() in (b"[", b"{") else -1
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            raise ConfigError(f"message nests JSON deeper than {MAX_JSON_DEPTH} levels")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("message is not UTF-8") from None
    try:
        return json.loads(text, parse_int=_parse_int, parse_constant=_refuse_constant)
    except json.JSONDecodeError as err:
        raise ConfigError(f"message is not JSON: {err.msg} at character {err.pos}") from None


def decode_snapshot(raw: object, secret: bytes | None,
                    validator: Validator | None) -> tuple[dict[str, Any], str | None]:
    """Bound, authenticate, parse and validate one message: ``(snapshot, epoch)``.

    As :func:`decode_message`, with the secret already as bytes (:func:`secret_bytes`), the
    epoch returned too, and a validator that raises something else than
    :class:`~trilink_spark.errors.ConfigError` left to the caller; a message signed with another
    secret raises :class:`SignatureMismatch`. O(len(raw)).
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ConfigError(f"message must be bytes, got {type(raw).__name__}")
    data = bytes(raw)
    if len(data) > MAX_MESSAGE_BYTES:
        raise ConfigError(f"message of {len(data)} bytes is over the limit of "
                          f"{MAX_MESSAGE_BYTES}")
    epoch: Any = None
    if data.startswith(_FRAME):
        sig, dot, payload = data[len(_FRAME):].partition(b".")
        if not dot:
            raise ConfigError("message is truncated: 'tl2.<signature>.<payload>' expected")
        if secret is not None:
            if not sig:
                raise ConfigError("message is unsigned but this center requires a signature")
            if not _SIG.fullmatch(sig) or not hmac.compare_digest(sig, _mac(secret, payload)):
                raise SignatureMismatch(
                    "message signature does not match (wrong secret or altered)")
        envelope = _parse_json(payload)
        if not isinstance(envelope, dict):
            raise ConfigError("message payload must be a JSON object")
        epoch = envelope.get("epoch")
        if epoch is not None and (not isinstance(epoch, str) or not _EPOCH.fullmatch(epoch)):
            raise ConfigError(f"message epoch must be 32 hex digits, got {short_repr(epoch)}")
    elif data.lstrip()[:1] == b"{":
        if secret is not None:
            raise ConfigError(
                "message is in the JSON envelope of earlier releases, whose signature can only "
                "be checked after parsing: a center with a secret refuses it (publish again)"
            )
        envelope = _parse_json(data)
        if not isinstance(envelope, dict):  # pragma: no cover - '{' starts an object
            raise ConfigError("message must be a JSON object")
    else:
        raise ConfigError("message is not a config message ('tl2.<signature>.<payload>')")
    config = envelope.get("config")
    if not isinstance(config, dict):
        raise ConfigError("message must hold a 'config' object")
    checked = (validator or _default_validator)(config)
    if "version" not in checked:
        raise ConfigError("message has no version")
    check_version(checked["version"])
    return checked, epoch


def decode_message(raw: str | bytes, secret: str | bytes | None,
                   validator: Validator | None = None) -> dict[str, Any]:
    """Bound, authenticate, parse and validate one wire message; its snapshot.

    The checks run cheapest and safest first: size (:data:`MAX_MESSAGE_BYTES`), then with a
    secret the signature over the raw payload bytes, then the JSON nesting
    (:data:`MAX_JSON_DEPTH`) and integer lengths, and only then parsing and validation.

    Raises
    ------
    ConfigError
        With the reason, whatever is wrong with the message (nothing else is raised).

    Notes
    -----
    O(len(raw)); nothing received is evaluated or unpickled.
    """
    key = secret_bytes(secret)
    try:
        return decode_snapshot(raw, key, validator)[0]
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - a validator's bug is this message's refusal
        raise ConfigError(f"message could not be read ({describe_error(err)})") from None
