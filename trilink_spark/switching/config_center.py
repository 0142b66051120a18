"""The dynamic configuration center: change strategy, sampling and switching mode at run time.

Seed 002 §4.2.2 publishes configuration changes over a publish/subscribe channel to the KeyBy
operator, so an operator can lower the sample rate or pin a strategy without restarting the job.
Here the subscriber is an :class:`~trilink_spark.AdaptivePartitioner` (through
:func:`~trilink_spark.switching.adaptive_foreach_batch`), and the channel is either in-process
(:class:`ConfigCenter`, the default) or Redis pub/sub (:class:`RedisConfigCenter`).

Every configuration is a full snapshot: a ``publish(update)`` merges the update into the latest
accepted snapshot and gives it the next **version**, an integer in ``[1, MAX_VERSION]``
(2**53 - 1). Subscribers accept a snapshot only when its version is higher than the last they
accepted, so a stale or replayed message changes nothing. Updates are validated field by field
(:data:`CONFIG_FIELDS`); a refused update is logged with its reason and counted in ``rejected``,
never raised inside a subscriber. With a ``secret`` each snapshot is signed with HMAC-SHA256
and unsigned or wrongly signed messages are refused before they are parsed.

Over Redis, snapshots also carry an **epoch**: a random id the first publisher stores beside an
empty channel. A Redis that restarts without persistence comes back empty, the next publisher
starts a new epoch at version 1, and subscribers that see the new epoch confirmed by the stored
snapshot resynchronise to it although its version is lower than theirs.

The wire format (``tl2``: a signed, bounded, canonical JSON line) and the validators are in
:mod:`trilink_spark.switching.wire`.

Examples
--------
>>> import trilink_spark as tl
>>> from trilink_spark.switching import ConfigCenter
>>> center = ConfigCenter()
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

import logging
import re
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigCenterUnavailableError, ConfigError
from ..errors import InvalidArgumentError
from ..errors import InvalidArgumentTypeError
from .._internal.urls import redact, scrub
from .wire import (MAX_VERSION, SignatureMismatch, Validator, check_version, decode_snapshot,
                   default_validator, describe_error, encode_message, secret_bytes, short_repr)

__all__ = ["ConfigCenter", "RedisConfigCenter", "find_center"]

logger = logging.getLogger(__name__)

Callback = Callable[[dict[str, Any]], None]

#: How many times publish re-reads the stored state when another publisher got in first.
_PUBLISH_ATTEMPTS = 16


#: The centers alive in this process, by id, so that a copy of a subscriber made in the same
#: process (``copy()``, a pickle round trip on the driver) follows the same center.
_LIVE: weakref.WeakValueDictionary[str, ConfigCenter] = weakref.WeakValueDictionary()


def find_center(center_id: str | None) -> ConfigCenter | None:
    """The live center with this :attr:`ConfigCenter.center_id` in this process, if any."""
    return None if center_id is None else _LIVE.get(center_id)


class ConfigCenter:
    """In-process configuration center (the default): publish, read and subscribe.

    Parameters
    ----------
    initial : mapping, optional
        A first configuration, accepted as version 1 (validated like any update).
    validator : callable, optional
        ``validator(update) -> checked copy`` that raises
        :class:`~trilink_spark.errors.ConfigError`; default: the checks of
        :data:`~trilink_spark.switching.CONFIG_FIELDS`
        (:func:`~trilink_spark.switching.validate_update`).

    Notes
    -----
    Thread-safe. Subscribers are called synchronously by :meth:`publish`, outside the lock; a
    subscriber that raises is logged and does not stop the others. State: the latest snapshot
    (a handful of fields). Versions lie in ``[1, MAX_VERSION]``. Cost: O(number of fields +
    number of subscribers) per update.
    """

    def __init__(self, initial: Mapping[str, Any] | None = None, *,
                 validator: Validator | None = None) -> None:
        if validator is not None and not callable(validator):
            raise InvalidArgumentTypeError("validator must be callable")
        self._validate: Validator = validator or default_validator()
        self._lock = threading.RLock()
        #: Identifies this center within the process (see :func:`find_center`).
        self.center_id = uuid.uuid4().hex
        _LIVE[self.center_id] = self
        self._current: dict[str, Any] = {}
        #: The epoch of the snapshot held (Redis only; ``None`` in process).
        self._epoch: str | None = None
        self._subscribers: list[Callback] = []
        #: Updates refused so far (invalid, stale, badly signed, unreadable).
        self.rejected = 0
        #: Why the last update was refused (``None`` if none was).
        self.last_rejection: str | None = None
        #: Times a snapshot of a new epoch replaced a newer-numbered one (Redis lost its data).
        self.resyncs = 0
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

        ``update`` may carry an explicit ``version``; it must exceed the current one and be at
        most :data:`MAX_VERSION`. Returns the accepted snapshot, or ``None`` when the update
        was refused (the reason is logged and kept in :attr:`last_rejection`).
        """
        try:
            checked = self._validate(update)
            if "version" in checked:
                check_version(checked["version"])
        except ConfigError as err:
            self._reject(str(err))
            return None
        with self._lock:
            version = checked.pop("version", self.version + 1)
            if version <= self.version:
                self._reject(f"stale version {version} (current is {self.version})")
                return None
            if version > MAX_VERSION:
                self._reject(f"no version left after {self.version} (at most {MAX_VERSION})")
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

    def _accept(self, snapshot: dict[str, Any], epoch: str | None = None, *,
                trusted: bool = True) -> bool:
        """Install ``snapshot`` if its version is higher than the one held.

        A snapshot of another ``epoch`` than the one held replaces it whatever the versions
        (a resynchronisation), but only when ``trusted``: its epoch was read from Redis (the
        stored snapshot, or this center's own compare-and-set), not from a pub/sub message.
        An untrusted one of another epoch is not installed.
        """
        with self._lock:
            held_epoch, held_version = self._epoch, self.version
            new_epoch = epoch is not None and epoch != held_epoch
            if new_epoch and not trusted:
                return False
            resync = new_epoch and held_version > 0
            if not resync and int(snapshot["version"]) <= held_version:
                return False
            self._current = dict(snapshot)
            if epoch is not None:
                self._epoch = epoch
            if resync:
                self.resyncs += 1
            subscribers = list(self._subscribers)
        if resync:
            logger.warning(
                "config resynchronised to version %s of epoch %s (held version %d of epoch %s): "
                "the store lost its data (a restart without persistence) or was reset",
                snapshot["version"], epoch, held_version, held_epoch,
            )
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


