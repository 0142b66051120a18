"""The configuration center under hostile input: unreadable messages, huge versions, a Redis
that restarts empty, and URLs whose credentials must never be printed."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import redis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from trilink_spark.errors import ConfigCenterUnavailableError, ConfigError, InvalidArgumentError
from trilink_spark.switching import ConfigCenter, RedisConfigCenter, validate_update
from trilink_spark.testing import free_port
from conftest import wait_for
from trilink_spark.cli import main
from trilink_spark.switching import wire as cc
from trilink_spark.switching.wire import encode_message
from trilink_spark._internal.urls import redact

LOGGER = "trilink_spark.switching.config_center"
LIMIT = 2**53 - 1  # the largest version (MAX_VERSION)
DEEP_100K = b"[" * 100_000 + b"]" * 100_000  # over the size limit as well
DEEP_20K = b"[" * 20_000 + b"]" * 20_000  # under the size limit: the depth bound refuses it
BIG_INT = b'{"config": {"version": ' + b"7" * 5000 + b"}}"


@pytest.fixture()
def channel(request: pytest.FixtureRequest) -> str:
    return f"hard:{request.node.name}"


@pytest.fixture()
def raw_client(redis_server: Any) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def _framed(config: dict[str, Any], secret: bytes, epoch: str | None = None) -> bytes:
    """A ``tl2`` message built by hand (what a holder of the secret can send)."""
    payload = json.dumps({"config": config, "epoch": epoch}, sort_keys=True,
                         separators=(",", ":")).encode()
    sig = hmac.new(secret, b"tl2." + payload, hashlib.sha256).hexdigest().encode()
    return b"tl2." + sig + b"." + payload


# ---------------------------------------------------------------------- 1. hostile messages
@pytest.mark.parametrize("hostile", [DEEP_100K, DEEP_20K, BIG_INT],
                         ids=["nested-100k", "nested-20k", "int-5000-digits"])
def test_unsigned_hostile_message_does_not_kill_the_signed_subscriber(
    redis_server: Any, raw_client: redis.Redis, channel: str, hostile: bytes
) -> None:
    secret = "hmac-key"
    subscriber = RedisConfigCenter(redis_server.url, channel, secret=secret)
    seen: list[dict[str, Any]] = []
    try:
        subscriber.subscribe(seen.append)
        wait_for(subscriber.connected.is_set)
        raw_client.publish(channel, hostile)
        wait_for(lambda: subscriber.rejected >= 1)
        with RedisConfigCenter(redis_server.url, channel, secret=secret) as publisher:
            assert publisher.publish({"mode": "manual"}) is not None
        wait_for(lambda: len(seen) == 1)
        assert seen[-1]["mode"] == "manual"
        assert subscriber._thread is not None and subscriber._thread.is_alive()
        assert subscriber.connected.is_set()
        assert subscriber.rejected == 1
    finally:
        subscriber.close()


@pytest.mark.parametrize("hostile", [DEEP_20K, BIG_INT, b'{"config": ' + DEEP_20K + b"}"],
                         ids=["nested-20k", "int-5000-digits", "nested-config"])
def test_hostile_message_does_not_kill_the_unsigned_subscriber(
    redis_server: Any, raw_client: redis.Redis, channel: str, hostile: bytes
) -> None:
    subscriber = RedisConfigCenter(redis_server.url, channel)
    seen: list[dict[str, Any]] = []
    try:
        subscriber.subscribe(seen.append)
        wait_for(subscriber.connected.is_set)
        raw_client.publish(channel, hostile)
        wait_for(lambda: subscriber.rejected >= 1)
        with RedisConfigCenter(redis_server.url, channel) as publisher:
            assert publisher.publish({"quantity": 3}) is not None
        wait_for(lambda: len(seen) == 1)
        assert subscriber._thread is not None and subscriber._thread.is_alive()
        assert subscriber.connected.is_set()
    finally:
        subscriber.close()


def test_message_size_is_bounded_before_the_signature_or_parsing(
    redis_server: Any, raw_client: redis.Redis, channel: str, caplog: pytest.LogCaptureFixture
) -> None:
    subscriber = RedisConfigCenter(redis_server.url, channel, secret="k")
    try:
        subscriber.subscribe(lambda s: None)
        wait_for(subscriber.connected.is_set)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            raw_client.publish(channel, b'{"config": {"version": 1}, "pad": "' + b"x" * 70_000
                               + b'"}')
            wait_for(lambda: subscriber.rejected >= 1)
        assert "65536" in (subscriber.last_rejection or "")
    finally:
        subscriber.close()


def test_signature_is_checked_on_raw_bytes_before_any_parsing(monkeypatch: Any) -> None:
    def no_parsing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an unauthenticated message was parsed")

    monkeypatch.setattr(json, "loads", no_parsing)
    secret = b"k"
    unsigned = [
        DEEP_20K,
        BIG_INT,
        b'{"config": {"version": 1, "mode": "manual"}}',
        encode_message({"version": 1, "mode": "manual"}, None).encode(),
        encode_message({"version": 1, "mode": "manual"}, "other secret").encode(),
        b"tl2." + b"0" * 64 + b"." + DEEP_20K,
    ]
    for raw in unsigned:
        with pytest.raises(ConfigError):
            cc.decode_message(raw, secret)


def test_signed_but_hostile_payload_is_bounded(monkeypatch: Any) -> None:
    secret = b"k"
    deep: Any = "x"
    for _ in range(40):
        deep = [deep]
    for config in ({"version": 1, "mode": deep}, {"version": 10**30}):
        with pytest.raises(ConfigError):
            cc.decode_message(_framed(config, secret), secret)
    with pytest.raises(ConfigError, match="NaN"):
        cc.decode_message(b"tl2.." + b'{"config":{"version":1,"threshold":NaN},"epoch":null}', None)
    good = cc.decode_message(_framed({"version": 2, "candidates": ["hash", "least_count"]},
                                     secret), secret)
    assert good == {"version": 2, "candidates": ["hash", "least_count"]}


def test_a_validator_bug_does_not_kill_the_subscriber(
    redis_server: Any, channel: str
) -> None:
    calls: list[int] = []

    def flaky(update: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:  # the subscriber's first message
            raise RuntimeError("validator bug")
        return dict(update)

    subscriber = RedisConfigCenter(redis_server.url, channel, validator=flaky)
    try:
        seen: list[dict[str, Any]] = []
        subscriber.subscribe(seen.append)
        wait_for(subscriber.connected.is_set)
        with RedisConfigCenter(redis_server.url, channel) as publisher:
            publisher.publish({"mode": "manual"})
            wait_for(lambda: subscriber.rejected >= 1)
            publisher.publish({"mode": "quantity"})
        wait_for(lambda: len(seen) == 1)
        assert seen[-1]["mode"] == "quantity"
        assert subscriber._thread is not None and subscriber._thread.is_alive()
    finally:
        subscriber.close()


@pytest.mark.parametrize("stored", [DEEP_100K, DEEP_20K, BIG_INT],
                         ids=["nested-100k", "nested-20k", "int-5000-digits"])
@pytest.mark.parametrize("secret", [None, "k"])
def test_bad_stored_snapshot_is_refused_at_construction_not_raised(
    redis_server: Any, raw_client: redis.Redis, channel: str, stored: bytes,
    secret: str | None
) -> None:
    raw_client.set(f"{channel}:config", stored)
    with RedisConfigCenter(redis_server.url, channel, secret=secret) as center:
        assert center.current() == {}
        assert center.rejected == 1
        assert "stored config" in (center.last_rejection or "")
        assert center.stored() is None


# ---------------------------------------------------------------------- 2. versions
@pytest.mark.parametrize("version", [LIMIT + 1, 2**63, 2**64 + 5, 10**400])
def test_versions_above_2_53_are_refused_in_validation(version: int) -> None:
    with pytest.raises(ConfigError):
        validate_update({"version": version})
    with pytest.raises(ConfigError):
        cc.accept_any({"version": version})
    assert validate_update({"version": LIMIT}) == {"version": LIMIT}
    center = ConfigCenter()
    assert center.publish({"version": version}) is None
    assert center.publish({"version": LIMIT}) is not None
    assert center.publish({"mode": "manual"}) is None  # no version left after LIMIT


def test_huge_version_cannot_wedge_a_redis_channel(redis_server: Any, channel: str) -> None:
    with RedisConfigCenter(redis_server.url, channel) as publisher:
        assert publisher.publish({"version": 2**63}) is None
        assert publisher.publish({"version": 2**63, "mode": "manual"}) is None
        first = publisher.publish({"mode": "manual"})
        assert first is not None and first["version"] == 1
        assert publisher.publish({"quantity": 4}) is not None
        assert publisher.stored() == {"version": 2, "mode": "manual", "quantity": 4}


def test_huge_version_is_refused_on_receive(
    redis_server: Any, raw_client: redis.Redis, channel: str
) -> None:
    subscriber = RedisConfigCenter(redis_server.url, channel)
    seen: list[dict[str, Any]] = []
    try:
        subscriber.subscribe(seen.append)
        wait_for(subscriber.connected.is_set)
        raw_client.publish(channel, encode_message({"version": 2**63, "mode": "manual"}, None))
        raw_client.publish(channel, b'{"config": {"version": 9223372036854775809}}')
        wait_for(lambda: subscriber.rejected >= 2)
        assert subscriber.version == 0
        with RedisConfigCenter(redis_server.url, channel) as publisher:
            assert publisher.publish({"mode": "quantity"}) is not None
        wait_for(lambda: len(seen) == 1)
        assert seen[-1] == {"version": 1, "mode": "quantity"}
    finally:
        subscriber.close()


def test_unusable_stored_version_is_replaced_by_a_new_epoch(
    redis_server: Any, raw_client: redis.Redis, channel: str
) -> None:
    subscriber = RedisConfigCenter(redis_server.url, channel)
    seen: list[dict[str, Any]] = []
    try:
        with RedisConfigCenter(redis_server.url, channel) as publisher:
            for q in (1, 2, 3):
                publisher.publish({"quantity": q})
            subscriber.subscribe(seen.append)
            wait_for(subscriber.connected.is_set)
            # what an older release stored for a version of 2**63 + 1 (or a hand edit)
            raw_client.set(f"{channel}:version", b"9223372036854775809")
            snapshot = publisher.publish({"mode": "manual"})
            assert snapshot is not None and snapshot["version"] == 1
            assert snapshot["quantity"] == 3  # merged into what was stored
        wait_for(lambda: subscriber.current().get("mode") == "manual")
        assert subscriber.current()["version"] == 1
    finally:
        subscriber.close()


# ---------------------------------------------------------------------- 3. Redis restarts
def test_subscriber_resynchronises_after_redis_restart_without_persistence(
    own_redis: Any, channel: str, caplog: pytest.LogCaptureFixture
) -> None:
    kwargs: dict[str, Any] = {"secret": "k", "backoff": (0.05, 0.2), "socket_timeout": 0.5}
    publisher = RedisConfigCenter(own_redis.url, channel, **kwargs)
    subscriber = RedisConfigCenter(own_redis.url, channel, **kwargs)
    seen: list[dict[str, Any]] = []
    try:
        subscriber.subscribe(seen.append)
        wait_for(subscriber.connected.is_set)
        for q in (1, 2, 3):
            assert publisher.publish({"mode": "quantity", "quantity": q}) is not None
        wait_for(lambda: subscriber.version == 3)
        own_redis.stop()
        wait_for(lambda: not subscriber.connected.is_set())
        own_redis.start()  # memory only: it comes back empty
        wait_for(lambda: subscriber.connected.is_set() and subscriber.connections >= 2)
        assert subscriber.current()["quantity"] == 3  # nothing stored: keeps what it held
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            after = publisher.publish({"quantity": 9})
            assert after == {"version": 1, "quantity": 9}  # merged into the empty store
            wait_for(lambda: subscriber.current() == after)
        assert seen[-1] == after
        assert "resynchronised" in caplog.text
        assert publisher.current() == after
        assert publisher.publish({"quantity": 10}) == {"version": 2, "quantity": 10}
        wait_for(lambda: subscriber.current() == {"version": 2, "quantity": 10})
        # a restarted job reads the new epoch as well
        with RedisConfigCenter(own_redis.url, channel, **kwargs) as late:
            assert late.current() == {"version": 2, "quantity": 10}
    finally:
        publisher.close()
        subscriber.close()


def test_replayed_message_of_an_old_epoch_does_not_roll_back(
    own_redis: Any, channel: str
) -> None:
    kwargs: dict[str, Any] = {"secret": "k", "backoff": (0.05, 0.2), "socket_timeout": 0.5}
    captured: list[bytes] = []
    spy = redis.Redis.from_url(own_redis.url).pubsub(ignore_subscribe_messages=True)
    spy.subscribe(channel)
    publisher = RedisConfigCenter(own_redis.url, channel, **kwargs)
    subscriber = RedisConfigCenter(own_redis.url, channel, **kwargs)
    try:
        subscriber.subscribe(lambda s: None)
        wait_for(subscriber.connected.is_set)
        publisher.publish({"mode": "manual", "quantity": 1})
        message = None
        deadline = time.monotonic() + 5
        while message is None and time.monotonic() < deadline:
            message = spy.get_message(timeout=0.2)
        assert message is not None
        captured.append(message["data"])
        spy.close()
        own_redis.stop()
        own_redis.start()
        wait_for(lambda: subscriber.connected.is_set() and subscriber.connections >= 2)
        publisher.publish({"quantity": 5})
        publisher.publish({"quantity": 6})
        wait_for(lambda: subscriber.current() == {"version": 2, "quantity": 6})
        replayer = redis.Redis.from_url(own_redis.url)
        before = subscriber.rejected
        replayer.publish(channel, captured[0])  # signed, of the old epoch, version 1
        replayer.close()
        wait_for(lambda: subscriber.rejected > before)
        assert subscriber.current() == {"version": 2, "quantity": 6}
        assert "refused" in (subscriber.last_rejection or "")
    finally:
        publisher.close()
        subscriber.close()


# ---------------------------------------------------------------------- 4. credentials
def test_wrong_scheme_error_hides_the_password() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        RedisConfigCenter("http://:hunter2@h:1/0")
    assert "hunter2" not in str(info.value) and "***" in str(info.value)


def test_password_query_parameter_is_hidden_in_repr_errors_and_logs(
    caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?password=hunter2"
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        center = RedisConfigCenter(url, socket_timeout=0.3)
    try:
        assert "hunter2" not in repr(center) and "password=***" in repr(center)
        with pytest.raises(ConfigCenterUnavailableError) as info:
            center.publish({"mode": "manual"})
        assert "hunter2" not in str(info.value)
        assert "unreachable" in caplog.text and "hunter2" not in caplog.text
    finally:
        center.close()


def test_cli_error_hides_the_password(capsys: Any) -> None:
    assert main(["config", "get", "--redis", "http://u:hunter2@h:1/0"], io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and "u:***@h" in err


def test_unusable_url_error_hides_a_raw_password() -> None:
    # urllib reads 'hunter' as a port here: redis-py's own message would quote it
    with pytest.raises(InvalidArgumentError) as info:
        RedisConfigCenter("redis://:hunter/2@h:1/0")
    assert "hunter" not in str(info.value)


#: Every form redis-py reads a credential from, in several schemes, and URLs that do not parse.
FORMS = [
    "redis://alice:{pw}@cache:6379/0",
    "redis://:{pw}@cache:6379/0",
    "rediss://:{pw}@cache:6380/0?ssl_cert_reqs=none",
    "unix://alice:{pw}@/run/redis.sock?db=0",
    "redis://cache:6379/0?password={pw}",
    "redis://cache:6379/0?db=2&password={pw}&socket_timeout=3",
    "redis://cache:6379/0?username={pw}&password=x",
    "redis://cache:6379/0?PassWord={pw}",
    "http://:{pw}@cache:1/0",
    "ftp://user:{pw}@cache/0?password={pw}",
    "redis://:{pw}@[::1",
    "redis://:{pw}@cache:port/0",
    "cache:{pw}@cache:6379",
]
#: Printable ASCII and a few others; '*' is left out, since the mask is made of it.
PASSWORDS = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs"),
                           exclude_characters="*"),
    min_size=4, max_size=24,
)


def _hidden(pw: str, text: str) -> bool:
    return pw not in text and quote(pw, safe="") not in text


@settings(max_examples=300, deadline=None)
@given(form=st.sampled_from(FORMS), pw=PASSWORDS, encode=st.booleans())
def test_redact_never_shows_a_password(form: str, pw: str, encode: bool) -> None:
    written = quote(pw, safe="") if encode else pw
    template = form.replace("{pw}", "\0")
    assume(pw not in template and quote(pw, safe="") not in template)
    url = form.replace("{pw}", written)
    shown = redact(url)
    assert _hidden(pw, shown), (url, shown)
    assert "***" in shown


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(form=st.sampled_from([f for f in FORMS if f.startswith(("redis://", "rediss://"))
                             and "[" not in f]),
       pw=PASSWORDS)
def test_redis_config_center_never_shows_a_password(form: str, pw: str) -> None:
    port = free_port()
    template = form.replace("cache:6379", f"127.0.0.1:{port}").replace("cache:6380",
                                                                        f"127.0.0.1:{port}")
    assume(pw not in template.replace("{pw}", "\0"))
    url = template.replace("{pw}", quote(pw, safe=""))
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        # the scheme refused
        for wrong in ("http", "REDIS", "redis:/"):
            with pytest.raises(InvalidArgumentError) as info:
                RedisConfigCenter(url.replace(url.split("://")[0], wrong, 1))
            assert _hidden(pw, str(info.value)), str(info.value)
        try:
            center = RedisConfigCenter(url, socket_timeout=0.3)
        except InvalidArgumentError as err:  # e.g. 'cache:port'
            assert _hidden(pw, str(err)), str(err)
            return
        try:
            assert _hidden(pw, repr(center)), repr(center)
            with pytest.raises(ConfigCenterUnavailableError) as unavailable:
                center.publish({"mode": "manual"})
            assert _hidden(pw, str(unavailable.value)), str(unavailable.value)
        finally:
            center.close()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    for line in messages:
        assert _hidden(pw, line), line


def test_redact_handles_what_is_not_a_url() -> None:
    assert redact(None) == "<NoneType, not a URL>"
    assert redact("redis://:hunter2@h/0\nFAKE LOG LINE") == "redis://:***@h/0\\x0aFAKE LOG LINE"
    assert "hunter2" not in redact("redis://:hunt\ter2@h/0")


def test_subscriber_thread_clears_connected_when_it_ends(redis_server: Any, channel: str) -> None:
    center = RedisConfigCenter(redis_server.url, channel)
    center.subscribe(lambda s: None)
    wait_for(center.connected.is_set)
    center.close()
    assert not center.connected.is_set()
    assert center._thread is not None and not center._thread.is_alive()


def test_concurrent_first_publishers_agree_on_one_epoch(redis_server: Any, channel: str) -> None:
    centers = [RedisConfigCenter(redis_server.url, channel) for _ in range(4)]
    barrier = threading.Barrier(len(centers))
    results: list[dict[str, Any] | None] = [None] * len(centers)

    def first(i: int) -> None:
        barrier.wait()
        results[i] = centers[i].publish({"quantity": i + 1})

    threads = [threading.Thread(target=first, args=(i,)) for i in range(len(centers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert all(r is not None for r in results)
        assert sorted(r["version"] for r in results if r) == [1, 2, 3, 4]
        assert len({c.epoch for c in centers}) == 1
    finally:
        for c in centers:
            c.close()


# ---------------------------------------------------------------------- the format change
def test_messages_of_earlier_releases_are_read_without_a_secret(
    redis_server: Any, raw_client: redis.Redis, channel: str
) -> None:
    subscriber = RedisConfigCenter(redis_server.url, channel)
    seen: list[dict[str, Any]] = []
    try:
        subscriber.subscribe(seen.append)
        wait_for(subscriber.connected.is_set)
        raw_client.publish(channel, b'{"config":{"mode":"manual","version":5},"sig":"ab"}')
        wait_for(lambda: len(seen) == 1)
        assert seen[-1] == {"version": 5, "mode": "manual"}
    finally:
        subscriber.close()


def test_signed_channel_of_an_earlier_release_is_taken_over_by_one_publish(
    redis_server: Any, raw_client: redis.Redis, channel: str
) -> None:
    # what an earlier release stored: the JSON envelope, signed after parsing
    raw_client.set(f"{channel}:config",
                   b'{"config":{"mode":"manual","version":4},"sig":"' + b"0" * 64 + b'"}')
    raw_client.set(f"{channel}:version", b"4")
    with RedisConfigCenter(redis_server.url, channel, secret="k") as center:
        assert center.current() == {}  # refused: its signature cannot be checked first
        assert center.publish({"mode": "quantity"}) == {"version": 5, "mode": "quantity"}
        assert center.stored() == {"version": 5, "mode": "quantity"}


def test_publisher_with_another_secret_never_overwrites_the_stored_config(
    redis_server: Any, channel: str, capsys: Any
) -> None:
    with RedisConfigCenter(redis_server.url, channel, secret="right") as right:
        right.publish({"mode": "manual"})
        with RedisConfigCenter(redis_server.url, channel, secret="wrong") as wrong:
            assert wrong.publish({"mode": "quantity"}) is None
            assert "another secret" in (wrong.last_rejection or "")
        assert right.stored() == {"version": 1, "mode": "manual"}
    base = ["config", "set", "--redis", redis_server.url, "--channel", channel]
    assert main(base + ["--secret", "wrong", "quantity=3"], io.StringIO()) == 2
    assert "another secret" in capsys.readouterr().err
