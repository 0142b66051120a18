"""Run YSB variants end to end: topic, query, producer at a rate, drain, check, measure.

:func:`run_variant` runs one variant on a fresh topic and Redis prefix and returns a
:class:`VariantResult`; it can stop and restart the query from its checkpoint mid-run, and
call a hook mid-run (the tests restart redis-server there). :func:`run_ysb` starts tansu and
redis-server when no addresses are given, sets up the catalogue and runs the variants one after
another: what ``python -m benches.ysb`` does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trilink_spark import Partitioner, get_session
from trilink_spark.errors import InvalidArgumentError, MissingDependencyError
from trilink_spark.testing import KafkaBroker, RedisServer, create_topic
from .catalogue import Catalogue, redis_client, setup
from .check import check, latencies, latency_summary
from .producer import DEFAULT_TOPIC, Producer
from .queries import VARIANTS, YsbQuery, start_query

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SUSTAINED_RULE", "VariantResult", "run_variant", "run_ysb", "redis_reads", "parse_variants"]

logger = logging.getLogger(__name__)

#: The rule :attr:`VariantResult.sustained` applies (quoted by the benchmark's JSON).
SUSTAINED_RULE = (
    "processed >= input: every event produced was processed within max(5 s, 3 triggers) of "
    "the producer's last event; and the lag (events produced but not yet processed, at the "
    "end of each non-empty batch while the producer ran) did not grow over the last 5 "
    "batches: not non-decreasing by more than one trigger's input (rate x trigger) over them"
)


@dataclass
class VariantResult:
    """The figures of one variant's run (what ``python -m benches.ysb --json`` writes).

    Attributes
    ----------
    variant : str
    events : int
        Events produced (and acknowledged by the broker).
    views : int
        Of which views (what the windows count).
    mismatches : int
        Windows whose Redis count differs from the events sent (:func:`~benches.ysb.check`).
    exchanges : int or None
        Shuffle exchanges in the plan of a micro-batch.
    throughput : float
        Events per second from the first send until every event was processed.
    input_rate : float
        Events per second the producer achieved.
    capacity : float
        Events per second of batch processing time (input rows / trigger execution time).
    p50_latency_ms, p99_latency_ms : float or None
        ``time_updated - window end`` over the windows that ended before the last event.
    p50_event_latency_ms, p99_event_latency_ms : float or None
        ``time_updated - the window's last event time`` over every window.
    redis_round_trips_per_1000 : float or None
        Read events Redis processed per 1,000 events (None when Redis restarted mid-run): one
        per request of a client that fits one read (16 KB), more for a larger one.
    redis_round_trips : int or None
        The same read events in all (not per 1,000).
    sustained : bool
        The one rule of the benchmark (:data:`SUSTAINED_RULE`): processed >= input (every
        event produced was processed within the drain limit, ``max(5 s, 3 triggers)`` after
        the producer's last event) and the lag did not grow over the last 5 batches while the
        producer ran (not non-decreasing by more than one trigger's input over them).
        ``capacity`` is reported beside it, not part of it.
    lag : list of int
        Events produced but not yet processed at the end of each non-empty batch.
    batches : int
    drain_s : float
        Seconds from the producer's last event until the query had read it.
    restarts : int
        Query restarts from the checkpoint during the run.
    redis_restarts : int
    producer_processes : int
        Processes that produced the events.
    stage_seconds : dict
        Driver time per stage: ``compute`` (Spark jobs of the batch function) and ``redis``.
    """

    variant: str
    events: int
    views: int
    mismatches: int
    exchanges: int | None
    throughput: float
    input_rate: float
    capacity: float
    p50_latency_ms: float | None
    p99_latency_ms: float | None
    p50_event_latency_ms: float | None
    p99_event_latency_ms: float | None
    redis_round_trips_per_1000: float | None
    sustained: bool
    lag: list[int] = field(default_factory=list)
    batches: int = 0
    drain_s: float = 0.0
    restarts: int = 0
    redis_restarts: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    redis_round_trips: int | None = None
    producer_processes: int = 1

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values."""
        return asdict(self)


def parse_variants(text: str | Sequence[str]) -> list[str]:
    """``"baseline,ahead"`` (or a list) as checked variant names, in the given order."""
    names = [v.strip() for v in (text.split(",") if isinstance(text, str) else text)]
    names = [v for v in names if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise InvalidArgumentError(
            f"unknown YSB variant(s) {unknown or names}; choose from {', '.join(VARIANTS)}")
    return list(dict.fromkeys(names))


def redis_reads(client: Any) -> int:
    """Redis's ``total_reads_processed`` (read events: one per round trip of a client, more
    for a request larger than a read buffer). One round trip."""
    return int(client.info("stats")["total_reads_processed"])


def _offsets_read(query: Any) -> int:
    """Records read through the last completed batch (sum of its end offsets)."""
    progress = query.lastProgress
    if not progress or not progress.get("sources"):
        return 0
    end = progress["sources"][0].get("endOffset")
    if not end:
        return 0
    data = json.loads(end) if isinstance(end, str) else end
    return int(sum(int(o) for offsets in data.values() for o in offsets.values()))


def _progress_rows(progress: list[dict[str, Any]]) -> list[tuple[float, int, float]]:
    """(end time, records read through the batch, seconds) per non-empty batch."""
    out = []
    for p in progress:
        if not p.get("numInputRows"):
            continue
        started = datetime.strptime(p["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
        seconds = float(p.get("durationMs", {}).get("triggerExecution", 0)) / 1000
        end = p["sources"][0].get("endOffset")
        data = json.loads(end) if isinstance(end, str) else end
        read = int(sum(int(o) for offsets in data.values() for o in offsets.values()))
        out.append((started + seconds, read, seconds))
    return out


def _first_rows(progress: list[dict[str, Any]]) -> int:
    """Input rows of the first non-empty batch."""
    return next((int(p["numInputRows"]) for p in progress if p.get("numInputRows")), 0)


def _is_sustained(lags: list[int], drain_s: float, limit_s: float, step: float) -> bool:
    if drain_s > limit_s:
        return False
    last = lags[-5:]
    if len(last) < 5:
        return True
    growing = all(b >= a for a, b in zip(last, last[1:])) and last[-1] - last[0] > step
    return not growing


def run_variant(
    spark: SparkSession,
    variant: str,
    *,
    bootstrap: str,
    redis_url: str,
    catalogue: Catalogue,
    workdir: str | Path,
    rate: float,
    events: int | None = None,
    duration: float | None = None,
    partitions: int = 4,
    strategy: str | Partitioner = "least_key",
    trigger: str = "1 second",
    seed: int = 0,
    restart_query_at: float | None = None,
    mid_run: Callable[[], None] | None = None,
    mid_run_at: float = 0.5,
    drain_limit_s: float = 120.0,
    topic: str | None = None,
    producer_processes: int = 1,
) -> VariantResult:
    """Run one YSB variant end to end and measure it.

    Parameters
    ----------
    spark : SparkSession
    variant : str
        One of :data:`~benches.ysb.VARIANTS`.
    bootstrap, redis_url : str
        The broker and Redis (the catalogue must be set up there).
    catalogue : Catalogue
    workdir : str or Path
        Checkpoint and event log go under it.
    rate : float
        Events per second.
    events, duration
        How much to produce (see :class:`~benches.ysb.Producer`).
    partitions : int
        Partitions of the run's fresh topic.
    strategy : str or Partitioner
        Placement of campaigns (``key_by``, ``local_merge``; the producer's for ``ahead``).
    trigger : str
        Processing-time trigger.
    restart_query_at : float, optional
        Stop the query when this fraction of the events was sent and start it again from its
        checkpoint.
    mid_run : callable, optional
        Called once when ``mid_run_at`` of the events were sent (e.g. restart redis-server).
    drain_limit_s : float
        How long to wait, after the producer's end, for the query to read everything.
    topic : str, optional
        Default ``ad-events-{variant}-{run id}`` (a fresh topic per run).
    producer_processes : int
        Processes the producer spreads the events over (:class:`~benches.ysb.Producer`
        ``processes=``; its log is then a directory of parts).

    Returns
    -------
    VariantResult

    Notes
    -----
    Cost: the producer and the query run for the production time plus the drain; then one
    check (Arrow over the event log) and two Redis reads of the windows.

    Examples
    --------
    >>> r = run_variant(spark, "ahead", bootstrap=b, redis_url=u, catalogue=cat,
    ...                 workdir="/tmp/ysb", rate=5_000, events=20_000)  # doctest: +SKIP
    >>> r.mismatches, r.exchanges  # doctest: +SKIP
    (0, 0)
    """
    run_id = uuid.uuid4().hex[:8]
    topic = topic or f"{DEFAULT_TOPIC}-{variant}-{run_id}"
    prefix = f"ysb:{variant}:{run_id}"
    work = Path(workdir) / f"{variant}-{run_id}"
    work.mkdir(parents=True, exist_ok=True)
    checkpoint, log_path = str(work / "checkpoint"), work / "events.parquet"
    create_topic(bootstrap, topic, partitions)
    total = events if events is not None else int(rate * float(duration or 0))
    step = float(trigger.split()[0]) if trigger.split()[0].replace(".", "").isdigit() else 1.0

    def start() -> YsbQuery:
        return start_query(spark, variant, bootstrap=bootstrap, redis_url=redis_url,
                           catalogue=catalogue, checkpoint=checkpoint, topic=topic,
                           prefix=prefix, strategy=strategy, trigger=trigger)

    monitor = redis_client(redis_url)
    reads0 = redis_reads(monitor)
    query = start()
    progress: list[dict[str, Any]] = []
    seen_batches: set[tuple[str, int]] = set()
    restarts = redis_restarts = 0
    producer = Producer(bootstrap, catalogue, log_path, rate=rate, events=events,
                        duration=duration, topic=topic, seed=seed,
                        placement=strategy if variant == "ahead" else None,
                        processes=producer_processes)

    def collect() -> None:
        for p in query.query.recentProgress:
            mark = (str(p.runId), int(p.batchId))
            if mark not in seen_batches:
                seen_batches.add(mark)
                progress.append(json.loads(p.json))

    try:
        deadline = time.monotonic() + 120
        while not query.query.recentProgress and time.monotonic() < deadline:
            if query.query.exception() is not None:
                raise query.query.exception()  # type: ignore[misc]
            time.sleep(0.1)
        samples: list[tuple[float, int]] = [(time.time(), 0)]
        producer.start()
        t0 = time.time()
        thread = producer._thread
        while thread is not None and thread.is_alive():
            samples.append((time.time(), producer.sent))
            collect()
            if (restart_query_at is not None and not restarts
                    and producer.sent >= restart_query_at * max(total, 1)):
                logger.info("YSB %s: stopping the query and restarting it from its checkpoint",
                            variant)
                collect()
                query.stop()
                query = start()
                restarts += 1
            if (mid_run is not None and not redis_restarts
                    and producer.sent >= mid_run_at * max(total, 1)):
                mid_run()
                redis_restarts += 1
            if query.query.exception() is not None:
                producer.stop()
                raise query.query.exception()  # type: ignore[misc]
            time.sleep(0.05)
        report = producer.join()
        t0 = producer.started or t0  # spawned producers start sending after their start-up
        t_sent = time.time()
        samples.append((t_sent, report.events))
        drain_end = time.monotonic() + drain_limit_s
        while _offsets_read(query.query) < report.events:
            if query.query.exception() is not None:
                raise query.query.exception()  # type: ignore[misc]
            if time.monotonic() > drain_end:
                break
            time.sleep(0.05)
        t_done = time.time()
        collect()
        read = _offsets_read(query.query)
        stats = query.stats
        exchanges = query.plan_exchanges()
    finally:
        producer.stop()
        query.stop()
    reads1 = redis_reads(monitor)
    monitor.close()
    mismatches = check(redis_url, prefix, log_path, catalogue)
    lat = latency_summary(latencies(redis_url, prefix, log_path, catalogue))
    rows = _progress_rows(progress)
    times = np.array([t for t, _ in samples])
    sent = np.array([n for _, n in samples])
    lags = [int(np.interp(end, times, sent)) - done for end, done, _ in rows if end <= t_sent]
    busy = sum(s for _, _, s in rows)
    drain_s = max(t_done - t_sent, 0.0)
    # rows per second of batch execution: below the input rate, batches fall behind
    capacity = (rows[-1][1] - (rows[0][1] - _first_rows(progress))) / busy if busy else 0.0
    if read < report.events:
        logger.warning("YSB %s: only %d of %d events read within %g s", variant, read,
                       report.events, drain_limit_s)
    result = VariantResult(
        variant=variant, events=report.events, views=report.views,
        mismatches=len(mismatches), exchanges=exchanges,
        throughput=read / max(t_done - t0, 1e-9), input_rate=report.rate,
        capacity=capacity,
        p50_latency_ms=lat["p50_latency_ms"], p99_latency_ms=lat["p99_latency_ms"],
        p50_event_latency_ms=lat.get("p50_event_latency_ms"),
        p99_event_latency_ms=lat.get("p99_event_latency_ms"),
        redis_round_trips_per_1000=(None if redis_restarts else
                                    (reads1 - reads0 - 1) * 1000 / max(report.events, 1)),
        redis_round_trips=None if redis_restarts else reads1 - reads0 - 1,
        producer_processes=report.processes,
        sustained=(read >= report.events
                   and _is_sustained(lags, drain_s, max(5.0, 3 * step), rate * step)),
        lag=lags, batches=len(rows), drain_s=drain_s, restarts=restarts,
        redis_restarts=redis_restarts,
        stage_seconds={"compute": stats.compute_seconds, "redis": stats.redis_seconds,
                       "batch_total": busy},
    )
    if mismatches:
        logger.warning("YSB %s: %d mismatching windows, e.g. %s", variant, len(mismatches),
                       mismatches[:3])
    return result


@contextlib.contextmanager
def _servers(bootstrap: str | None, redis_url: str | None) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        try:
            if bootstrap is None:
                bootstrap = stack.enter_context(KafkaBroker()).bootstrap
            if redis_url is None:
                redis_url = stack.enter_context(RedisServer(append_only=True)).url
        except MissingDependencyError as err:
            raise MissingDependencyError(
                f"{err}; or pass --bootstrap HOST:PORT / --redis URL of a running server"
            ) from None
        yield bootstrap, redis_url


def run_ysb(
    variants: Sequence[str],
    *,
    events: int,
    rate: float,
    bootstrap: str | None = None,
    redis_url: str | None = None,
    spark: SparkSession | None = None,
    partitions: int = 4,
    strategy: str = "least_key",
    trigger: str = "1 second",
    seed: int = 0,
    workdir: str | Path | None = None,
    on_result: Callable[[VariantResult], None] | None = None,
    producer_processes: int = 1,
) -> list[VariantResult]:
    """Run YSB variants one after another (``python -m benches.ysb``).

    Starts tansu and redis-server on free loopback ports when ``bootstrap`` / ``redis_url``
    are not given (both stopped at the end), sets up the catalogue (100 x 10) and runs each
    variant on a fresh topic with ``events`` events at ``rate`` per second, produced by
    ``producer_processes`` processes.

    Returns
    -------
    list of VariantResult

    Notes
    -----
    Cost: per variant, ``events / rate`` seconds of production plus the query's start and
    drain (a few seconds).

    Examples
    --------
    >>> results = run_ysb(["baseline", "ahead"], events=50_000, rate=10_000)  # doctest: +SKIP
    """
    names = parse_variants(list(variants))
    session = spark or get_session("local[2]", app_name="trilink-ysb", shuffle_partitions=4)
    results: list[VariantResult] = []
    with contextlib.ExitStack() as stack:
        work = Path(workdir) if workdir is not None else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="trilink-ysb-")))
        b, r = stack.enter_context(_servers(bootstrap, redis_url))
        catalogue = setup(r, seed=seed)
        for name in names:
            logger.info("YSB: running %s (%d events at %g/s)", name, events, rate)
            result = run_variant(session, name, bootstrap=b, redis_url=r, catalogue=catalogue,
                                 workdir=work, rate=rate, events=events, partitions=partitions,
                                 strategy=strategy, trigger=trigger, seed=seed,
                                 producer_processes=producer_processes)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results
