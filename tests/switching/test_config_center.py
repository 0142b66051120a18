"""The dynamic configuration center: validation, versions, signatures, Redis pub/sub."""

from __future__ import annotations

import io
import json
import logging
import threading
from typing import Any

import pytest
import redis

import trilink_spark as tl
from trilink_spark.errors import ConfigCenterUnavailableError, ConfigError, InvalidArgumentError
from trilink_spark.switching import CONFIG_FIELDS, ConfigCenter, RedisConfigCenter, validate_update
from conftest import wait_for
from trilink_spark.cli import main
from trilink_spark.switching.wire import encode_message


# ---------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "update, error",
    [
        ({"colour": "red"}, ConfigError),
        ({"sample_rate": 0}, ConfigError),
        ({"sample_rate": 1.5}, ConfigError),
        ({"sample_rate": "0.1"}, TypeError),
        ({"threshold": True}, TypeError),
        ({"mode": "sometimes"}, ValueError),
        ({"candidates": []}, ValueError),
        ({"candidates": ["hash", "hash"]}, ValueError),
        ({"strategy": "round_robin"}, ValueError),
        ({"quantity": 0}, ValueError),
        ({"decay": 1.0}, ValueError),
        ({"version": -1}, ValueError),
        ({"period_s": float("nan")}, ValueError),
        (["mode", "quantity"], TypeError),
    ],
)
def test_validate_update_refuses_bad_fields(update: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        validate_update(update)
    assert isinstance(info.value, tl.TrilinkError)


def test_validate_update_accepts_every_field() -> None:
    update = {
        "version": 3, "strategy": "least_count", "candidates": ["hash", "least_key"],
        "sample_rate": 0.05, "mode": "periodic", "threshold": 0.6, "period_s": 5,
        "period_batches": None, "quantity": 10, "min_gain": 0.02, "decay": 0.0, "min_sample": 1,
        "max_offsets_per_trigger": 5000,
    }
    assert validate_update(update) == {**update, "period_s": 5.0}
    assert set(update) == set(CONFIG_FIELDS)


# ---------------------------------------------------------------------- in-process
def test_in_process_center_versions_merge_and_notify(caplog: pytest.LogCaptureFixture) -> None:
    center = ConfigCenter()
    seen: list[dict[str, Any]] = []
    center.subscribe(seen.append)
    assert center.publish({"mode": "quantity", "quantity": 100}) == {
        "version": 1, "mode": "quantity", "quantity": 100}
    assert center.publish({"quantity": 200})["version"] == 2  # type: ignore[index]
    assert center.current() == {"version": 2, "mode": "quantity", "quantity": 200}
    with caplog.at_level(logging.WARNING, logger="trilink_spark.switching.config_center"):
        assert center.publish({"version": 2, "quantity": 5}) is None  # stale
        assert center.publish({"quantity": -1}) is None  # out of range
        assert center.publish({"bogus": 1}) is None  # unknown field
    assert center.rejected == 3
    assert "unknown config field" in (center.last_rejection or "")
    assert "stale version 2" in caplog.text
    assert center.current()["quantity"] == 200
    assert [s["version"] for s in seen] == [1, 2]
    assert center.publish({"version": 10, "mode": "manual"})["version"] == 10  # type: ignore[index]


def test_subscribe_gets_current_snapshot_and_unsubscribe_stops() -> None:
    center = ConfigCenter({"sample_rate": 0.1})
    seen: list[dict[str, Any]] = []
    unsubscribe = center.subscribe(seen.append)
    assert seen == [{"version": 1, "sample_rate": 0.1}]
    unsubscribe()
    center.publish({"sample_rate": 0.2})
    assert len(seen) == 1


def test_failing_subscriber_does_not_stop_the_others() -> None:
    center = ConfigCenter()
    seen: list[int] = []

    def broken(_: dict[str, Any]) -> None:
        raise RuntimeError("subscriber bug")

    center.subscribe(broken)
    center.subscribe(lambda s: seen.append(s["version"]))
    assert center.publish({"mode": "manual"}) is not None
    assert seen == [1]


def test_initial_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="initial config refused"):
        ConfigCenter({"mode": "never"})


# ---------------------------------------------------------------------- Redis
@pytest.fixture()
def channel(request: pytest.FixtureRequest) -> str:
    return f"test:{request.node.name}"


