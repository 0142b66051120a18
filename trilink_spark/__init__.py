"""trilink-spark: the throughput techniques of the Trilink paper, for Apache Spark.

Key partitioners that keep every key whole and still balance load, keyed watermarks and keyed
process functions with durable state, Local Merge and Global Merge combiners, and one-shuffle
DataFrame placement. The top level holds what a user meets first; everything else lives in
its subpackage:

- :mod:`trilink_spark.partitioners`: every strategy, balance metrics, evaluation;
- :mod:`trilink_spark.placement`: ``key_by``, ``keyed_agg``, ``keyed_apply``, Ahead KeyBy,
  plan checks;
- :mod:`trilink_spark.keyed`: keyed watermarks, timers, process functions, runners;
- :mod:`trilink_spark.state`: the keyed state store;
- :mod:`trilink_spark.merge`: the aggregate algebra, Local and Global Merge, ``RedisStore``;
- :mod:`trilink_spark.kafka`: the trilink-kafka connector;
- :mod:`trilink_spark.measurement`, :mod:`trilink_spark.switching`,
  :mod:`trilink_spark.advice`, :mod:`trilink_spark.elastic`: the control plane (task
  metrics and operator timings; adaptive switching, config centers and rebalancing;
  bottleneck and DS2 advice; elastic allocation);
- :mod:`trilink_spark.ui`: the live page of a running query (:func:`dashboard`) and HTML
  reports of a run's history;
- :mod:`trilink_spark.errors`, :mod:`trilink_spark.columns`, :mod:`trilink_spark.eventtime`,
  :mod:`trilink_spark.testing`: errors, column names, event-time units, test launchers and
  the keyed tester.

Examples
--------
>>> import trilink_spark as tl
>>> p = tl.LeastCountPartitioner(4, history={"a": 10, "b": 5, "c": 5, "d": 1})
>>> p.assign(["a", "b", "c", "d"]).tolist()
[0, 1, 2, 3]
"""

import sys
from typing import Any

from . import advice, columns, elastic, errors, eventtime, kafka, keyed, measurement, merge
from . import partitioners, placement, state, switching, ui
from ._internal.deprecation import warn_moved
from ._internal.spark.session import get_session
from ._internal.spark.ship import ship
from .columns import PARTITION_COL
from .errors import TrilinkError
from .keyed import KeyedWatermarkProcessFunction, KeyedWindowAggregate
from .keyed import keyed_foreach_batch, keyed_process, keyed_watermark, read_state
from .merge import global_merge, local_merge, merge_partials
from .partitioners import (
    BlockPartitioner,
    HashPartitioner,
    LeastCountPartitioner,
    LeastKeyPartitioner,
    ModuloPartitioner,
    OverlayPartitioner,
    Partitioner,
    TablePartitioner,
    WeightPartitioner,
    evaluate_strategies,
    partition_balance,
)
from .placement import key_by, keyed_agg, keyed_apply, resolve_strategy
from .switching import AdaptivePartitioner
from .ui import dashboard

__version__ = "0.1.0"

__all__ = [
    # the transforms
    "key_by",
    "keyed_agg",
    "keyed_apply",
    "keyed_watermark",
    "keyed_process",
    "keyed_foreach_batch",
    "local_merge",
    "merge_partials",
    "global_merge",
    # the strategies
    "Partitioner",
    "HashPartitioner",
    "ModuloPartitioner",
    "LeastKeyPartitioner",
    "LeastCountPartitioner",
    "WeightPartitioner",
    "BlockPartitioner",
    "TablePartitioner",
    "OverlayPartitioner",
    "AdaptivePartitioner",
    # how well a placement fits the data
    "partition_balance",
    "evaluate_strategies",
    "resolve_strategy",
    # keyed processing
    "KeyedWatermarkProcessFunction",
    "KeyedWindowAggregate",
    "read_state",
    # the live view of a running query
    "dashboard",
    # the session, shipping the package to a cluster, the root error, the partition column
    "get_session",
    "ship",
    "TrilinkError",
    "PARTITION_COL",
]

