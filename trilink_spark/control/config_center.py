"""The dynamic configuration center: change strategy, sampling and switching mode at run time.

Seed 002 §4.2.2 publishes configuration changes over a publish/subscribe channel to the KeyBy
operator, so an operator can lower the sample rate or pin a strategy without restarting the job.
Here the subscriber is an :class:`~trilink_spark.AdaptivePartitioner` (through
:func:`~trilink_spark.adaptive_foreach_batch`), and the channel is either in-process
(:class:`ConfigCenter`, the default) or Redis pub/sub (:class:`RedisConfigCenter`).

Every configuration is a full snapshot: a ``publish(update)`` merges the update into the latest
accepted snapshot and gives it the next **version**. Subscribers accept a snapshot only when its
version is higher than the last they accepted, so a stale or replayed message changes nothing.
Updates are validated field by field (:data:`CONFIG_FIELDS`); a refused update is logged with
its reason and counted in ``rejected``, never raised inside a subscriber. With a ``secret`` each
snapshot is signed with HMAC-SHA256 and unsigned or wrongly signed messages are refused.

Examples
--------
>>> import trilink_spark as tl
>>> center = tl.ConfigCenter()
>>> seen = []
>>> unsubscribe = center.subscribe(seen.append)
>>> center.publish({"sample_rate": 0.05, "mode": "quantity"})["version"]
1
>>> center.publish({"sample_rate": 7}) is None  # out of range: refused, logged
True
>>> seen[-1] == {"version": 1, "sample_rate": 0.05, "mode": "quantity"}
True
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigCenterUnavailableError, ConfigError, ConfigTypeError
from ..errors import InvalidArgumentError
from ..errors import InvalidArgumentTypeError
from ..urls import redact

__all__ = [
    "Validator",
    "ConfigCenter",
    "RedisConfigCenter",
    "sign_config",
    "accept_any",
    "find_center",
    "set_default_validator",
]

logger = logging.getLogger(__name__)

Callback = Callable[[dict[str, Any]], None]
#: Checks one update and returns its validated copy, or raises ConfigError with the reason.
Validator = Callable[[Mapping[str, Any]], dict[str, Any]]


def accept_any(update: Mapping[str, Any]) -> dict[str, Any]:
    """A validator that checks only the shape: a mapping with string field names and a
    positive integer ``version`` when one is given."""
    if not isinstance(update, Mapping):
        raise ConfigTypeError(f"a config update must be a mapping, got {type(update).__name__}")
    if any(not isinstance(k, str) for k in update):
        raise ConfigTypeError("config field names must be str")
    version = update.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or version < 1):
        raise ConfigError(f"version must be an integer >= 1, got {version!r}")
    return dict(update)


_default_validator: Validator = accept_any


def set_default_validator(validator: Validator) -> None:
    """The validator of centers created without one (the package installs the checks of
    :data:`~trilink_spark.CONFIG_FIELDS` when it is imported)."""
    global _default_validator
    if not callable(validator):
        raise InvalidArgumentTypeError("validator must be callable")
    _default_validator = validator


#: The centers alive in this process, by id, so that a copy of a subscriber made in the same
#: process (``copy()``, a pickle round trip on the driver) follows the same center.
_LIVE: weakref.WeakValueDictionary[str, ConfigCenter] = weakref.WeakValueDictionary()


def find_center(center_id: str | None) -> ConfigCenter | None:
    """The live center with this :attr:`ConfigCenter.center_id` in this process, if any."""
    return None if center_id is None else _LIVE.get(center_id)


def _canonical(config: Mapping[str, Any]) -> bytes:
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _secret_bytes(secret: str | bytes | None) -> bytes | None:
    if secret is None:
        return None
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, bytes) or not secret:
        raise InvalidArgumentError("secret must be a non-empty str or bytes")
    return secret


def sign_config(config: Mapping[str, Any], secret: str | bytes) -> str:
    """HMAC-SHA256 (hex) of the canonical JSON form of ``config``."""
    key = _secret_bytes(secret) or b""
    return hmac.new(key, _canonical(config), hashlib.sha256).hexdigest()


def encode_message(config: Mapping[str, Any], secret: str | bytes | None) -> str:
    """The wire form: ``{"config": {...}, "sig": "<hex>"}`` (``sig`` only with a secret)."""
    envelope: dict[str, Any] = {"config": dict(config)}
    if secret is not None:
        envelope["sig"] = sign_config(config, secret)
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"))


def decode_message(raw: str | bytes, secret: str | bytes | None,
                   validator: Validator | None = None) -> dict[str, Any]:
    """Parse, authenticate and validate one wire message; raises ConfigError with the reason."""
    try:
        envelope = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"message is not JSON: {err}") from None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("config"), dict):
        raise ConfigError("message must be a JSON object with a 'config' object")
    config = envelope["config"]
    if secret is not None:
        sig = envelope.get("sig")
        if not isinstance(sig, str):
            raise ConfigError("message is unsigned but this center requires a signature")
        if not hmac.compare_digest(sig, sign_config(config, secret)):
            raise ConfigError("message signature does not match (wrong secret or altered)")
    checked = (validator or _default_validator)(config)
    if "version" not in checked:
        raise ConfigError("message has no version")
    return checked


class ConfigCenter:
    """In-process configuration center (the default): publish, read and subscribe.

    Parameters
    ----------
    initial : mapping, optional
        A first configuration, accepted as version 1 (validated like any update).
    validator : callable, optional
        ``validator(update) -> checked copy`` that raises
        :class:`~trilink_spark.ConfigError`; default: the checks of
        :data:`~trilink_spark.CONFIG_FIELDS` (:func:`~trilink_spark.validate_update`).

    Notes
    -----
    Thread-safe. Subscribers are called synchronously by :meth:`publish`, outside the lock; a
    subscriber that raises is logged and does not stop the others. State: the latest snapshot
    (a handful of fields).
    """

    def __init__(self, initial: Mapping[str, Any] | None = None, *,
                 validator: Validator | None = None) -> None:
        if validator is not None and not callable(validator):
            raise InvalidArgumentTypeError("validator must be callable")
        self._validate: Validator = validator or _default_validator
        self._lock = threading.RLock()
        #: Identifies this center within the process (see :func:`find_center`).
        self.center_id = uuid.uuid4().hex
        _LIVE[self.center_id] = self
        self._current: dict[str, Any] = {}
        self._subscribers: list[Callback] = []
        #: Updates refused so far (invalid, stale, badly signed).
        self.rejected = 0
        #: Why the last update was refused (``None`` if none was).
        self.last_rejection: str | None = None
        if initial is not None and self.publish(initial) is None:
            raise ConfigError(f"initial config refused: {self.last_rejection}")

    # ------------------------------------------------------------------ reading
    def current(self) -> dict[str, Any]:
        """The latest accepted snapshot (``{}`` before the first), ``version`` included."""
        with self._lock:
            return dict(self._current)

    @property
    def version(self) -> int:
        """Version of the latest accepted snapshot (0 before the first)."""
        with self._lock:
            return int(self._current.get("version", 0))

    def subscribe(self, callback: Callback) -> Callable[[], None]:
        """Call ``callback(snapshot)`` now (if a snapshot exists) and on every accepted one.

        Returns a function that unsubscribes.
        """
        if not callable(callback):
            raise InvalidArgumentTypeError(f"callback must be callable, got {type(callback).__name__}")
        with self._lock:
            self._subscribers.append(callback)
            snapshot = dict(self._current)
        if snapshot:
            self._notify([callback], snapshot)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    # ------------------------------------------------------------------ writing
    def publish(self, update: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge ``update`` into the current snapshot under the next version and notify.

        ``update`` may carry an explicit ``version``; it must exceed the current one. Returns
        the accepted snapshot, or ``None`` when the update was refused (the reason is logged and
        kept in :attr:`last_rejection`).
        """
        try:
            checked = self._validate(update)
        except ConfigError as err:
            self._reject(str(err))
            return None
        with self._lock:
            version = checked.pop("version", self.version + 1)
            if version <= self.version:
                self._reject(f"stale version {version} (current is {self.version})")
                return None
            snapshot = {**self._current, **checked, "version": version}
        return snapshot if self._accept(snapshot) else None

    # ------------------------------------------------------------------ internals
    def _reject(self, reason: str) -> None:
        # Log first: a caller that waits on ``rejected`` must find the reason already logged.
        logger.warning("config update refused: %s", reason)
        with self._lock:
            self.last_rejection = reason
            self.rejected += 1

    def _accept(self, snapshot: dict[str, Any]) -> bool:
        with self._lock:
            if int(snapshot["version"]) <= self.version:
                return False
            self._current = dict(snapshot)
            subscribers = list(self._subscribers)
        logger.info("config version %s accepted: %s", snapshot["version"], snapshot)
        self._notify(subscribers, snapshot)
        return True

    @staticmethod
    def _notify(subscribers: list[Callback], snapshot: dict[str, Any]) -> None:
        for callback in subscribers:
            try:
                callback(dict(snapshot))
            except Exception:  # a subscriber's bug must not stop the others
                logger.exception("config subscriber %r failed", callback)

    def close(self) -> None:
        """Drop every subscriber (the in-process center holds nothing else)."""
        with self._lock:
            self._subscribers.clear()

    def __enter__(self) -> ConfigCenter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} lives in the driver and cannot be pickled")