def test_redis_publish_subscribe_with_password(redis_server: Any, channel: str) -> None:
    publisher = RedisConfigCenter(redis_server.url, channel)
    subscriber = RedisConfigCenter(redis_server.url, channel)
    seen: list[dict[str, Any]] = []
    try:
        subscriber.subscribe(seen.append)
        wait_for(subscriber.connected.is_set)
        first = publisher.publish({"mode": "quantity", "quantity": 5000})
        second = publisher.publish({"sample_rate": 0.02})
        assert first is not None and second is not None
        wait_for(lambda: len(seen) == 2)
        assert seen[-1] == {"version": 2, "mode": "quantity", "quantity": 5000,
                            "sample_rate": 0.02}
        assert subscriber.current() == seen[-1]
        assert publisher.stored() == seen[-1]
    finally:
        publisher.close()
        subscriber.close()


def test_redis_restarted_job_resumes_latest_config(redis_server: Any, channel: str) -> None:
    with RedisConfigCenter(redis_server.url, channel) as publisher:
        publisher.publish({"strategy": "least_key", "mode": "manual"})
        publisher.publish({"sample_rate": 0.5})
    with RedisConfigCenter(redis_server.url, channel) as restarted:
        assert restarted.current() == {
            "version": 2, "strategy": "least_key", "mode": "manual", "sample_rate": 0.5}
        ap = tl.AdaptivePartitioner(4, config=restarted)
        assert ap.current_name == "hash"  # takes effect at the next batch boundary
        ap.batch_boundary()
        assert (ap.current_name, ap.mode, ap.sample_rate) == ("least_key", "manual", 0.5)


def test_redis_rejects_invalid_stale_and_unsigned_messages(
    redis_server: Any, channel: str, caplog: pytest.LogCaptureFixture
) -> None:
    raw = redis.Redis.from_url(redis_server.url)
    secret = "hmac-key"
    subscriber = RedisConfigCenter(redis_server.url, channel, secret=secret)
    seen: list[dict[str, Any]] = []
    try:
        subscriber.subscribe(seen.append)
        wait_for(subscriber.connected.is_set)
        with caplog.at_level(logging.WARNING, logger="trilink_spark.switching.config_center"):
            raw.publish(channel, encode_message({"version": 1, "mode": "manual"}, None))
            raw.publish(channel, encode_message({"version": 1, "mode": "manual"}, "wrong"))
            raw.publish(channel, b"not json at all")
            raw.publish(channel, encode_message({"version": 1, "mode": "often"}, secret))
            raw.publish(channel, encode_message({"version": 2, "mode": "manual"}, secret))
            raw.publish(channel, encode_message({"version": 1, "quantity": 9}, secret))
            wait_for(lambda: subscriber.rejected >= 5)
        assert seen == [{"version": 2, "mode": "manual"}]
        assert "unsigned" in caplog.text and "signature does not match" in caplog.text
        assert "stale version 1" in caplog.text
        assert subscriber._thread is not None and subscriber._thread.is_alive()
        # a signed publisher is accepted end to end (the raw messages above stored nothing,
        # so it names a version above the one the subscriber holds)
        with RedisConfigCenter(redis_server.url, channel, secret=secret) as publisher:
            assert publisher.publish({"version": 3, "quantity": 42}) is not None
        wait_for(lambda: len(seen) == 2)
        assert seen[-1] == {"version": 3, "quantity": 42}
    finally:
        subscriber.close()
        raw.close()