#: Names that left the top level, with their one home: ``name -> (module, attribute, note)``.
#: Each still resolves here, with a :class:`DeprecationWarning` naming that home, until the
#: next minor release removes it.
_MOVED: dict[str, tuple[str, str, str]] = {}


def _moved(module: Any, names: list[str]) -> None:
    for name in names:
        _MOVED[name] = (module.__name__, name, "")


_moved(errors, [n for n in errors.__all__ if isinstance(getattr(errors, n), type) and n not in (
    "TrilinkError", "ServerStartError", "ExecutorEnvironmentError", "TrilinkWarning")])
_moved(columns, ["EVENT_TIME_COL"])
_moved(eventtime, ["parse_interval"])
_moved(partitioners, [
    "rebalance_minimal", "strategy_names", "balance_degree", "extra_compute_time",
    "keyed_bound", "BalanceReport", "StrategyScore", "choose_best", "CANDIDATES",
    "kafka_default_partition", "kafka_murmur2"])
_moved(placement, [
    "FIT_MODES", "KeyedStrategy", "explain_keyed_agg", "KeyedAggPlan", "physical_plan",
    "shuffle_exchanges", "KafkaPythonPartitioner", "ahead_key_by", "confluent_partition",
    "SOURCE_AGGREGATES", "is_keyed_by_source", "keyed_by_source"])
_moved(keyed, ["KeyedBatchFunction", "KeyedContext", "SwapReport", "TimerService", "WINDOW_AGGS"])
_moved(state, ["KeyedStateStore"])
_moved(merge, [
    "AGGREGATES", "Combine", "GLOBAL_STORES", "MERGE_MODES", "RedisStore",
    "LocalMergeBatchFunction", "local_merge_foreach_batch"])
_moved(kafka, [
    "read_kafka", "register_kafka_source", "write_kafka", "read_trigger_cap",
    "write_trigger_cap"])
_moved(switching, [
    "AdaptiveBatchFunction", "Decision", "adaptive_foreach_batch", "CONFIG_FIELDS",
    "ConfigCenter", "RedisConfigCenter", "validate_update", "REBALANCE_STATES",
    "LoadAwareRebalancer", "RebalanceDecision"])
_moved(measurement, [
    "TASK_METRIC_COLUMNS", "task_metrics", "OPERATOR_TIMING_COLUMNS", "OPERATOR_TIMING_CONF",
    "OperatorTimer", "OperatorTimingReader", "read_operator_timings"])
_moved(advice, [
    "FlowNetwork", "FlowResult", "find_bottlenecks", "learn_capacity", "max_flow",
    "operator_min_cut", "BottleneckAdvisor", "BottleneckListener", "BottleneckReport",
    "TrueRate", "ds2_plan"])
_moved(elastic, ["Advice", "ElasticityAdvisor", "apply_advice", "follow_trigger_cap"])
# two names for one thing: the second name goes
_MOVED["SWITCH_MODES"] = (switching.__name__, "MODES", "")
_MOVED["KAFKA_SOURCE"] = (kafka.__name__, "SOURCE_NAME", "")
_MOVED["ds2_parallelism"] = ("trilink_spark.advice.ds2", "ds2_parallelism",
                             "; use trilink_spark.advice.ds2_plan(...).parallelism")


def __getattr__(name: str) -> Any:
    """Resolve a name that left the top level, with a :class:`DeprecationWarning`."""
    try:
        module, attr, note = _MOVED[name]
    except KeyError:
        raise AttributeError(f"module 'trilink_spark' has no attribute {name!r}") from None
    warn_moved(f"trilink_spark.{name}", f"{module}.{attr}", note=note, what="the top-level name")
    return getattr(sys.modules[module], attr)


def __dir__() -> list[str]:
    """The module's own names: the deprecated ones resolve but are not listed, so tools that
    walk ``dir()`` (``inspect.getmembers``, completion) never trigger their warning."""
    return sorted(globals())
