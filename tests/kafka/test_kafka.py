"""Ahead KeyBy end to end against a real Kafka-compatible broker (tansu, loopback, memory).

Produce with the strategies, read back with ``trilink-kafka`` (one Spark partition per Kafka
partition), aggregate with no exchange, and compare with a plain ``groupBy``.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import BrokerUnavailableError, InvalidArgumentError, KeysNotGroupedError
from trilink_spark.errors import PartitionCountError
from trilink_spark.kafka import read_kafka, register_kafka_source, write_kafka
from trilink_spark.partitioners import kafka_default_partition, kafka_murmur2
from trilink_spark.placement import KafkaPythonPartitioner, ahead_key_by, keyed_by_source
from trilink_spark.placement import shuffle_exchanges
from trilink_spark import kafka as tl_kafka
from trilink_spark.kafka.client import KafkaOptions, split_limit
from trilink_spark.testing import free_port

pytest.importorskip("kafka")

_topics = itertools.count()
N_PARTITIONS = 4


def new_topic(broker: Any, partitions: int = N_PARTITIONS) -> str:
    name = f"t{next(_topics)}-{random.randrange(1 << 30)}"
    broker.create_topic(name, partitions)
    return name


def produce(broker: Any, topic: str, records: list[tuple[Any, bytes]], partitioner: Any = None,
            partition: int | None = None) -> None:
    from kafka import KafkaProducer

    config: dict[str, Any] = {"bootstrap_servers": broker.bootstrap}
    if partitioner is not None:
        config["partitioner"] = partitioner
    producer = KafkaProducer(**config)
    try:
        futures = [producer.send(topic, key=None if k is None else str(k).encode(), value=v,
                                 partition=partition) for k, v in records]
        producer.flush()
        for future in futures:
            future.get(timeout=10)
    finally:
        producer.close()


def events(n: int, users: int, seed: int = 1) -> list[tuple[int, bytes]]:
    """Skewed users (Zipf-like) with an amount in the value."""
    rng = np.random.default_rng(seed)
    keys = np.minimum(rng.zipf(1.3, n), users) - 1
    amounts = rng.integers(0, 1000, n)
    return [(int(k), str(int(a)).encode()) for k, a in zip(keys, amounts)]


def parsed(df: Any) -> Any:
    return df.select(F.col("key").cast("string").cast("long").alias("user"),
                     F.col("value").cast("string").cast("int").alias("amount"),
                     "partition", "offset", "timestamp")


@pytest.fixture(scope="module")
def placed_topic(kafka_broker: Any) -> tuple[str, tl.Partitioner, list[tuple[int, bytes]]]:
    """2,000 skewed events written with a LeastCount placement learnt from their counts."""
    records = events(2_000, 300)
    counts: dict[int, int] = {}
    for k, _ in records:
        counts[k] = counts.get(k, 0) + 1
    strategy = tl.LeastCountPartitioner(N_PARTITIONS, history=counts)
    topic = new_topic(kafka_broker)
    produce(kafka_broker, topic, records, KafkaPythonPartitioner(strategy, key_decoder=int))
    return topic, strategy, records


def test_one_spark_partition_per_kafka_partition(spark: Any, kafka_broker: Any,
                                                 placed_topic: Any) -> None:
    topic, strategy, records = placed_topic
    df = read_kafka(spark, kafka_broker.bootstrap, topic, num_partitions=N_PARTITIONS)
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                          "timestampType"]
    assert df.rdd.getNumPartitions() == N_PARTITIONS
    rows = df.select(F.spark_partition_id().alias("sp"), "partition", "offset", "key",
                     "value", "topic").collect()
    assert len(rows) == len(records)  # every record, once
    assert all(r["sp"] == r["partition"] for r in rows)
    assert {r["topic"] for r in rows} == {topic}
    for p in range(N_PARTITIONS):  # offsets are contiguous per partition
        offsets = sorted(r["offset"] for r in rows if r["partition"] == p)
        assert offsets == list(range(len(offsets)))
    # every key is where the strategy put it
    assert all(strategy.partition(int(r["key"])) == r["partition"] for r in rows)
    assert sorted((int(r["key"]), r["value"]) for r in rows) == sorted(records)


def test_keyed_agg_without_exchange_equals_group_by(spark: Any, kafka_broker: Any,
                                                    placed_topic: Any) -> None:
    topic, _, _ = placed_topic
    df = parsed(read_kafka(spark, kafka_broker.bootstrap, topic))
    keyed = keyed_by_source(df, "user", verify=True)
    aggs = [F.count("*").alias("n"), F.sum("amount").alias("s"), F.min("amount").alias("lo"),
            F.max("amount").alias("hi"), F.avg(F.col("amount") * 2).alias("m"),
            F.countDistinct("amount").alias("d"), F.stddev("amount").alias("sd")]
    got = tl.keyed_agg(keyed, "user", *aggs)
    assert shuffle_exchanges(got) == 0
    want = df.groupBy("user").agg(*aggs)
    assert shuffle_exchanges(want) >= 1
    assert [(f.name, f.dataType) for f in got.schema] == [(f.name, f.dataType) for f in want.schema]
    a = got.toPandas().sort_values("user").reset_index(drop=True)
    b = want.toPandas().sort_values("user").reset_index(drop=True)
    for column in ("user", "n", "s", "lo", "hi", "d"):
        assert a[column].tolist() == b[column].tolist(), column
    for column in ("m", "sd"):
        assert np.allclose(a[column], b[column], equal_nan=True), column
    # first/last follow the arrival (offset) order of the key's partition
    firsts = tl.keyed_agg(keyed, "user", F.first("offset").alias("f"),
                          F.last("offset").alias("l")).toPandas()
    bounds = df.groupBy("user").agg(F.min("offset").alias("f"), F.max("offset").alias("l"))
    assert (firsts.sort_values("user").reset_index(drop=True)[["f", "l"]].values.tolist()
            == bounds.toPandas().sort_values("user")[["f", "l"]].values.tolist())


def test_keyed_apply_and_process_without_exchange(spark: Any, kafka_broker: Any,
                                                  placed_topic: Any) -> None:
    topic, _, _ = placed_topic
    df = parsed(read_kafka(spark, kafka_broker.bootstrap, topic))
    keyed = keyed_by_source(df, "user")

    def top(key: tuple[Any, ...], pdf: Any) -> Any:
        best = pdf.nlargest(1, "amount")
        return best.assign(user=key[0])[["user", "amount"]]

    applied = tl.keyed_apply(keyed, "user", top, "user long, amount int")
    assert shuffle_exchanges(applied) == 0
    want = df.groupBy("user").agg(F.max("amount").alias("amount"))
    assert sorted(map(tuple, applied.collect())) == sorted(map(tuple, want.collect()))

    windows = tl.keyed_process(keyed, "user", "timestamp", tl.KeyedWindowAggregate(3600.0),
                               delay=1.0)
    assert shuffle_exchanges(windows) == 0
    placed = tl.keyed_process(df, "user", "timestamp", tl.KeyedWindowAggregate(3600.0),
                              delay=1.0, strategy="hash", num_partitions=N_PARTITIONS)
    assert shuffle_exchanges(placed) == 1
    assert sorted(map(tuple, windows.collect())) == sorted(map(tuple, placed.collect()))


def test_spark_side_ahead_key_by_round_trip(spark: Any, kafka_broker: Any, tmp_path: Path) -> None:
    topic = new_topic(kafka_broker)
    rows = [(u, f"order-{u}-{i}") for u in range(120) for i in range(u % 6 + 1)]
    orders = spark.createDataFrame(rows, "user long, payload string")
    out = ahead_key_by(orders, "user", "least_count", N_PARTITIONS,
                       assignment_path=str(tmp_path / "assignment.json"))
    (out.selectExpr("CAST(user AS STRING) AS key", "payload AS value", "partition")
        .write.format(tl_kafka.SOURCE_NAME).mode("append")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap).option("topic", topic)
        .option("numPartitions", N_PARTITIONS).save())
    back = read_kafka(spark, kafka_broker.bootstrap, topic)
    got = back.select(F.col("key").cast("string").cast("long").alias("user"), "partition")
    want = {r[0]: r[1] for r in out.select("user", "partition").collect()}
    assert back.count() == len(rows)
    assert all(want[r[0]] == r[1] for r in got.collect())
    counts = tl.keyed_agg(keyed_by_source(got, "user", verify=True), "user",
                          F.count("*").alias("n"))
    assert shuffle_exchanges(counts) == 0
    assert {r["user"]: r["n"] for r in counts.collect()} == {u: u % 6 + 1 for u in range(120)}


def test_verify_names_keys_split_over_partitions(spark: Any, kafka_broker: Any) -> None:
    topic = new_topic(kafka_broker, 2)
    produce(kafka_broker, topic, [(7, b"1"), (8, b"1")], partition=0)
    produce(kafka_broker, topic, [(7, b"2"), (9, b"1")], partition=1)
    df = parsed(read_kafka(spark, kafka_broker.bootstrap, topic))
    with pytest.raises(KeysNotGroupedError, match=r"1 key\(s\).*7 in partitions \[0, 1\]"):
        keyed_by_source(df, "user", verify=True)
    keyed = keyed_by_source(df, "user")
    with pytest.raises(KeysNotGroupedError, match="shuffled after keyed_by_source"):
        tl.keyed_agg(keyed.repartition(3), "user", F.count("*"))
    with pytest.raises(ValueError, match="not computed per partition"):
        tl.keyed_agg(keyed, "user", F.collect_set("amount"))
    with pytest.raises(ValueError, match=r"\+ is not computed per partition"):
        tl.keyed_agg(keyed, "user", F.sum("amount") + 1)
    with pytest.raises(ValueError, match="plain aggregate call"):
        tl.keyed_agg(keyed, "user", F.expr("sum(amount)"))


def test_stream_resumes_without_loss_or_duplicates(spark: Any, kafka_broker: Any,
                                                   tmp_path: Path) -> None:
    topic = new_topic(kafka_broker)
    strategy = tl.ModuloPartitioner(N_PARTITIONS)
    partitioner = KafkaPythonPartitioner(strategy, key_decoder=int)
    produce(kafka_broker, topic, [(i % 50, str(i).encode()) for i in range(600)], partitioner)
    seen: list[tuple[int, int, int]] = []
    batch_sizes: list[int] = []

    def collect(batch: Any, batch_id: int) -> None:
        rows = batch.select(F.spark_partition_id().alias("sp"), "partition", "offset").collect()
        assert all(r["sp"] == r["partition"] for r in rows)
        seen.extend((r["partition"], r["offset"], batch_id) for r in rows)
        batch_sizes.append(len(rows))

    def run() -> None:
        stream = read_kafka(spark, kafka_broker.bootstrap, topic, streaming=True,
                            starting_offsets="earliest", max_records_per_trigger=250)
        query = (stream.writeStream.foreachBatch(collect)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    run()
    assert len(seen) == 600 and max(batch_sizes) <= 250
    produce(kafka_broker, topic, [(i % 50, str(i).encode()) for i in range(600, 900)],
            partitioner)
    run()  # restarted from the checkpoint: only the new records
    offsets = [(p, o) for p, o, _ in seen]
    assert len(offsets) == len(set(offsets)) == 900
    for p in range(N_PARTITIONS):
        mine = sorted(o for q, o in offsets if q == p)
        assert mine == list(range(len(mine)))


def test_unreachable_broker_and_partition_count(spark: Any, kafka_broker: Any) -> None:
    port = free_port()  # nobody listens there
    with pytest.raises(BrokerUnavailableError, match=f"127.0.0.1:{port}"):
        read_kafka(spark, f"127.0.0.1:{port}", "anything", timeout_ms=1000)
    register_kafka_source(spark)
    with pytest.raises(Exception, match="no Kafka broker answered"):
        (spark.read.format(tl_kafka.SOURCE_NAME).option("kafka.bootstrap.servers", f"127.0.0.1:{port}")
         .option("subscribe", "anything").option("timeoutMs", 1000).load().count())

    topic = new_topic(kafka_broker, 3)
    with pytest.raises(PartitionCountError, match="has 3 partitions.*placed for 4"):
        read_kafka(spark, kafka_broker.bootstrap, topic, num_partitions=4)
    with pytest.raises(ValueError, match="does not exist"):
        read_kafka(spark, kafka_broker.bootstrap, "no-such-topic", timeout_ms=500)
    # producers refuse to place keys for 4 partitions on a 3-partition topic
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap,
                             partitioner=KafkaPythonPartitioner(tl.ModuloPartitioner(4),
                                                                key_decoder=int))
    try:
        with pytest.raises(PartitionCountError, match="3 partitions"):
            producer.send(topic, key=b"5", value=b"x").get(timeout=10)
    finally:
        producer.close()
    # and so does the Spark writer
    frame = ahead_key_by(spark.createDataFrame([(u,) for u in range(8)], "user long"),
                         "user", "modulo", 4)
    writer = (frame.selectExpr("CAST(user AS STRING) AS value", "partition").write
              .format(tl_kafka.SOURCE_NAME).mode("append")
              .option("kafka.bootstrap.servers", kafka_broker.bootstrap).option("topic", topic))
    with pytest.raises(Exception, match="has 3 partitions"):
        writer.option("numPartitions", 4).save()
    with pytest.raises(Exception, match="topic .* has 3 partitions"):
        writer.save()
    # write_kafka checks on the driver, so the errors arrive typed, before any task runs
    rows = frame.selectExpr("CAST(user AS STRING) AS value")
    before = read_kafka(spark, kafka_broker.bootstrap, topic).count()
    with pytest.raises(PartitionCountError, match="has 3 partitions.*placed for 4"):
        write_kafka(rows, kafka_broker.bootstrap, topic, num_partitions=4)
    with pytest.raises(BrokerUnavailableError, match=f"127.0.0.1:{port}"):
        write_kafka(rows, f"127.0.0.1:{port}", topic, timeout_ms=1000)
    assert read_kafka(spark, kafka_broker.bootstrap, topic).count() == before


def test_options_are_checked() -> None:
    ok = KafkaOptions.from_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t"}, False)
    assert (ok.starting, ok.ending, ok.timeout_ms) == ("earliest", "latest", 10_000)
    assert KafkaOptions.from_options({"bootstrap.servers": "h:1", "topic": "t"}, True).starting \
        == "latest"
    bad = [
        ({"subscribe": "t"}, "kafka.bootstrap.servers"),
        ({"kafka.bootstrap.servers": "h:1"}, "subscribe"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "a,b"}, "one topic"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": "soon"},
         "startingOffsets"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t",
          "startingOffsets": '{"other": {"0": 1}}'}, "exactly the topic"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "maxOffsetsPerTrigger": "0"},
         "positive"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": "latest"},
         "read nothing"),
    ]
    for options, message in bad:
        with pytest.raises(InvalidArgumentError, match=message):
            KafkaOptions.from_options(options, streaming=False)


@pytest.mark.parametrize("seed", range(20))
def test_split_limit_reads_at_most_the_limit(seed: int) -> None:
    rng = random.Random(seed)
    start = {p: rng.randrange(100) for p in range(rng.randrange(1, 8))}
    latest = {p: o + rng.randrange(0, 500) for p, o in start.items()}
    limit = rng.randrange(1, 800)
    end = split_limit(start, latest, limit)
    taken = sum(end[p] - start[p] for p in start)
    backlog = sum(latest[p] - start[p] for p in start)
    assert taken == min(limit, backlog)
    assert all(start[p] <= end[p] <= latest[p] for p in start)
    assert split_limit(start, latest, limit) == end  # deterministic


def test_kafka_murmur2_matches_kafka_python() -> None:
    from kafka.partitioner import murmur2

    rng = random.Random(5)
    keys = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 24))) for _ in range(2_000)]
    want = [h - (1 << 32) if h >= 1 << 31 else h for h in (murmur2(k) for k in keys)]
    assert kafka_murmur2(keys).tolist() == want
    with pytest.raises(TypeError, match="bytes"):
        kafka_murmur2(["text"])  # type: ignore[list-item]


def test_kafka_murmur2_of_long_keys_and_many_lengths_matches_kafka_python() -> None:
    # keys of up to LONG_BLOCKS blocks are chained in numpy passes, longer ones a step each;
    # every length from 0 to 600 bytes, shuffled, and a 1 MB key among short ones
    from kafka.partitioner import murmur2

    from trilink_spark.partitioners.core.kafka_hash import LONG_BLOCKS

    rng = random.Random(11)
    keys = [rng.randbytes(n) for n in range(0, 601)] + [b"\xff" * (4 * LONG_BLOCKS + t)
                                                          for t in range(-1, 5)]
    rng.shuffle(keys)
    keys += [b"k1", b"x" * (1 << 20) + b"yz", bytearray(b"ab\x80"), b""]
    want = [h - (1 << 32) if h >= 1 << 31 else h for h in (murmur2(bytes(k)) for k in keys)]
    assert kafka_murmur2(keys).tolist() == want
    assert kafka_murmur2([]).tolist() == []


def test_kafka_murmur2_many_long_keys_chain_in_numpy_and_match_kafka_python(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # beyond LONG_BLOCKS blocks a numpy pass runs while MIN_PASS_KEYS keys reach it; only the
    # fewer keys left are chained a Python step per block (one such step per block of 1,000
    # keys of 300 bytes made the call 5x slower than a pass per block of each length)
    from kafka.partitioner import murmur2

    from trilink_spark.partitioners.core import kafka_hash
    from trilink_spark.partitioners.core.kafka_hash import LONG_BLOCKS, MIN_PASS_KEYS

    chained: list[int] = []
    chain = kafka_hash._chain_long

    def counting(data: Any, start: int, first: int, blocks: int, h: int) -> int:
        chained.append(blocks - first)
        return chain(data, start, first, blocks, h)

    monkeypatch.setattr(kafka_hash, "_chain_long", counting)
    rng = random.Random(17)
    for count in (MIN_PASS_KEYS - 1, MIN_PASS_KEYS, MIN_PASS_KEYS + 1, 1_000):
        chained.clear()
        keys = [rng.randbytes(4 * LONG_BLOCKS + rng.randrange(1, 400)) for _ in range(count)]
        keys += [b"", b"\xff" * 3, b"\x80" * (4 * LONG_BLOCKS + 1), b"\xff" * 5_000]
        rng.shuffle(keys)
        want = [h - (1 << 32) if h >= 1 << 31 else h for h in (murmur2(k) for k in keys)]
        assert kafka_murmur2(iter(keys)).tolist() == want
        assert len(chained) < MIN_PASS_KEYS
    chained.clear()
    keys = [rng.randbytes(300) for _ in range(1_000)]
    want = [h - (1 << 32) if h >= 1 << 31 else h for h in (murmur2(k) for k in keys)]
    assert kafka_murmur2(keys).tolist() == want
    assert chained == []  # equal lengths: all in numpy passes


def test_kafka_default_partition_uses_a_memoryview_key_as_its_bytes() -> None:
    # str() of a memoryview is its address: it placed the same key at random
    keys = [b"ab", bytearray(b"ab"), memoryview(b"ab"), memoryview(b"xab")[1:]]
    for n in (1, 7, 1_000):
        assert len(set(kafka_default_partition(keys, n).tolist())) == 1
    with pytest.raises(TypeError, match="bytes"):
        kafka_murmur2([memoryview(b"ab")])  # type: ignore[list-item]


def test_default_partitioner_placement_is_kafka_default_partition(spark: Any,
                                                                  kafka_broker: Any) -> None:
    topic = new_topic(kafka_broker, 5)
    produce(kafka_broker, topic, [(u, b"x") for u in range(300)])  # Kafka's default partitioner
    rows = read_kafka(spark, kafka_broker.bootstrap, topic).select("key", "partition").collect()
    keys = [int(r["key"]) for r in rows]
    assert kafka_default_partition(keys, 5).tolist() == [r["partition"] for r in rows]


def test_keyed_foreach_batch_keeps_state_per_kafka_partition(spark: Any, kafka_broker: Any,
                                                             tmp_path: Path) -> None:
    """Windows spanning micro-batches, computed where each Kafka partition was read."""
    topic = new_topic(kafka_broker)
    strategy = tl.ModuloPartitioner(N_PARTITIONS)
    # 40 sensors, one reading per second each for 60 s, in time order; value = second
    records = [(s, str(t).encode()) for t in range(60) for s in range(40)]
    produce(kafka_broker, topic, records, KafkaPythonPartitioner(strategy, key_decoder=int))
    outputs: list[Any] = []
    plans: list[int] = []

    def write(out: Any, batch_id: int) -> None:
        plans.append(shuffle_exchanges(out))
        outputs.extend(map(tuple, out.collect()))

    run = tl.keyed_foreach_batch(write, "sensor", "t", tl.KeyedWindowAggregate(10.0),
                                 delay=0.0, state_path=str(tmp_path / "state"))
    stream = read_kafka(spark, kafka_broker.bootstrap, topic, streaming=True,
                        starting_offsets="earliest", max_records_per_trigger=700)
    readings = stream.select(F.col("key").cast("string").cast("long").alias("sensor"),
                             F.col("value").cast("string").cast("long").alias("t"))
    query = (keyed_by_source(readings, "sensor").writeStream.foreachBatch(run)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert len(plans) >= 3 and set(plans) == {0}  # several micro-batches, never a shuffle
    # windows [0, 10) ... [40, 50) have closed for every sensor: 10 readings each
    closed = sorted((r[0], r[1]) for r in outputs)
    assert closed == sorted((s, w) for s in range(40) for w in range(0, 50, 10))
    assert all(r[3] == 10 for r in outputs)
    assert sorted(run.store.partitions()) == list(range(N_PARTITIONS))


def test_stream_rekeyed_into_another_topic(spark: Any, kafka_broker: Any, tmp_path: Path) -> None:
    """Kafka -> ahead_key_by on the stream -> Kafka: the output topic is placed by key."""
    source, target = new_topic(kafka_broker, 3), new_topic(kafka_broker)
    produce(kafka_broker, source, [(i % 37, str(i).encode()) for i in range(500)])
    strategy = tl.LeastKeyPartitioner(N_PARTITIONS).fit(list(range(30)))  # 7 keys it never saw
    stream = read_kafka(spark, kafka_broker.bootstrap, source, streaming=True,
                        starting_offsets="earliest")
    users = stream.select(F.col("key").cast("string").cast("long").alias("user"), "value")
    with pytest.raises(ValueError, match="no table learnt"):
        ahead_key_by(users, "user", tl.LeastKeyPartitioner(N_PARTITIONS))
    placed = ahead_key_by(users, "user", strategy)
    query = (placed.selectExpr("CAST(user AS STRING) AS key", "value", "partition")
             .writeStream.format(tl_kafka.SOURCE_NAME)
             .option("kafka.bootstrap.servers", kafka_broker.bootstrap).option("topic", target)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    rows = read_kafka(spark, kafka_broker.bootstrap, target).select("key", "partition").collect()
    assert len(rows) == 500
    hashed = tl.HashPartitioner(N_PARTITIONS, key_type="long")
    for r in rows:
        user = int(r["key"])
        want = strategy.partition(user) if user < 30 else hashed.partition(user)
        assert r["partition"] == want


def test_json_offsets_select_ranges(spark: Any, kafka_broker: Any, placed_topic: Any) -> None:
    topic, _, _ = placed_topic
    full = read_kafka(spark, kafka_broker.bootstrap, topic)
    ends = {r[0]: r[1] + 1 for r in full.groupBy("partition").agg(F.max("offset")).collect()}
    start = {topic: {"0": 5, "1": -1}}  # 2 and 3 left out: earliest
    end = {topic: {"0": 20, "3": 7}}  # 1 and 2 left out: latest
    part = read_kafka(spark, kafka_broker.bootstrap, topic,
                      starting_offsets=json.dumps(start), ending_offsets=json.dumps(end))
    got = {p: sorted(o for q, o in part.select("partition", "offset").collect() if q == p)
           for p in range(N_PARTITIONS)}
    assert got == {0: list(range(5, 20)), 1: [], 2: list(range(ends[2])), 3: list(range(7))}
    with pytest.raises(Exception, match="ending offset 1 is before starting offset 5"):
        read_kafka(spark, kafka_broker.bootstrap, topic, starting_offsets=json.dumps(start),
                   ending_offsets=json.dumps({topic: {"0": 1}})).count()


def test_readers_never_ask_the_broker_to_create_a_topic(kafka_broker: Any) -> None:
    """A broker with auto.create.topics.enable would create a mistyped or deleted topic that a
    consumer's metadata request asks for; the source's consumers never ask."""
    from trilink_spark.kafka.client import open_consumer

    opts = KafkaOptions.from_options({"kafka.bootstrap.servers": kafka_broker.bootstrap,
                                      "subscribe": "no-such-topic"}, False)
    for source in (False, True):
        consumer = open_consumer(opts, source=source)
        try:
            assert consumer.config["allow_auto_create_topics"] is False
            assert consumer.partitions_for_topic("no-such-topic") in (None, set())
        finally:
            consumer.close()
