"""The YSB queries: plain PySpark (``baseline``) and the trilink variants, writing to Redis.

Every query reads the topic with the ``trilink-kafka`` source, parses the JSON events, keeps
the views, projects ``(ad_id, event_time)``, joins the campaign table (a broadcast join) and
counts views per campaign and 10-second window. Per window, Redis holds a hash with
``seen_count`` and ``time_updated`` (ms, when the count last changed), as YSB's
``CampaignProcessorCommon`` keeps them: ``{prefix}:w:{campaign_id}:{window_start_ms}``, named
in the set ``{prefix}:windows``; for ``global_merge`` the store's own key hash
``{prefix}:gm:k:v{campaign_id}:{window_start_ms}``, named in the store's key set
``{prefix}:gm:keys`` (:func:`~benches.ysb.read_windows` reads both layouts).

Variants (:data:`VARIANTS`):

``baseline``
    What a user writes: ``groupBy(window, campaign_id).count()`` in update mode (Spark's
    state store keeps the counts), and ``foreachBatch`` writing the absolute counts of the
    changed windows (``HSET``; idempotent, so a replayed batch rewrites the same values).
``key_by``
    Per micro-batch, :func:`~trilink_spark.key_by` places the rows by campaign with the chosen
    strategy (one exchange) and the keyed window counts are taken on that layout; the batch's
    deltas are added in Redis by one script, exactly once per batch id (a marker).
``local_merge``
    :func:`~trilink_spark.local_merge` (its Python engine, the paper's) pre-aggregates per
    campaign and window slot inside each input partition first, so the keyed exchange
    carries partial counts, not events.
``global_merge``
    :func:`~trilink_spark.global_merge` into a :class:`~trilink_spark.merge.RedisStore`: no keyed
    exchange at all. Each partition's partial counts come back to the driver (at most
    campaigns x open windows rows per partition) and the store adds every partition's flush,
    each exactly once by its marker, with ``time_updated`` (the store's ``updated_field``) and
    its metadata, in one script: one Redis round trip per batch
    (``apply_on="driver"``).
``ahead``
    Ahead KeyBy: the producer placed events by campaign
    (:class:`~benches.ysb.Producer` with ``placement=``), the query declares it with
    :func:`~trilink_spark.placement.keyed_by_source` and counts inside each Kafka partition: 0
    exchanges.

Exactly once: the baseline by idempotent absolute writes over Spark's checkpointed state;
the trilink variants by per-batch markers written in the same script as the deltas. A
micro-batch replayed after a restart from the checkpoint reads the same offsets, so it gives
the same deltas, which its marker keeps from being added twice. A Redis write that fails is
retried (the default for ``redis_retry_s`` is 60 s), so a Redis restart with its data kept
stalls the query instead of failing it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from trilink_spark import Partitioner, global_merge, key_by, keyed_agg, local_merge
from trilink_spark.kafka import read_kafka
from trilink_spark.merge import RedisStore
from trilink_spark.placement import keyed_by_source, shuffle_exchanges
from trilink_spark._internal.urls import redact
from trilink_spark.columns import PARTITION_COL
from trilink_spark.errors import InvalidArgumentError, StoreUnavailableError
from .catalogue import Catalogue, redis_client
from .producer import DEFAULT_TOPIC, placement_strategy

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["VARIANTS", "EVENT_SCHEMA", "WINDOW_MS", "YsbQuery", "start_query", "views_frame",
           "window_key", "topic_partition_count"]

logger = logging.getLogger(__name__)

#: The queries, in the order the benchmark runs them.
VARIANTS: tuple[str, ...] = ("baseline", "key_by", "local_merge", "global_merge", "ahead")
#: The schema ``from_json`` parses the events with.
EVENT_SCHEMA = ("user_id string, page_id string, ad_id string, ad_type string, "
                "event_type string, event_time long, ip_address string")
#: YSB's window: 10 seconds.
WINDOW_MS = 10_000

#: A shuffle exchange node in a physical plan's text (broadcasts are not shuffles).
_SHUFFLE = re.compile(r"\b(?:Exchange|ShuffleExchange) (?:hashpartitioning|rangepartitioning|"
                      r"RoundRobinPartitioning|SinglePartition|SinglePartitionShuffle)")

#: Add one batch's deltas, unless its marker is known (KEYS: applied set, windows set).
_DELTA_LUA = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return -1 end
local prefix = ARGV[2]
local now = ARGV[3]
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  local w = ARGV[5 + 2 * i]
  local h = prefix .. ':w:' .. w
  redis.call('HINCRBY', h, 'seen_count', ARGV[6 + 2 * i])
  redis.call('HSET', h, 'time_updated', now)
  redis.call('SADD', KEYS[2], w)
end
redis.call('SADD', KEYS[1], ARGV[1])
return n
"""