_PUBLISH_LUA = """
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
local version = tonumber(ARGV[2])
if version <= current then
  return current
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return -1
"""


class RedisConfigCenter(ConfigCenter):
    """Configuration center over Redis pub/sub, with the latest snapshot kept under a key.

    Parameters
    ----------
    url : str
        ``redis://[user:password@]host:port/db`` or ``rediss://...`` (TLS), as redis-py's
        ``Redis.from_url`` reads it (``?ssl_ca_certs=...`` and the like work).
    channel : str
        Pub/sub channel. The snapshot is stored under ``{channel}:config`` and its version
        under ``{channel}:version``.
    secret : str or bytes, optional
        Sign published snapshots with HMAC-SHA256 and refuse unsigned or wrongly signed ones.
    socket_timeout : float
        Seconds before a Redis call is abandoned.
    backoff : (float, float)
        First and longest wait between reconnection attempts (doubling in between).

    Notes
    -----
    A subscriber thread (daemon) starts with the first :meth:`subscribe`. It subscribes to the
    channel and then reads the stored snapshot, so a restarted job resumes the latest accepted
    configuration and nothing published in between is missed. When Redis goes away the center
    keeps its last snapshot, and the thread reconnects with exponential backoff, reading the
    stored snapshot again after each reconnection. :meth:`publish` is a compare-and-set in one
    Lua script (store, bump the version, publish): concurrent publishers never overwrite a newer
    snapshot. Cost: one round trip to read and one to publish per update.

    Examples
    --------
    >>> center = tl.RedisConfigCenter("redis://:pw@127.0.0.1:6390/0", secret="s")  # doctest: +SKIP
    >>> center.publish({"strategy": "least_count", "mode": "manual"})  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        channel: str = "trilink:config",
        *,
        secret: str | bytes | None = None,
        socket_timeout: float = 2.0,
        backoff: tuple[float, float] = (0.1, 30.0),
        validator: Validator | None = None,
    ) -> None:
        import redis

        if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise InvalidArgumentError(f"url must be a redis://, rediss:// or unix:// URL, got {url!r}")
        if not isinstance(channel, str) or not channel:
            raise InvalidArgumentError("channel must be a non-empty str")
        if backoff[0] <= 0 or backoff[1] < backoff[0]:
            raise InvalidArgumentError(f"backoff must be (first > 0, longest >= first), got {backoff}")
        super().__init__(validator=validator)
        self._url = url
        self.channel = channel
        self.key = f"{channel}:config"
        self.version_key = f"{channel}:version"
        self._secret = _secret_bytes(secret)
        self._backoff = backoff
        self._client = redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        self._script = self._client.register_script(_PUBLISH_LUA)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Set while the subscriber thread is connected and subscribed.
        self.connected = threading.Event()
        #: Successful (re)connections of the subscriber thread.
        self.connections = 0
        try:
            self.refresh()
        except ConfigCenterUnavailableError as err:
            logger.warning("%s; starting without a stored config", err)

    # ------------------------------------------------------------------ Redis I/O
    def _unavailable(self, err: Exception) -> ConfigCenterUnavailableError:
        return ConfigCenterUnavailableError(
            f"Redis at {redact(self._url)} is unreachable ({type(err).__name__}: {err})"
        )

    def _read_stored(self) -> dict[str, Any] | None:
        import redis

        try:
            raw = self._client.get(self.key)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
            raise self._unavailable(err) from err
        if raw is None:
            return None
        try:
            return decode_message(raw, self._secret, self._validate)
        except ConfigError as err:
            self._reject(f"stored config under {self.key!r} refused: {err}")
            return None

    def refresh(self) -> dict[str, Any]:
        """Read the stored snapshot now and accept it if newer; returns :meth:`current`."""
        stored = self._read_stored()
        if stored is not None:
            self._accept(stored)
        return self.current()

    def stored(self) -> dict[str, Any] | None:
        """The snapshot stored in Redis right now (validated), without accepting it."""
        return self._read_stored()

    def publish(self, update: Mapping[str, Any]) -> dict[str, Any] | None:
        """Validate, merge into the stored snapshot, store and publish (compare-and-set).

        Returns the accepted snapshot or ``None`` when refused (logged, :attr:`last_rejection`).
        Raises :class:`~trilink_spark.ConfigCenterUnavailableError` when Redis cannot be reached:
        nothing was stored or published then.
        """
        import redis

        try:
            checked = self._validate(update)
        except ConfigError as err:
            self._reject(str(err))
            return None
        explicit = checked.pop("version", None)
        for _attempt in range(16):
            base = self._read_stored() or {}
            current = int(base.get("version", 0))
            version = explicit if explicit is not None else current + 1
            if version <= current:
                self._reject(f"stale version {version} (stored is {current})")
                return None
            snapshot = {**base, **checked, "version": version}
            message = encode_message(snapshot, self._secret)
            try:
                result = self._script(
                    keys=[self.key, self.version_key], args=[message, version, self.channel]
                )
            except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
                raise self._unavailable(err) from err
            if int(result) == -1:
                self._accept(snapshot)
                return snapshot
            if explicit is not None:
                self._reject(f"stale version {version} (stored is {int(result)})")
                return None
        self._reject("too many concurrent publishers; try again")
        return None

    # ------------------------------------------------------------------ subscribing
    def subscribe(self, callback: Callback) -> Callable[[], None]:
        """As :meth:`ConfigCenter.subscribe`; starts the subscriber thread on first use."""
        unsubscribe = super().subscribe(callback)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._listen, name=f"trilink-config-{self.channel}", daemon=True
                )
                self._thread.start()
        return unsubscribe

    def _on_raw(self, raw: bytes) -> None:
        try:
            snapshot = decode_message(raw, self._secret, self._validate)
        except ConfigError as err:
            self._reject(str(err))
            return
        if int(snapshot["version"]) <= self.version:
            self._reject(f"stale version {snapshot['version']} (current is {self.version})")
            return
        self._accept(snapshot)

    def _listen(self) -> None:
        import redis

        delay = self._backoff[0]
        while not self._stop.is_set():
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(self.channel)
                self.refresh()  # after subscribing: nothing published meanwhile is missed
                self.connections += 1
                self.connected.set()
                delay = self._backoff[0]
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message is not None and message.get("type") == "message":
                        self._on_raw(message["data"])
            except (redis.ConnectionError, redis.TimeoutError, OSError,
                    ConfigCenterUnavailableError) as err:
                self.connected.clear()
                logger.warning(
                    "config center %s lost (%s); keeping version %d, retrying in %.1f s",
                    redact(self._url), err, self.version, delay,
                )
                self._stop.wait(delay)
                delay = min(delay * 2, self._backoff[1])
            finally:
                try:
                    pubsub.close()
                except Exception:  # closing a dead connection may fail; nothing to keep
                    logger.debug("closing pubsub failed", exc_info=True)
        self.connected.clear()

    def close(self) -> None:
        """Stop the subscriber thread and close the connection pool."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5.0)
        super().close()
        self._client.close()

    def __repr__(self) -> str:
        return f"RedisConfigCenter({redact(self._url)!r}, channel={self.channel!r})"
