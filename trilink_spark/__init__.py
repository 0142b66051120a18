"""trilink-spark: the throughput techniques of the Trilink paper, for Apache Spark.

Key partitioners that keep every key whole and still balance load, balance metrics, and
one-shuffle DataFrame placement. See the README for a tour.

Examples
--------
>>> import trilink_spark as tl
>>> p = tl.LeastCountPartitioner(4, history={"a": 10, "b": 5, "c": 5, "d": 1})
>>> p.assign(["a", "b", "c", "d"]).tolist()
[0, 1, 2, 3]
"""

from .errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidKeyTypeError,
    ConfigCenterUnavailableError,
    ConfigError,
    ConfigTypeError,
    MissingColumnError,
    StoreUnavailableError,
    BrokerUnavailableError,
    PartitionCountError,
    KeysNotGroupedError,
    NullKeyError,
    TrilinkError,
    UnknownStrategyError,
    MissingDependencyError,
    DataLossError,
    ReservedColumnError,
    StateCorruptError,
    StateStoreError,
    StateTypeError,
    StateOwnershipError,
    ArithmeticOverflowError,
    ConnectUnsupportedError,
)
from .columns import EVENT_TIME_COL, PARTITION_COL
from ._internal.spark.plan import physical_plan, shuffle_exchanges
from ._internal.spark.session import get_session
from .partitioners.block import BlockPartitioner
from .partitioners.overlay import OverlayPartitioner
from .partitioners.refit import rebalance_minimal
from .partitioners import (
    HashPartitioner,
    LeastCountPartitioner,
    LeastKeyPartitioner,
    ModuloPartitioner,
    Partitioner,
    TablePartitioner,
    WeightPartitioner,
    strategy_names,
)
from .partitioners.balance import BalanceReport, balance_degree, extra_compute_time, keyed_bound
from .partitioners.balance import partition_balance
from .partitioners.evaluation import CANDIDATES, StrategyScore, choose_best, evaluate_strategies
from .partitioners.kafka_hash import kafka_default_partition, kafka_murmur2
from .placement import (
    FIT_MODES,
    KeyedStrategy,
    key_by,
    keyed_agg,
    keyed_apply,
    explain_keyed_agg,
    KeyedAggPlan,
    resolve_strategy,
)
from .eventtime import parse_interval
from .placement import KafkaPythonPartitioner, ahead_key_by, confluent_partition
from .placement import SOURCE_AGGREGATES, is_keyed_by_source, keyed_by_source
from .keyed import (
    KeyedBatchFunction,
    KeyedContext,
    KeyedWatermarkProcessFunction,
    KeyedWindowAggregate,
    SwapReport,
    TimerService,
    WINDOW_AGGS,
    keyed_foreach_batch,
    keyed_process,
    keyed_watermark,
)
from .state import KeyedStateStore
from .merge import AGGREGATES, Combine, GLOBAL_STORES, MERGE_MODES, RedisStore, global_merge
from .merge import LocalMergeBatchFunction, local_merge, local_merge_foreach_batch, merge_partials
from .kafka import SOURCE_NAME as KAFKA_SOURCE, read_kafka, register_kafka_source, write_kafka
from .kafka import read_trigger_cap, write_trigger_cap
from .switching import AdaptiveBatchFunction, AdaptivePartitioner, Decision, adaptive_foreach_batch
from .switching import CONFIG_FIELDS, ConfigCenter, RedisConfigCenter, validate_update
from .switching import MODES as SWITCH_MODES
from .measurement import TASK_METRIC_COLUMNS, task_metrics
from ._internal.optiming import OPERATOR_TIMING_COLUMNS, OPERATOR_TIMING_CONF, OperatorTimer
from ._internal.optiming import OperatorTimingReader, read_operator_timings
from .switching import REBALANCE_STATES, LoadAwareRebalancer, RebalanceDecision
from .advice import FlowNetwork, FlowResult, find_bottlenecks, learn_capacity, max_flow
from .advice import BottleneckAdvisor, BottleneckListener, BottleneckReport
from .advice.ds2 import ds2_parallelism
from .advice import TrueRate, ds2_plan, operator_min_cut
from .elastic import Advice, ElasticityAdvisor, apply_advice, follow_trigger_cap

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # errors
    "TrilinkError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "InvalidKeyTypeError",
    "NullKeyError",
    "UnknownStrategyError",
    "MissingColumnError",
    "ConfigError",
    "ConfigTypeError",
    "ConfigCenterUnavailableError",
    "StoreUnavailableError",
    "BrokerUnavailableError",
    "PartitionCountError",
    "KeysNotGroupedError",
    "MissingDependencyError",
    "DataLossError",
    "ReservedColumnError",
    "StateCorruptError",
    "StateStoreError",
    "StateTypeError",
    "StateOwnershipError",
    "ArithmeticOverflowError",
    "ConnectUnsupportedError",
    # strategies
    "Partitioner",
    "TablePartitioner",
    "HashPartitioner",
    "BlockPartitioner",
    "OverlayPartitioner",
    "rebalance_minimal",
    "ModuloPartitioner",
    "LeastKeyPartitioner",
    "LeastCountPartitioner",
    "WeightPartitioner",
    "strategy_names",
    # balance
    "balance_degree",
    "extra_compute_time",
    "keyed_bound",
    "BalanceReport",
    "partition_balance",
    "StrategyScore",
    "evaluate_strategies",
    "choose_best",
    "CANDIDATES",
    # placement
    "PARTITION_COL",
    "FIT_MODES",
    "KeyedStrategy",
    "key_by",
    "keyed_agg",
    "keyed_apply",
    "explain_keyed_agg",
    "KeyedAggPlan",
    "parse_interval",
    "resolve_strategy",
    "physical_plan",
    "shuffle_exchanges",
    "get_session",
    # switching and configuration
    "AdaptivePartitioner",
    "Decision",
    "SWITCH_MODES",
    "adaptive_foreach_batch",
    "AdaptiveBatchFunction",
    "ConfigCenter",
    "RedisConfigCenter",
    "CONFIG_FIELDS",
    "validate_update",
    # measurements and rebalancing
    "TASK_METRIC_COLUMNS",
    "task_metrics",
    "OPERATOR_TIMING_COLUMNS",
    "OPERATOR_TIMING_CONF",
    "OperatorTimer",
    "OperatorTimingReader",
    "read_operator_timings",
    "REBALANCE_STATES",
    "LoadAwareRebalancer",
    "RebalanceDecision",
    # bottlenecks and rescale advice
    "FlowNetwork",
    "FlowResult",
    "find_bottlenecks",
    "learn_capacity",
    "max_flow",
    "ds2_parallelism",
    "BottleneckAdvisor",
    "BottleneckListener",
    "BottleneckReport",
    "TrueRate",
    "ds2_plan",
    "operator_min_cut",
    # elasticity
    "Advice",
    "ElasticityAdvisor",
    "apply_advice",
    "follow_trigger_cap",
    # watermarks and timers
    "TimerService",
    "keyed_watermark",
    "EVENT_TIME_COL",
    "KeyedContext",
    "KeyedWatermarkProcessFunction",
    "KeyedWindowAggregate",
    "WINDOW_AGGS",
    "keyed_process",
    "keyed_foreach_batch",
    "KeyedBatchFunction",
    "SwapReport",
    "KeyedStateStore",
    # merge
    "local_merge",
    "merge_partials",
    "Combine",
    "AGGREGATES",
    "MERGE_MODES",
    "global_merge",
    "GLOBAL_STORES",
    "RedisStore",
    "local_merge_foreach_batch",
    "LocalMergeBatchFunction",
    # ahead keyBy
    "ahead_key_by",
    "KafkaPythonPartitioner",
    "confluent_partition",
    "keyed_by_source",
    "is_keyed_by_source",
    "SOURCE_AGGREGATES",
    "read_kafka",
    "read_trigger_cap",
    "write_trigger_cap",
    "write_kafka",
    "register_kafka_source",
    "KAFKA_SOURCE",
    "kafka_default_partition",
    "kafka_murmur2",
]