def window_key(prefix: str, campaign_id: str, window_start_ms: int) -> str:
    """The Redis hash of one window: ``{prefix}:w:{campaign_id}:{window_start_ms}``."""
    return f"{prefix}:w:{campaign_id}:{int(window_start_ms)}"


def topic_partition_count(bootstrap: str, topic: str) -> int:
    """The partition count of ``topic`` (refused when it does not exist). One metadata request."""
    from trilink_spark.kafka.client import KafkaOptions, open_consumer, topic_partitions

    opts = KafkaOptions.from_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic},
                                     streaming=False)
    consumer = open_consumer(opts)
    try:
        return len(topic_partitions(consumer, opts))
    finally:
        consumer.close()


def views_frame(spark: SparkSession, bootstrap: str, topic: str, catalogue: Catalogue,
                window_ms: int = WINDOW_MS) -> DataFrame:
    """The stream of views joined to their campaign: ``campaign_id``, ``event_time`` (ms,
    long) and ``window_start`` (ms, long).

    Cost: no exchange (the campaign table is broadcast); JSON parsing in the JVM.
    """
    from pyspark.sql import functions as F

    raw = read_kafka(spark, bootstrap, topic, streaming=True, starting_offsets="earliest")
    events = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    views = (events.select("e.ad_id", "e.event_type", "e.event_time")
             .where(F.col("event_type") == F.lit("view"))
             .select("ad_id", "event_time"))
    joined = views.join(F.broadcast(catalogue.frame(spark)), "ad_id")
    return joined.select(
        "campaign_id", "event_time",
        (F.col("event_time") - F.pmod(F.col("event_time"), F.lit(window_ms))).alias(
            "window_start"))


@dataclass
class BatchStats:
    """What the query's writer saw: per batch, the windows written and the Redis time
    (``global_merge`` writes inside its merge: its Redis time is part of ``compute_seconds``
    and its windows are not counted)."""

    batches: int = 0
    windows_written: int = 0
    redis_seconds: float = 0.0
    compute_seconds: float = 0.0
    exchanges: int | None = None
    redis_retries: int = 0
    batch_times: list[tuple[int, float, float]] = field(default_factory=list)


