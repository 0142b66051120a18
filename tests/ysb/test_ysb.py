"""YSB end to end on real parts: tansu, redis-server (append-only, restartable) and Spark.

About 20,000 events in all: every variant once (0 mismatches, its exchanges; Global Merge's
Redis round trips), Local Merge (markers in Redis) stopped mid-run and restarted from its
checkpoint, Global Merge (markers in the RedisStore) with redis-server restarted mid-run, its
data kept, and its events sent by two producing processes.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trilink_spark.errors import InvalidArgumentError
from benches.ysb import (LOG_SCHEMA, VARIANTS, Catalogue, Producer, check, latencies,
                         load_catalogue, parse_variants, read_log, read_windows, run_variant,
                         setup)
from benches.ysb.cli import main
from trilink_spark.testing import RedisServer, create_topic

RATE, EVENTS = 4_000.0, 2_000


@pytest.fixture(scope="module")
def redis_kept(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A redis-server whose data survives a restart (append-only file)."""
    with RedisServer(tmp_path_factory.mktemp("ysb-redis"), append_only=True) as server:
        yield server


@pytest.fixture(scope="module")
def catalogue(redis_kept: RedisServer) -> Catalogue:
    return setup(redis_kept.url, seed=7)


def _run(spark: Any, variant: str, broker: Any, redis: RedisServer, cat: Catalogue,
         tmp_path: Path, **kwargs: Any) -> Any:
    return run_variant(spark, variant, bootstrap=broker.bootstrap, redis_url=redis.url,
                       catalogue=cat, workdir=tmp_path, rate=RATE,
                       events=kwargs.pop("events", EVENTS), partitions=4, trigger="1 second",
                       **kwargs)


# ---------------------------------------------------------------------- the catalogue
def test_setup_stores_every_ad_and_is_deterministic(redis_kept: RedisServer,
                                                    catalogue: Catalogue) -> None:
    import redis

    assert len(catalogue.campaigns) == 100 and all(len(g) == 10 for g in catalogue.ads)
    assert len(set(catalogue.ad_ids)) == 1000
    client = redis.Redis.from_url(redis_kept.url)
    try:
        ads = list(catalogue.ad_ids)
        got = [v.decode() for v in client.mget(ads)]
    finally:
        client.close()
    assert got == list(catalogue.ad_campaigns)
    assert load_catalogue(redis_kept.url) == catalogue
    assert setup(redis_kept.url, campaigns=3, ads_per_campaign=2, seed=7).campaigns == \
        catalogue.campaigns[:3]
    setup(redis_kept.url, seed=7)  # the catalogue of the other tests again


def test_catalogue_refuses_foreign_json_and_bad_counts(redis_kept: RedisServer) -> None:
    with pytest.raises(InvalidArgumentError, match="campaigns"):
        Catalogue.from_json('{"campaigns": ["a"], "ads": []}')
    with pytest.raises(InvalidArgumentError, match="not JSON"):
        Catalogue.from_json(b"\x80\x04K\x01.")  # a pickle is refused, never loaded
    with pytest.raises(ValueError, match="campaigns must be >= 1"):
        setup(redis_kept.url, campaigns=0)
    with pytest.raises(TypeError, match="ads_per_campaign must be an int"):
        setup(redis_kept.url, ads_per_campaign=2.5)  # type: ignore[arg-type]


def test_parse_variants() -> None:
    assert parse_variants("ahead, baseline,ahead") == ["ahead", "baseline"]
    with pytest.raises(InvalidArgumentError, match="choose from baseline"):
        parse_variants("baseline,shuffle")


def test_event_log_refuses_what_is_not_one(tmp_path: Path) -> None:
    bad = tmp_path / "log.parquet"
    bad.write_bytes(b"\x80\x04\x95 not parquet")
    with pytest.raises(InvalidArgumentError, match="not a YSB event log"):
        read_log(bad)
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"ad_id": [1], "event_type": ["view"], "event_time": [1],
                             "partition": [0]}), other)
    with pytest.raises(InvalidArgumentError, match="YSB event log"):
        read_log(other)


