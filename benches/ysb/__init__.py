"""The Yahoo Streaming Benchmark end to end: Kafka -> PySpark -> Redis, exact and restartable.

A benchmark application built on trilink-spark, not part of the library. ``setup`` stores the
catalogue in Redis; :class:`Producer` sends ad events at a rate (placed by campaign for Ahead
KeyBy) and logs them; :func:`start_query` runs the plain-Spark baseline or a trilink variant;
:func:`check` and :func:`latencies` compare Redis with the log; :func:`run_ysb` does it all.
The servers (tansu, redis-server) come from :mod:`trilink_spark.testing`.

Run from the repository root::

    python -m benches.ysb --events 100000 --rate 5000 --json ysb.json   # one run per variant
    python benches/ysb/bench_ysb.py --seconds 20                        # the rate ladder

Modules: :mod:`~benches.ysb.catalogue`, :mod:`~benches.ysb.producer`,
:mod:`~benches.ysb.queries`, :mod:`~benches.ysb.check`, :mod:`~benches.ysb.runner`,
:mod:`~benches.ysb.cli` (the command), :mod:`~benches.ysb.bench_ysb` (the ladder).
"""

from .catalogue import CATALOGUE_KEY, Catalogue, load_catalogue, setup
from .check import Mismatch, check, expected_counts, latencies, latency_summary, read_windows
from .producer import AD_TYPES, DEFAULT_TOPIC, EVENT_TYPES, LOG_SCHEMA, Producer
from .producer import ProducerError, ProducerReport, placement_strategy, read_log
from .queries import EVENT_SCHEMA, VARIANTS, WINDOW_MS, YsbQuery, start_query, views_frame
from .runner import VariantResult, parse_variants, redis_reads, run_variant, run_ysb

__all__ = [
    "CATALOGUE_KEY", "Catalogue", "load_catalogue", "setup",
    "Mismatch", "check", "expected_counts", "latencies", "latency_summary", "read_windows",
    "AD_TYPES", "DEFAULT_TOPIC", "EVENT_TYPES", "LOG_SCHEMA", "Producer", "ProducerError",
    "ProducerReport", "placement_strategy", "read_log",
    "EVENT_SCHEMA", "VARIANTS", "WINDOW_MS", "YsbQuery", "start_query", "views_frame",
    "VariantResult", "parse_variants", "redis_reads", "run_variant", "run_ysb",
]