def test_redis_compare_and_set_under_concurrent_publishers(redis_server: Any, channel: str) -> None:
    centers = [RedisConfigCenter(redis_server.url, channel) for _ in range(4)]
    errors: list[BaseException] = []

    def publish_many(center: RedisConfigCenter, i: int) -> None:
        try:
            for j in range(10):
                assert center.publish({"quantity": 1000 * i + j + 1}) is not None
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=publish_many, args=(c, i)) for i, c in enumerate(centers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert centers[0].stored()["version"] == 40  # type: ignore[index]
    finally:
        for c in centers:
            c.close()


def test_redis_unreachable_keeps_config_and_reconnects(own_redis: Any, channel: str) -> None:
    center = RedisConfigCenter(own_redis.url, channel, backoff=(0.05, 0.2), socket_timeout=0.5)
    seen: list[dict[str, Any]] = []
    try:
        center.subscribe(seen.append)
        wait_for(center.connected.is_set)
        assert center.publish({"mode": "periodic", "period_s": 5}) is not None
        wait_for(lambda: len(seen) == 1)
        own_redis.stop()
        wait_for(lambda: not center.connected.is_set())
        with pytest.raises(ConfigCenterUnavailableError, match="unreachable"):
            center.publish({"period_s": 1})
        assert center.current()["period_s"] == 5.0
        own_redis.start()  # memory-only server: it comes back empty
        wait_for(center.connected.is_set)
        assert center.connections >= 2
        assert center.publish({"version": 7, "period_s": 2}) is not None
        wait_for(lambda: center.current()["version"] == 7)
        assert center.current()["period_s"] == 2.0
    finally:
        center.close()


def test_redis_down_at_start_is_not_fatal(own_redis: Any, channel: str) -> None:
    url = own_redis.url
    own_redis.stop()
    center = RedisConfigCenter(url, channel, backoff=(0.05, 0.2), socket_timeout=0.5)
    try:
        assert center.current() == {}
        center.subscribe(lambda s: None)
        own_redis.start()
        wait_for(center.connected.is_set)
    finally:
        center.close()


def test_password_never_appears_in_errors(own_redis: Any) -> None:
    url = f"redis://:topsecret@127.0.0.1:{own_redis.port}/0"
    own_redis.stop()
    center = RedisConfigCenter(url, socket_timeout=0.3)
    try:
        with pytest.raises(ConfigCenterUnavailableError) as info:
            center.publish({"mode": "manual"})
        assert "topsecret" not in str(info.value) and "***" in str(info.value)
        assert "topsecret" not in repr(center)
    finally:
        center.close()


def test_bad_urls_and_arguments_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="redis://"):
        RedisConfigCenter("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="secret"):
        RedisConfigCenter("redis://127.0.0.1:1", secret="")


def test_rediss_tls_url(tmp_path_factory: pytest.TempPathFactory) -> None:
    from conftest import _redis_process

    gen = _redis_process(tmp_path_factory, password="tls-pw", tls=True)
    try:
        server = next(gen)
    except RuntimeError as err:  # a redis-server built without TLS
        pytest.skip(f"redis-server cannot serve TLS here: {err}")
    try:
        with RedisConfigCenter(server.url, "tls") as center:
            assert center.publish({"mode": "manual"}) == {"version": 1, "mode": "manual"}
            assert center.stored() == {"version": 1, "mode": "manual"}
    finally:
        gen.close()


# ---------------------------------------------------------------------- CLI
def test_cli_config_set_and_get(redis_server: Any, channel: str, monkeypatch: Any) -> None:
    monkeypatch.setenv("TRILINK_CONFIG_SECRET", "cli-secret")
    out = io.StringIO()
    args = ["config", "set", "--redis", redis_server.url, "--channel", channel,
            "mode=threshold", "threshold=0.6", "candidates=hash,least_count"]
    assert main(args, out) == 0
    assert json.loads(out.getvalue()) == {
        "version": 1, "mode": "threshold", "threshold": 0.6, "candidates": ["hash", "least_count"]}
    out = io.StringIO()
    assert main(["config", "get", "--redis", redis_server.url, "--channel", channel], out) == 0
    assert json.loads(out.getvalue())["threshold"] == 0.6
    # the stored snapshot is signed: a reader with another secret refuses it
    out = io.StringIO()
    assert main(["config", "get", "--redis", redis_server.url, "--channel", channel,
                 "--secret", "other"], out) == 0
    assert json.loads(out.getvalue()) == {}


def test_cli_config_refusals(redis_server: Any, channel: str, capsys: Any) -> None:
    base = ["config", "set", "--redis", redis_server.url, "--channel", channel]
    assert main(base + ["sample_rate=3"], io.StringIO()) == 2
    assert "sample_rate must be in (0.0, 1.0]" in capsys.readouterr().err
    assert main(base + ["nonsense"], io.StringIO()) == 2
    assert "expected field=value" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: set needs at least one field=value
        main(base, io.StringIO())
    assert main(["config", "set", "--redis", "redis://127.0.0.1:1/0", "mode=manual"],
                io.StringIO()) == 2
    assert "unreachable" in capsys.readouterr().err