# ---------------------------------------------------------------------- the producer
def test_producer_processes_place_campaigns_and_log_exactly(kafka_broker: Any,
                                                            catalogue: Catalogue,
                                                            tmp_path: Path) -> None:
    """Two spawned producing processes: every campaign whole on one partition (Ahead KeyBy),
    and the log (one part per process, read as one) holds exactly what the broker holds."""
    from kafka import KafkaConsumer, TopicPartition

    create_topic(kafka_broker.bootstrap, "ysb-placed", 4)
    producer = Producer(kafka_broker.bootstrap, catalogue, tmp_path / "e.parquet", rate=50_000,
                        events=3_001, topic="ysb-placed", placement="least_key", processes=2)
    report = producer.run()
    assert report.processes == 2 and producer.sent == report.events == 3_001
    assert sorted(p.name for p in (tmp_path / "e.parquet").iterdir()) == [
        "part-000.parquet", "part-001.parquet"]
    log = read_log(tmp_path / "e.parquet")
    assert log.schema.equals(LOG_SCHEMA) and log.num_rows == 3_001
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap)
    held: list[tuple[int, str, str, int]] = []
    try:  # every record the broker holds (tansu's end offsets are not record counts)
        parts = [TopicPartition("ysb-placed", i) for i in range(4)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        deadline = time.monotonic() + 30
        while len(held) < 3_001 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                held += [(m.partition, e["ad_id"], e["event_type"], e["event_time"])
                         for m in records for e in [json.loads(m.value)]]
        held.extend((m.partition, "", "", 0)  # anything beyond the events sent
                    for records in consumer.poll(timeout_ms=200).values() for m in records)
    finally:
        consumer.close()
    held.sort()
    frame = log.to_pandas()
    logged = sorted(zip(frame["partition"], frame["ad_id"], frame["event_type"],
                        frame["event_time"]))
    assert held == logged  # the log is exactly what was sent, partition by partition
    assert frame.groupby("partition").size().tolist() == list(report.per_partition)
    ads = catalogue.mapping()
    frame["campaign"] = frame["ad_id"].map(ads)
    parts_per_campaign = frame.groupby("campaign")["partition"].nunique()
    assert (parts_per_campaign == 1).all()  # every campaign whole on one partition
    assert frame.groupby("partition")["campaign"].nunique().tolist() == [25, 25, 25, 25]
    assert set(frame["event_type"]) == {"view", "click", "purchase"}
    assert report.views == int((frame["event_type"] == "view").sum())
    # the two processes drew different events (their own seeds), and overwrite a log
    assert frame.duplicated(["ad_id", "event_time", "event_type"]).mean() < 0.5
    again = Producer(kafka_broker.bootstrap, catalogue, tmp_path / "e.parquet", rate=50_000,
                     events=10, topic="ysb-placed").run()
    assert again.events == read_log(tmp_path / "e.parquet").num_rows == 10
    with pytest.raises(InvalidArgumentError, match="processes must be an int >= 1"):
        Producer(kafka_broker.bootstrap, catalogue, tmp_path / "x", rate=1, events=1,
                 processes=0)


# ---------------------------------------------------------------------- end to end
@pytest.mark.parametrize("variant,exchanges", [
    ("baseline", 1), ("key_by", 1), ("local_merge", 1), ("global_merge", 0), ("ahead", 0)])
def test_variant_is_exact(spark: Any, kafka_broker: Any, redis_kept: RedisServer,
                          catalogue: Catalogue, tmp_path: Path, variant: str,
                          exchanges: int) -> None:
    result = _run(spark, variant, kafka_broker, redis_kept, catalogue, tmp_path)
    assert result.events == EVENTS and result.mismatches == 0
    assert result.exchanges == exchanges
    assert result.throughput > 0 and result.batches >= 1
    assert result.redis_round_trips_per_1000 is not None
    trips_per_batch = result.redis_round_trips_per_1000 * EVENTS / 1000 / (result.batches + 1)
    # a handful per batch, not per event: one script (or pipeline) per batch. Redis counts
    # one read per 16 KB of a request, so when the events arrive in one batch its one large
    # script counts several: then the reads per 1,000 events stay a handful (one write per
    # event would be 1,000 of them)
    assert trips_per_batch <= 5 or result.redis_round_trips_per_1000 <= 10
    if variant == "global_merge":
        # one script per batch from the driver: every partition's counts, the markers and
        # the metadata (the first also carries the script's body); a count, not a time
        assert result.redis_round_trips is not None
        assert result.redis_round_trips <= result.batches + 1
        if EVENTS / result.batches >= 1_000:  # at least 1,000 events per batch
            assert result.redis_round_trips_per_1000 <= 1.0
    lat = latencies(redis_kept.url, f"ysb:{variant}:" + _run_id(tmp_path, variant),
                    sorted(tmp_path.glob(f"{variant}-*/events.parquet"))[0], catalogue)
    assert len(lat) and (lat["seen_count"] > 0).all()
    assert (lat["time_updated"] >= lat["last_event"]).all()  # written after its last event
    if variant == "baseline":
        _check_detects_a_wrong_count(redis_kept, catalogue, tmp_path, variant)


def _run_id(tmp_path: Path, variant: str) -> str:
    return sorted(tmp_path.glob(f"{variant}-*"))[0].name.split("-", 1)[1]


def _check_detects_a_wrong_count(redis: RedisServer, cat: Catalogue, tmp_path: Path,
                                 variant: str) -> None:
    import redis as redis_py

    prefix = f"ysb:{variant}:{_run_id(tmp_path, variant)}"
    log = sorted(tmp_path.glob(f"{variant}-*/events.parquet"))[0]
    windows = read_windows(redis.url, prefix)
    first = windows.iloc[0]
    client = redis_py.Redis.from_url(redis.url)
    try:
        client.hincrby(f"{prefix}:w:{first.campaign_id}:{first.window_start}", "seen_count", 1)
    finally:
        client.close()
    bad = check(redis.url, prefix, log, cat)
    assert len(bad) == 1 and bad[0].stored == bad[0].expected + 1


@pytest.mark.parametrize("variant", ["local_merge"])
def test_exact_after_restart_from_checkpoint(spark: Any, kafka_broker: Any,
                                             redis_kept: RedisServer, catalogue: Catalogue,
                                             tmp_path: Path, variant: str) -> None:
    result = _run(spark, variant, kafka_broker, redis_kept, catalogue, tmp_path,
                  events=EVENTS, restart_query_at=0.4)
    assert result.restarts == 1
    assert result.events == EVENTS and result.mismatches == 0


@pytest.mark.parametrize("variant", ["global_merge"])
def test_exact_after_redis_restart(spark: Any, kafka_broker: Any, redis_kept: RedisServer,
                                   catalogue: Catalogue, tmp_path: Path, variant: str) -> None:
    result = _run(spark, variant, kafka_broker, redis_kept, catalogue, tmp_path,
                  events=EVENTS, mid_run=lambda: redis_kept.restart(down_s=1.0), mid_run_at=0.4,
                  producer_processes=2)  # the log in two parts, checked as one
    assert result.redis_restarts == 1 and result.producer_processes == 2
    assert result.events == EVENTS and result.mismatches == 0
    assert load_catalogue(redis_kept.url) == catalogue  # data kept over the restart


def test_cli_ysb_writes_json(kafka_broker: Any, redis_kept: RedisServer, spark: Any,
                             tmp_path: Path) -> None:
    out = io.StringIO()
    path = tmp_path / "ysb.json"
    code = main(["--events", "1500", "--rate", "3000", "--variants", "ahead",
                 "--bootstrap", kafka_broker.bootstrap, "--redis", redis_kept.url,
                 "--json", str(path)], out)
    assert code == 0, out.getvalue()
    data = json.loads(path.read_text())
    row = data["variants"]["ahead"]
    assert row["events"] == 1500 and row["mismatches"] == 0 and row["exchanges"] == 0
    for name in ("throughput", "p50_latency_ms", "p99_latency_ms",
                 "redis_round_trips_per_1000"):
        assert name in row
    assert "ahead" in out.getvalue() and "redis_round_trips_per_1000" in out.getvalue()
    setup(redis_kept.url, seed=7)  # the CLI set up seed 0's catalogue; put the tests' back


def test_cli_refuses_unknown_variant(tmp_path: Path) -> None:
    import contextlib

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["--variants", "baseline,nope", "--bootstrap", "127.0.0.1:1",
                     "--redis", "redis://127.0.0.1:1/0"], io.StringIO())
    assert code == 2 and "unknown YSB variant" in err.getvalue()
    assert VARIANTS == ("baseline", "key_by", "local_merge", "global_merge", "ahead")