class _Writer:
    """The ``foreachBatch`` function of a variant (runs on the driver)."""

    def __init__(self, variant: str, redis_url: str, prefix: str, strategy: Partitioner,
                 retry_s: float) -> None:
        self.variant, self.redis_url, self.prefix = variant, redis_url, prefix
        self.strategy, self.retry_s = strategy, retry_s
        self.stats = BatchStats()
        self._client: Any = None
        self._delta: Any = None
        self._lock = threading.Lock()
        self.store = RedisStore(redis_url, prefix=f"{prefix}:gm", updated_field="time_updated")

    # ------------------------------------------------------------------ Redis
    def _redis(self, fn: Callable[[Any], Any]) -> Any:
        import redis

        deadline = time.monotonic() + self.retry_s
        started = time.perf_counter()
        try:
            while True:
                try:
                    if self._client is None:
                        # the baseline writes as a user's code would; the trilink
                        # variants with the client their store uses
                        self._client = redis_client(self.redis_url,
                                                    lean=self.variant != "baseline")
                        self._delta = self._client.register_script(_DELTA_LUA)
                    return fn(self._client)
                except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
                    if time.monotonic() >= deadline:
                        raise StoreUnavailableError(
                            f"Redis at {redact(self.redis_url)} stayed unreachable for "
                            f"{self.retry_s:g} s ({type(err).__name__}); the batch is not "
                            "written, a restart from the checkpoint writes it") from None
                    self.stats.redis_retries += 1
                    logger.warning("Redis unreachable (%s); retrying", type(err).__name__)
                    self._client = None
                    time.sleep(0.2)
        finally:
            self.stats.redis_seconds += time.perf_counter() - started

    def _write_absolute(self, rows: Any) -> int:
        now = str(int(time.time() * 1000))

        def run(client: Any) -> int:
            pipe = client.pipeline(transaction=True)
            for c, w, n in rows:
                pipe.hset(f"{self.prefix}:w:{c}:{w}",
                          mapping={"seen_count": int(n), "time_updated": now})
            if rows:
                pipe.sadd(f"{self.prefix}:windows", *[f"{c}:{w}" for c, w, _ in rows])
            pipe.execute()
            return len(rows)

        return int(self._redis(run)) if rows else 0

    def _write_deltas(self, rows: Any, batch_id: int) -> int:
        if not rows:  # an empty micro-batch: nothing to add, no round trip (a replay of it
            return 0  # reads the same empty offsets)
        args: list[Any] = [str(batch_id), self.prefix, str(int(time.time() * 1000)), len(rows)]
        for c, w, n in rows:
            args += [f"{c}:{w}", int(n)]

        def run(client: Any) -> int:
            args[2] = str(int(time.time() * 1000))
            return int(self._delta(keys=[f"{self.prefix}:applied", f"{self.prefix}:windows"],
                                   args=args))

        done = int(self._redis(run))
        if done < 0:
            logger.info("%s: batch %d was applied before (replay); nothing added",
                        self.variant, batch_id)
            return 0
        return done

    # ------------------------------------------------------------------ batches
    def counts(self, batch: DataFrame) -> DataFrame:
        """The batch's per-window counts ``(campaign_id, window_start, n)`` by this variant's
        operator (not used by ``global_merge``, which counts into its store)."""
        from pyspark.sql import functions as F

        if self.variant == "baseline":
            return batch.select("campaign_id", F.unix_millis(F.col("window.start")).alias(
                "window_start"), F.col("count").alias("n"))
        if self.variant == "key_by":
            placed = key_by(batch, "campaign_id", self.strategy, self.strategy.num_partitions,
                            fit="none", compact="never")
            grouped = placed.groupBy(PARTITION_COL, "campaign_id", "window_start").agg(
                F.count(F.lit(1)).alias("n"))
            return grouped.drop(PARTITION_COL)
        if self.variant == "local_merge":
            partial = local_merge(batch, "campaign_id", "event_time", float(WINDOW_MS),
                                  {"n": ("count", None)}, engine="python")
            placed = key_by(partial, "campaign_id", self.strategy, self.strategy.num_partitions,
                            fit="none", compact="never")
            grouped = placed.groupBy(PARTITION_COL, "campaign_id", "slot_start").agg(
                F.sum("n").alias("n"))
            return grouped.select("campaign_id", F.col("slot_start").cast("long").alias(
                "window_start"), "n")
        if self.variant == "ahead":
            keyed = keyed_by_source(batch.withColumn("cw", F.concat_ws(
                ":", "campaign_id", F.col("window_start").cast("string"))), "cw")
            counted = keyed_agg(keyed, "cw", F.count("*").alias("n"))
            parts = F.split(F.col("cw"), ":")
            return counted.select(parts.getItem(0).alias("campaign_id"),
                                  parts.getItem(1).cast("long").alias("window_start"), "n")
        raise InvalidArgumentError(f"no counts frame for variant {self.variant!r}")

    def _global_frame(self, batch: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        return batch.select(F.concat_ws(":", "campaign_id", F.col("window_start").cast(
            "string")).alias("cw"))

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        with self._lock:
            if self.variant == "global_merge":
                frame = self._global_frame(batch)
                if self.stats.exchanges is None:
                    # the job global_merge runs: plan_merge + mapInArrow over this frame
                    self.stats.exchanges = shuffle_exchanges(local_merge(
                        frame.withColumn("t", frame["cw"].isNull().cast("long")), "cw", "t",
                        float(2**62), {"seen_count": ("count", None)}, engine="python"))
                deadline = time.monotonic() + self.retry_s
                while True:
                    try:
                        global_merge(frame, "cw", {"seen_count": ("count", None)},
                                     store=self.store,
                                     batch_id=batch_id, read=False, apply_on="driver")
                        break
                    except StoreUnavailableError:
                        if time.monotonic() >= deadline:
                            raise
                        self.stats.redis_retries += 1
                        logger.warning("global_merge: Redis unreachable in batch %d; "
                                       "rerunning it (markers keep it exactly once)", batch_id)
                        time.sleep(0.5)
                compute = time.perf_counter() - started
                written = 0  # not counted: the store writes them inside global_merge
            else:
                counts = self.counts(batch)
                if self.stats.exchanges is None:
                    self.stats.exchanges = shuffle_exchanges(counts)
                table = counts.toArrow()
                rows = list(zip(table.column("campaign_id").to_pylist(),
                                table.column("window_start").to_pylist(),
                                table.column("n").to_pylist()))
                compute = time.perf_counter() - started
                if self.variant == "baseline":
                    written = self._write_absolute(rows)
                else:
                    written = self._write_deltas(rows, batch_id)
            self.stats.batches += 1
            self.stats.windows_written += written
            self.stats.compute_seconds += compute
            self.stats.batch_times.append((batch_id, started, time.perf_counter()))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


@dataclass
class YsbQuery:
    """A running YSB query: the Structured Streaming query and what its writer measured.

    Attributes
    ----------
    variant : str
    prefix : str
        Redis prefix of its windows.
    query : StreamingQuery
    stats : BatchStats
    """

    variant: str
    prefix: str
    query: StreamingQuery
    writer: _Writer

    @property
    def stats(self) -> BatchStats:
        """Batches, windows written, Redis and compute seconds, exchanges per batch plan."""
        return self.writer.stats

    def processed(self) -> int:
        """Input rows of the batches in the query's recent progress (Kafka records read)."""
        return sum(int(p.numInputRows) for p in self.query.recentProgress)

    def plan_exchanges(self) -> int | None:
        """Shuffle exchanges of the micro-batch plans: the streaming plan of the last batch
        (where ``baseline``'s stateful aggregation shuffles) plus those of the batch
        function's own jobs (the trilink variants'). None before a batch ran.

        Cost: reads the last execution's plan text (classic PySpark; on Spark Connect only
        the batch function's count is known)."""
        streaming = 0
        jsq = getattr(self.query, "_jsq", None)
        if jsq is not None:
            inner_query = jsq.streamingQuery() if hasattr(jsq, "streamingQuery") else jsq
            last = inner_query.lastExecution()
            if last is not None:
                streaming = len(_SHUFFLE.findall(str(last.executedPlan().toString())))
        inner = self.writer.stats.exchanges
        if inner is None and not streaming:
            return None
        return streaming + (inner or 0)

    def stop(self) -> None:
        """Stop the query (idempotent) and close its Redis connection."""
        try:
            self.query.stop()
        finally:
            self.writer.close()


def start_query(
    spark: SparkSession,
    variant: str,
    *,
    bootstrap: str,
    redis_url: str,
    catalogue: Catalogue,
    checkpoint: str,
    topic: str = DEFAULT_TOPIC,
    prefix: str | None = None,
    strategy: str | Partitioner = "least_key",
    trigger: str = "1 second",
    redis_retry_s: float = 60.0,
) -> YsbQuery:
    """Start one YSB query.

    Parameters
    ----------
    spark : SparkSession
    variant : str
        One of :data:`VARIANTS`.
    bootstrap, topic : str
        Where the events are (the topic must exist).
    redis_url : str
        Where the windows go.
    catalogue : Catalogue
        The campaign table joined with (from :func:`~benches.ysb.setup`).
    checkpoint : str
        The query's checkpoint directory; a query started again with the same one resumes
        where it stopped (exactly once, see the module docs).
    prefix : str, optional
        Redis prefix of the windows; default ``ysb:{variant}``.
    strategy : str or Partitioner
        Placement of campaigns for ``key_by`` and ``local_merge`` (fitted on the catalogue's
        campaigns when it is a table strategy); ``ahead`` uses the producer's.
    trigger : str
        Processing-time trigger, e.g. ``"1 second"``.
    redis_retry_s : float
        How long a batch retries Redis writes before failing.

    Returns
    -------
    YsbQuery

    Notes
    -----
    Cost per micro-batch: the read and parse of its records, the variant's operator (see the
    module docs: one exchange for ``baseline``, ``key_by`` and ``local_merge``, none for
    ``global_merge`` and ``ahead``), one collect of the per-window counts to the driver (at
    most campaigns x open windows rows), and one Redis round trip (``global_merge`` too:
    every partition's partial counts, the markers and the store's metadata go in one script
    run from the driver).

    Examples
    --------
    >>> q = start_query(spark, "ahead", bootstrap=broker, redis_url=url, catalogue=cat,
    ...                 checkpoint="/tmp/ysb-ahead")  # doctest: +SKIP
    """
    if variant not in VARIANTS:
        raise InvalidArgumentError(f"unknown YSB variant {variant!r}; choose from {VARIANTS}")
    prefix = prefix or f"ysb:{variant}"
    parts = topic_partition_count(bootstrap, topic)
    placed = placement_strategy(strategy, catalogue, parts)
    writer = _Writer(variant, redis_url, prefix, placed, redis_retry_s)
    views = views_frame(spark, bootstrap, topic, catalogue)
    if variant == "baseline":
        from pyspark.sql import functions as F

        stream = (views.withColumn("ts", F.timestamp_millis("event_time"))
                  .groupBy(F.window("ts", f"{WINDOW_MS // 1000} seconds"), "campaign_id")
                  .count())
        out = stream.writeStream.outputMode("update")
    else:
        out = views.writeStream.outputMode("append")
    query = (out.foreachBatch(writer).option("checkpointLocation", checkpoint)
             .trigger(processingTime=trigger).queryName(f"ysb-{variant}-{prefix}").start())
    logger.info("YSB %s query started (topic %s, %d partitions, prefix %s)", variant, topic,
                parts, prefix)
    return YsbQuery(variant, prefix, query, writer)
