"""Hostile arguments, foreign log parts and a killed process for the multi-process YSB
Producer (a real tansu broker, real spawned processes; no mocks)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trilink_spark.errors import InvalidArgumentError
from benches.ysb import LOG_SCHEMA, Catalogue, Producer, ProducerError, read_log

CAT = Catalogue(("c0", "c1"), (("a0",), ("a1",)))


@pytest.mark.parametrize("processes", [0, -1, True, 2.5, "2", 10**9])
def test_processes_out_of_range(tmp_path: Path, processes: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="processes must be an int >= 1"):
        Producer("127.0.0.1:1", CAT, tmp_path / "e", rate=1, events=10, processes=processes)


@pytest.mark.parametrize("kwargs", [{"rate": float("inf")}, {"rate": float("nan")},
                                    {"rate": 1, "duration": "5"}])
def test_rates_and_durations_refused(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        Producer("127.0.0.1:1", CAT, tmp_path / "e", **kwargs)


def _part(path: Path) -> None:
    pq.write_table(pa.table({"ad_id": ["a0"], "event_type": ["view"], "event_time": [1],
                             "partition": [0]}, schema=LOG_SCHEMA), path)


def test_foreign_or_corrupt_parts_are_refused_by_name(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    _part(log / "part-000.parquet")
    _part(log / "part-001.parquet")
    assert read_log(log).num_rows == 2
    (log / "part-002.parquet").write_bytes(b"\x80\x04\x95 a pickle, never loaded")
    with pytest.raises(InvalidArgumentError, match="part-002.parquet"):
        read_log(log)
    (log / "part-002.parquet").unlink()
    _part(log / "part-007.parquet")  # a stray part of another run
    with pytest.raises(InvalidArgumentError, match="part-007.parquet"):
        read_log(log)
    (log / "part-007.parquet").unlink()
    (log / "part-002.parquet").mkdir()  # a directory (a Parquet dataset) is no part
    _part(log / "part-002.parquet" / "x.parquet")
    with pytest.raises(InvalidArgumentError, match="part-002.parquet"):
        read_log(log)


def _children() -> list[Any]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("ysb-producer")]


def test_a_killed_process_raises_typed_without_hanging(kafka_broker: Any,
                                                       tmp_path: Path) -> None:
    """A producing process killed before the start: the other is released at once and the
    run raises ProducerError (before the fix it waited for the 120 s start timeout)."""
    kafka_broker.create_topic("hostile-kill", 2)
    producer = Producer(kafka_broker.bootstrap, CAT, tmp_path / "e", rate=100, duration=60,
                        topic="hostile-kill", processes=2).start()
    deadline = time.monotonic() + 20
    while len(_children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    victim = _children()[0]
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)  # a process this test started, by its id
    began = time.monotonic()
    with pytest.raises(ProducerError, match="exited with code"):
        producer.join(timeout=30)
    assert time.monotonic() - began < 25