#: Compare-and-set of one snapshot. KEYS: snapshot, version, epoch. ARGV: message, version,
#: channel, epoch the message was signed under. Returns -1 when stored and published, -2 when
#: the stored state is not what the caller read (read it again), else the stored version (the
#: new one is stale). The caller's epoch is installed when none usable is stored (an empty
#: Redis). A stored version that is not 1 to 16 digits within 2**53 - 1 (written by something
#: else) counts as 0 and must come with a new epoch, so that subscribers resynchronise.
_PUBLISH_LUA = """
local max = 9007199254740991
local raw = redis.call('GET', KEYS[2])
local epoch = redis.call('GET', KEYS[3])
local current = 0
local usable = true
if raw then
  if string.len(raw) <= 16 and string.match(raw, '^%d+$') then
    current = tonumber(raw)
    usable = current <= max
  else
    usable = false
  end
end
local known = epoch and string.len(epoch) == 32 and string.match(epoch, '^[0-9a-f]+$')
local install = false
if not usable then
  if epoch == ARGV[4] then
    return -2
  end
  current = 0
  install = true
elseif not known then
  install = true
elseif epoch ~= ARGV[4] then
  return -2
end
local version = tonumber(ARGV[2])
if version <= current then
  return current
end
if install then
  redis.call('SET', KEYS[3], ARGV[4])
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return -1
"""

