"""Placement: rows on the partition their strategy gives, with one exchange or none.

``key_by`` computes the partition id in the JVM and lets Spark's ``repartitionById`` move the
rows; ``keyed_agg`` and ``keyed_apply`` group on that layout; ``ahead_key_by`` computes the same
id for a Kafka producer, and ``keyed_by_source`` declares a source already grouped by key.
``physical_plan`` and ``shuffle_exchanges`` show what Spark will run, so a job can check that it
shuffles once; ``already_placed`` says when a frame needs no shuffle at all.
"""

from .._internal.spark.plan import physical_plan, shuffle_exchanges
from .key_by import FIT_MODES, KeyedStrategy, key_by, key_kind, resolve_strategy
from .key_by import already_placed, with_partition_id
from .keyed import COMBINE_CHOICES, KeyedAggPlan, explain_keyed_agg, keyed_agg, keyed_apply
from .source import SOURCE_AGGREGATES, is_keyed_by_source, keyed_by_source
from .ahead import KafkaPythonPartitioner, ahead_key_by, confluent_partition

__all__ = [
    "FIT_MODES",
    "KeyedStrategy",
    "key_by",
    "key_kind",
    "resolve_strategy",
    "with_partition_id",
    "already_placed",
    "keyed_agg",
    "keyed_apply",
    "explain_keyed_agg",
    "KeyedAggPlan",
    "COMBINE_CHOICES",
    "SOURCE_AGGREGATES",
    "is_keyed_by_source",
    "keyed_by_source",
    "KafkaPythonPartitioner",
    "ahead_key_by",
    "confluent_partition",
    "physical_plan",
    "shuffle_exchanges",
]
