"""The Yahoo Streaming Benchmark end to end: Kafka -> PySpark -> Redis, exact and restartable.

``setup`` stores the catalogue in Redis; :class:`Producer` sends ad events at a rate (placed by
campaign for Ahead KeyBy) and logs them; :func:`start_query` runs the plain-Spark baseline or a
trilink variant; :func:`check` and :func:`latencies` compare Redis with the log;
:func:`run_ysb` does it all for ``trilink-spark ysb``.
"""

from .catalogue import CATALOGUE_KEY, Catalogue, load_catalogue, setup
from .check import Mismatch, check, expected_counts, latencies, latency_summary, read_windows
from .producer import AD_TYPES, DEFAULT_TOPIC, EVENT_TYPES, LOG_SCHEMA, Producer
from .producer import ProducerError, ProducerReport, create_topic, placement_strategy
from .producer import read_log
from .queries import EVENT_SCHEMA, VARIANTS, WINDOW_MS, YsbQuery, start_query, views_frame
from .runner import VariantResult, parse_variants, redis_reads, run_variant, run_ysb
from .servers import RedisServer, ServerStartError, TansuBroker

__all__ = [
    "CATALOGUE_KEY", "Catalogue", "load_catalogue", "setup",
    "Mismatch", "check", "expected_counts", "latencies", "latency_summary", "read_windows",
    "AD_TYPES", "DEFAULT_TOPIC", "EVENT_TYPES", "LOG_SCHEMA", "Producer", "ProducerError",
    "ProducerReport",
    "create_topic", "placement_strategy", "read_log",
    "EVENT_SCHEMA", "VARIANTS", "WINDOW_MS", "YsbQuery", "start_query", "views_frame",
    "VariantResult", "parse_variants", "redis_reads", "run_variant", "run_ysb",
    "RedisServer", "ServerStartError", "TansuBroker",
]
