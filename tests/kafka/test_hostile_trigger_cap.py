"""Hostile checks of the rows-per-trigger cap file: paths that are not files or not paths, a
reader that must never stop the stream, and a config center that loses its data."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trilink_spark.elastic import follow_trigger_cap
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError, StateCorruptError
from trilink_spark.kafka import read_trigger_cap, write_trigger_cap
from trilink_spark.switching import RedisConfigCenter
from trilink_spark.kafka.client import KafkaOptions


def stream_reader(cap_path: str) -> Any:
    from trilink_spark.kafka.datasource import KafkaStreamReader

    opts = KafkaOptions.from_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t",
                                      "maxOffsetsPerTriggerPath": cap_path}, streaming=True)
    return KafkaStreamReader(opts)


@pytest.mark.parametrize("path", [None, 3, "", b"/tmp/cap.json"])
def test_read_trigger_cap_refuses_what_is_not_a_path_with_a_typed_error(path: Any) -> None:
    with pytest.raises(InvalidArgumentTypeError):
        read_trigger_cap(path)


def test_a_path_no_filesystem_knows_is_a_typed_error() -> None:
    with pytest.raises(InvalidArgumentError, match="nosuch://"):
        read_trigger_cap("nosuch://x/cap.json")
    with pytest.raises(InvalidArgumentError, match="nosuch://"):
        write_trigger_cap("nosuch://x/cap.json", 5)


def test_a_bad_cap_path_never_stops_the_stream(caplog: pytest.LogCaptureFixture) -> None:
    reader = stream_reader("nosuch://x/cap.json")
    assert reader._cap(SimpleNamespace(max_rows=50)) == 50  # Spark's own limit applies
    assert reader._cap(None) is None
    assert "trigger cap not read" in caplog.text


def test_a_directory_at_the_cap_path_is_not_a_cap_file(tmp_path: Path) -> None:
    with pytest.raises(StateCorruptError, match="not a file"):
        read_trigger_cap(str(tmp_path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_at_the_cap_path_never_hangs_the_stream(tmp_path: Path) -> None:
    path = tmp_path / "cap.json"
    os.mkfifo(path)
    outcome: list[Any] = []

    def plan() -> None:
        try:
            outcome.append(read_trigger_cap(str(path)))
        except Exception as err:  # noqa: BLE001 - inspected below
            outcome.append(err)

    thread = threading.Thread(target=plan, daemon=True)
    thread.start()
    thread.join(10)
    hung = thread.is_alive()
    if hung:  # free the blocked open: a writer arrives and leaves
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(10)
    assert not hung, "reading the cap file blocked on a named pipe"
    assert len(outcome) == 1 and isinstance(outcome[0], StateCorruptError)
    reader = stream_reader(str(path))
    assert reader._cap(SimpleNamespace(max_rows=7)) == 7


def test_the_cap_follows_a_redis_center_that_lost_its_data(own_redis: Any,
                                                           tmp_path: Path) -> None:
    from conftest import wait_for

    path = str(tmp_path / "cap.json")
    kwargs: dict[str, Any] = {"secret": "k", "backoff": (0.05, 0.2), "socket_timeout": 0.5}
    channel = "hostile:cap-resync"
    publisher = RedisConfigCenter(own_redis.url, channel, **kwargs)
    follower = RedisConfigCenter(own_redis.url, channel, **kwargs)
    stop = follow_trigger_cap(follower, path)
    try:
        wait_for(follower.connected.is_set)
        for cap in (100, 200, 300):
            assert publisher.publish({"max_offsets_per_trigger": cap}) is not None
        wait_for(lambda: read_trigger_cap(path) == (True, 300))
        own_redis.stop()
        wait_for(lambda: not follower.connected.is_set())
        own_redis.start()  # memory only: it comes back empty, versions start again at 1
        wait_for(lambda: follower.connected.is_set() and follower.connections >= 2)
        after = publisher.publish({"max_offsets_per_trigger": 50})
        assert after == {"version": 1, "max_offsets_per_trigger": 50}
        wait_for(lambda: follower.current() == after)
        # the center resynchronised: the running stream must get the new cap
        wait_for(lambda: read_trigger_cap(path) == (True, 50), 5)
    finally:
        stop()
        publisher.close()
        follower.close()
