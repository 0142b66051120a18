"""Records/s per partition of the ``trilink-kafka`` source against the plain client (issue 18).

One tansu broker (memory storage), one topic of ``--partitions`` partitions filled with
``--records`` YSB events (JSON values of about 190 bytes, campaign keys). Every figure reads the
same records in this one run:

- ``client``: the plain kafka-python consumer loop, in one process, one partition at a time
  (assign, seek, poll until the end, touch nothing): what the client itself allows.
- ``client_tuned``: the same loop with the fetch sizes the source now uses.
- ``source_before``: ``fetch_range`` of the committed source (``git show HEAD:...``), one
  partition at a time, Arrow batches out.
- ``source_after``: ``fetch_range`` of the working tree, the same way (its consumer is
  cached: the first range opens it, the warm-up run pays for that).
- ``spark_count``: ``read_kafka(...).count()`` through Spark (``local[2]``: two partitions
  read at once, so per partition is the total over the partitions).

Run: ``python benches/kafka/bench_source.py [--records 200000] [--partitions 4]``
(writes benches/results/kafka_source.json).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))
sys.path.insert(0, str(ROOT))  # benches.ysb
from common import write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import trilink_spark as tl  # noqa: E402
from trilink_spark.kafka import read_kafka  # noqa: E402
from trilink_spark.kafka import client as after  # noqa: E402
from benches.ysb import Producer, setup  # noqa: E402
from trilink_spark.testing import KafkaBroker, RedisServer, create_topic  # noqa: E402


def head_client(work: Path) -> Any:
    """The committed ``trilink_spark/kafka/client.py``, imported as a sibling module."""
    text = subprocess.run(["git", "show", "HEAD:trilink_spark/kafka/client.py"], cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout
    path = work / "client_head.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("trilink_spark.kafka._client_head", path)
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load the committed client")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def plain_loop(bootstrap: str, topic: str, partitions: int, ends: dict[int, int],
               **config: Any) -> int:
    """The kafka-python consumer loop: one consumer, one partition after another."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=[bootstrap], enable_auto_commit=False,
                             group_id=None, **config)
    n = 0
    try:
        for p in range(partitions):
            tp = TopicPartition(topic, p)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            while consumer.position(tp) < ends[p]:
                for records in consumer.poll(timeout_ms=200).values():
                    n += len(records)
    finally:
        consumer.close()
    return n


def best_of(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    fn()  # warm-up (imports, connections, the cached consumer)
    times, n = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - start)
    return min(times), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-kafka-source-"))
    before = head_client(work)
    results: dict[str, Any] = {}
    with KafkaBroker() as broker, RedisServer(append_only=True) as redis:
        cat = setup(redis.url)
        topic = "source-bench"
        create_topic(broker.bootstrap, topic, args.partitions)
        Producer(broker.bootstrap, cat, work / "log.parquet", rate=1e9, events=args.records,
                 topic=topic).run()
        opts_after = after.KafkaOptions.from_options(
            {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic}, streaming=False)
        opts_before = before.KafkaOptions.from_options(
            {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic}, streaming=False)
        consumer = after.open_consumer(opts_after)
        try:
            ends, _ = after.latest_offsets(consumer, opts_after, list(range(args.partitions)))
        finally:
            consumer.close()
        total = sum(ends.values())

        def via(module: Any, opts: Any) -> Callable[[], int]:
            def run() -> int:
                return sum(b.num_rows for p in range(args.partitions)
                           for b in module.fetch_range(opts, p, 0, ends[p]))
            return run

        cases: dict[str, Callable[[], int]] = {
            "client": lambda: plain_loop(broker.bootstrap, topic, args.partitions, ends),
            "client_tuned": lambda: plain_loop(broker.bootstrap, topic, args.partitions, ends,
                                               **after.FETCH_CONFIG),
            "source_before": via(before, opts_before),
            "source_after": via(after, opts_after),
        }
        for name, fn in cases.items():
            seconds, n = best_of(fn, args.repeat)
            if n != total:
                raise RuntimeError(f"{name} read {n} records, the topic holds {total}")
            # one partition at a time in one process: records/s is records/s per partition
            results[name] = {"records": n, "seconds": seconds,
                             "records_per_s_per_partition": n / seconds}
            print(name, results[name], flush=True)
        if not args.no_spark:
            spark = tl.get_session("local[2]", app_name="bench-kafka-source",
                                   shuffle_partitions=args.partitions)
            spark.sparkContext.setLogLevel("ERROR")
            df = read_kafka(spark, broker.bootstrap, topic)
            seconds, n = best_of(df.count, args.repeat)
            results["spark_count"] = {"records": n, "seconds": seconds, "records_per_s": n / seconds,
                                      "records_per_s_per_partition": n / seconds / args.partitions,
                                      "note": "local[2]: two partitions read at once"}
            print("spark_count", results["spark_count"], flush=True)
    client = results["client"]["records_per_s_per_partition"]
    summary = {name: round(r["records_per_s_per_partition"] / client, 3)
               for name, r in results.items()}
    path = write_json("kafka_source", {
        "records": total, "partitions": args.partitions, "repeat": args.repeat,
        "method": "best of --repeat after one warm-up; one partition at a time in one process "
                  "(records/s = records/s per partition) except spark_count",
        "cases": results, "relative_to_client": summary,
        "crc32c": "C (crc32c package)" if _crc_c() else "pure Python (kafka-python's own)"})
    print("relative to the plain client:", summary)
    print(f"written {path}")


def _crc_c() -> bool:
    from kafka.record import util

    return util.crc32c_c is not None


if __name__ == "__main__":
    main()