_STORED_VERSION = re.compile(rb"[0-9]{1,16}")
_STORED_EPOCH = re.compile(rb"[0-9a-f]{32}")


def _as_bytes(value: object) -> bytes | None:
    """A value read from Redis as bytes (a client made with ``decode_responses`` gives str)."""
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "surrogatepass")


class RedisConfigCenter(ConfigCenter):
    """Configuration center over Redis pub/sub, with the latest snapshot kept under a key.

    Parameters
    ----------
    url : str
        ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS) or
        ``unix://[user:password@]/path?db=N``, as redis-py's ``Redis.from_url`` reads it
        (``?ssl_ca_certs=...``, ``?password=...`` and the like work). The URL is never
        printed with its credentials: errors, ``repr`` and log lines show
        :func:`trilink_spark._internal.urls.redact` of it.
    channel : str
        Pub/sub channel. The snapshot is stored under ``{channel}:config``, its version under
        ``{channel}:version`` and its epoch under ``{channel}:epoch``.
    secret : str or bytes, optional
        Sign published snapshots with HMAC-SHA256 and refuse unsigned or wrongly signed ones;
        the signature is checked on the raw bytes before anything is parsed.
    socket_timeout : float
        Seconds before a Redis call is abandoned.
    backoff : (float, float)
        First and longest wait between reconnection attempts (doubling in between).
    validator : callable, optional
        As for :class:`ConfigCenter`.

    Raises
    ------
    InvalidArgumentError
        For a URL of another scheme or one redis-py cannot read, an empty channel or secret, a
        bad backoff. Nothing else: Redis being down or a bad stored snapshot is logged, and
        the center starts empty.

    Notes
    -----
    A subscriber thread (daemon) starts with the first :meth:`subscribe`. It subscribes to the
    channel and then reads the stored snapshot, so a restarted job resumes the latest accepted
    configuration and nothing published in between is missed. When Redis goes away the center
    keeps its last snapshot, and the thread reconnects with exponential backoff, reading the
    stored snapshot again after each reconnection. :meth:`publish` is a compare-and-set in one
    Lua script (store, bump the version, publish): concurrent publishers never overwrite a newer
    snapshot. Cost: one round trip to read and one to publish per update; a subscriber pays one
    signature check and one bounded parse per message, and one extra read when a message
    announces a new epoch.

    **Limits.** A message (pub/sub or stored) over
    :data:`~trilink_spark.switching.wire.MAX_MESSAGE_BYTES` (64 KiB), nesting JSON deeper than
    :data:`~trilink_spark.switching.wire.MAX_JSON_DEPTH`, holding an integer literal of more than
    24 characters, ``NaN`` or ``Infinity``, or a version outside ``[1, MAX_VERSION]`` (2**53 - 1,
    what Lua's doubles hold exactly) is refused. With a ``secret`` the size and the signature are
    checked before anything is parsed, so an unsigned message costs one HMAC. Whatever a message
    holds, the subscriber thread survives it: the refusal is logged and counted in
    :attr:`rejected`. Redis still delivers a long message whole before it is refused (its
    ``client-output-buffer-limit pubsub`` bounds that). A stored version that does not fit (written
    by an older release or by hand) is replaced by the next publish, which starts a new epoch.

    **Resynchronisation.** Each snapshot carries the *epoch* of its channel: a random id the
    first publisher stores under ``{channel}:epoch`` when there is none (an empty Redis). A
    Redis restarted without persistence comes back empty: its next publish starts a new epoch
    at version 1. A subscriber that reads a stored snapshot of another epoch than its own
    (at connection, reconnection or :meth:`refresh`) accepts it even though its version is
    lower than the one held, logs a warning that it resynchronised and counts it in
    :attr:`resyncs`. A pub/sub message of another epoch is not trusted on its own (an old
    signed message replayed would otherwise roll the configuration back): it makes the
    subscriber read the stored snapshot, and that one is accepted. Between the restart and the
    next publish, subscribers keep the configuration they held; publishers merge updates into
    what Redis holds, so the first update after a restart starts from an empty snapshot. A
    Redis restored from an older dump keeps its epoch: the updates made after the dump are
    lost, and as many further updates are refused as stale by subscribers that saw them
    (delete ``{channel}:epoch`` after such a restore to force a new epoch).

    Messages in the JSON envelope of earlier releases are still read by centers without a
    secret (they carry no epoch); a center with a secret refuses them, so a signed channel
    must be published to once after upgrading.

    Examples
    --------
    >>> import trilink_spark as tl
    >>> from trilink_spark.switching import RedisConfigCenter
    >>> center = RedisConfigCenter("redis://:pw@127.0.0.1:6390/0", secret="s")  # doctest: +SKIP
    >>> center.publish({"strategy": "least_count", "mode": "manual"})  # doctest: +SKIP
    >>> RedisConfigCenter("http://:hunter2@h:1/0")
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: url must be a redis://, rediss:// or unix:// URL, got 'http://:***@h:1/0'
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

        if not isinstance(url, str):
            raise InvalidArgumentError(f"url must be a str, got {type(url).__name__}")
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise InvalidArgumentError(
                f"url must be a redis://, rediss:// or unix:// URL, got {redact(url)!r}"
            )
        if not isinstance(channel, str) or not channel:
            raise InvalidArgumentError("channel must be a non-empty str")
        if backoff[0] <= 0 or backoff[1] < backoff[0]:
            raise InvalidArgumentError(f"backoff must be (first > 0, longest >= first), got {backoff}")
        key = secret_bytes(secret)
        try:
            client = redis.Redis.from_url(
                url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
            )
            # builds (does not open) a connection: an unknown ?parameter fails here, not later
            pool = client.connection_pool
            pool.connection_class(**pool.connection_kwargs)
        except Exception as err:  # noqa: BLE001 - redis-py's reasons may quote the URL
            # its text is kept only when the URL holds no credential at all: a raw '/' in a
            # password makes urllib read part of it as a port, which the message quotes
            detail = describe_error(err) if redact(url) == url else type(err).__name__
            raise InvalidArgumentError(
                f"url {redact(url)!r} is not a Redis URL redis-py can use ({detail})"
            ) from None
        super().__init__(validator=validator)
        self._url = url
        self.channel = channel
        self.key = f"{channel}:config"
        self.version_key = f"{channel}:version"
        self.epoch_key = f"{channel}:epoch"
        self._secret = key
        self._backoff = backoff
        self._client = client
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

    @property
    def epoch(self) -> str | None:
        """The epoch of the snapshot held (``None`` before the first, or for an old one)."""
        with self._lock:
            return self._epoch

    # ------------------------------------------------------------------ Redis I/O
    def _unavailable(self, err: Exception) -> ConfigCenterUnavailableError:
        import redis

        lost = isinstance(err, (redis.ConnectionError, redis.TimeoutError, OSError))
        return ConfigCenterUnavailableError(
            f"Redis at {redact(self._url)} {'is unreachable' if lost else 'refused a command'} "
            f"({scrub(describe_error(err), self._url)})"
        )

    def _decode_stored(self, raw: object, *, publishing: bool = False
                       ) -> tuple[dict[str, Any], str | None] | None:
        """The stored snapshot checked, or ``None`` when refused (logged, counted). When
        ``publishing``, one signed with another secret raises :class:`SignatureMismatch`
        instead (the caller refuses the update)."""
        try:
            return decode_snapshot(raw, self._secret, self._validate)
        except Exception as err:  # noqa: BLE001 - a bad snapshot is refused, never raised
            if publishing and isinstance(err, SignatureMismatch):
                raise
            reason = str(err) if isinstance(err, ConfigError) else describe_error(err)
            self._reject(f"stored config under {self.key!r} refused: {reason}")
            return None

    def _fetch(self) -> tuple[dict[str, Any], str | None] | None:
        """The stored snapshot and its epoch, checked (``None``: none, or refused)."""
        import redis

        try:
            raw = self._client.get(self.key)
        except (redis.RedisError, OSError) as err:
            raise self._unavailable(err) from None
        return None if raw is None else self._decode_stored(raw)

    def refresh(self) -> dict[str, Any]:
        """Read the stored snapshot now and accept it if newer, or if of another epoch
        (resynchronisation); returns :meth:`current`.

        Raises :class:`~trilink_spark.errors.ConfigCenterUnavailableError` when Redis cannot be
        reached. Cost: one round trip.
        """
        stored = self._fetch()
        if stored is not None:
            self._accept(*stored)
        return self.current()

    def stored(self) -> dict[str, Any] | None:
        """The snapshot stored in Redis right now (validated), without accepting it.

        Cost: one round trip.
        """
        stored = self._fetch()
        return None if stored is None else stored[0]

    def publish(self, update: Mapping[str, Any]) -> dict[str, Any] | None:
        """Validate, merge into the stored snapshot, store and publish (compare-and-set).

        Returns the accepted snapshot or ``None`` when refused (logged, :attr:`last_rejection`).
        Raises :class:`~trilink_spark.errors.ConfigCenterUnavailableError` when Redis cannot be
        reached: nothing was stored or published then. On an empty Redis (first use, or a restart
        without persistence) it starts a new epoch. A stored snapshot signed with another secret is
        never overwritten (the update is refused); one refused for another reason (an older format,
        a field no longer valid) is replaced by one merged from nothing.

        Cost: two round trips (read, compare-and-set), more when publishers race.
        """
        import redis

        try:
            checked = self._validate(update)
            explicit = checked.pop("version", None)
            if explicit is not None:
                check_version(explicit)
        except ConfigError as err:
            self._reject(str(err))
            return None
        for _attempt in range(_PUBLISH_ATTEMPTS):
            try:
                raw_config, raw_version, raw_epoch = self._client.mget(
                    [self.key, self.version_key, self.epoch_key])
            except (redis.RedisError, OSError) as err:
                raise self._unavailable(err) from None
            raw_version, raw_epoch = _as_bytes(raw_version), _as_bytes(raw_epoch)
            try:
                stored = (None if raw_config is None
                          else self._decode_stored(raw_config, publishing=True))
            except SignatureMismatch:
                # most likely this publisher has the wrong secret: never overwrite then
                self._reject(f"stored config under {self.key!r} is signed with another secret; "
                             "not publishing over it (check the secret, or delete the key)")
                return None
            if raw_config is not None and stored is None:
                logger.warning("publishing over the refused config stored under %r, merged "
                               "from nothing", self.key)
            base = {} if stored is None else stored[0]
            usable = raw_version is None or (
                _STORED_VERSION.fullmatch(raw_version) is not None
                and int(raw_version) <= MAX_VERSION
            )
            current = int(raw_version) if raw_version is not None and usable else 0
            fresh = not usable or raw_epoch is None or not _STORED_EPOCH.fullmatch(raw_epoch)
            if not usable:
                logger.warning("stored version under %r is unusable (%s); this publish starts "
                               "a new epoch", self.version_key, short_repr(raw_version))
            epoch = uuid.uuid4().hex if fresh or raw_epoch is None else raw_epoch.decode("ascii")
            version = explicit if explicit is not None else current + 1
            if version <= current:
                self._reject(f"stale version {version} (stored is {current})")
                return None
            if version > MAX_VERSION:
                self._reject(f"no version left after {current} (at most {MAX_VERSION}); "
                             f"delete {self.version_key!r} and {self.epoch_key!r} to start a "
                             "new epoch")
                return None
            snapshot = {**base, **checked, "version": version}
            message = encode_message(snapshot, self._secret, epoch)
            try:
                result = int(self._script(
                    keys=[self.key, self.version_key, self.epoch_key],
                    args=[message, version, self.channel, epoch],
                ))
            except (redis.RedisError, OSError) as err:
                raise self._unavailable(err) from None
            if result == -1:
                if fresh:
                    logger.info("config channel %r starts epoch %s at version %d",
                                self.channel, epoch, version)
                self._accept(snapshot, epoch)
                return snapshot
            if result >= 0 and explicit is not None:
                self._reject(f"stale version {version} (stored is {result})")
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

    def _on_raw(self, raw: object) -> None:
        """Handle one pub/sub message; never raises (the subscriber thread must live on)."""
        try:
            self._on_message(raw)
        except Exception as err:  # noqa: BLE001 - one message must not stop the subscriber
            logger.debug("config message handling failed", exc_info=True)
            self._reject(f"message could not be handled ({scrub(describe_error(err), self._url)})")

    def _on_message(self, raw: object) -> None:
        try:
            snapshot, epoch = decode_snapshot(raw, self._secret, self._validate)
        except ConfigError as err:
            self._reject(str(err))
            return
        for _attempt in range(3):  # again only when another thread changed what is held
            with self._lock:
                held_epoch, held_version, held = self._epoch, self.version, dict(self._current)
            fresh = held_epoch is None and held_version == 0  # nothing held yet: adopt it
            if epoch is not None and epoch != held_epoch and not fresh:
                self._confirm_epoch(epoch)
                return
            version = int(snapshot["version"])
            if version <= held_version:
                if version == held_version and snapshot == held:
                    logger.debug("config version %d received again (own publish or replay)",
                                 version)
                else:
                    self._reject(f"stale version {version} (current is {held_version})")
                return
            if self._accept(snapshot, epoch, trusted=fresh):
                return
        self._reject(f"version {snapshot['version']} lost a race with another update")

    def _confirm_epoch(self, epoch: str) -> None:
        """A message of another epoch: resynchronise from the stored snapshot, which Redis
        holds only if a publisher wrote it there."""
        try:
            stored = self._fetch()
        except ConfigCenterUnavailableError as err:
            self._reject(f"message of epoch {epoch} not confirmed: {err}")
            return
        stored_epoch = None if stored is None else stored[1]
        if stored is not None and stored_epoch is not None:
            self._accept(*stored)
        if stored_epoch != epoch:
            self._reject(f"message of epoch {epoch} refused: Redis holds "
                         f"{'epoch ' + stored_epoch if stored_epoch else 'no usable snapshot'}")

    def _listen(self) -> None:
        import redis

        delay = self._backoff[0]
        try:
            while not self._stop.is_set():
                pubsub = None
                try:
                    pubsub = self._client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                    pubsub.subscribe(self.channel)
                    self.refresh()  # after subscribing: nothing published meanwhile is missed
                    self.connections += 1
                    self.connected.set()
                    delay = self._backoff[0]
                    while not self._stop.is_set():
                        message = pubsub.get_message(timeout=0.2)
                        if message is not None and message.get("type") == "message":
                            self._on_raw(message.get("data"))
                except Exception as err:  # noqa: BLE001 - the thread must outlive any failure
                    self.connected.clear()
                    lost = isinstance(err, (redis.ConnectionError, redis.TimeoutError, OSError,
                                            ConfigCenterUnavailableError))
                    logger.warning(
                        "config center %s %s (%s); keeping version %d, retrying in %.1f s",
                        redact(self._url), "lost" if lost else "failed",
                        scrub(describe_error(err), self._url), self.version, delay,
                    )
                    self._stop.wait(delay)
                    delay = min(delay * 2, self._backoff[1])
                finally:
                    if pubsub is not None:
                        try:
                            pubsub.close()
                        except Exception:  # closing a dead connection may fail; nothing to keep
                            logger.debug("closing pubsub failed", exc_info=True)
        finally:
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
