"""The control plane: adaptive switching and the configuration centers.

It reads what the data plane reports (samples, task metrics, query progress) and changes a
running job only at micro-batch boundaries. The data plane never imports it.
"""

from .config_center import ConfigCenter, RedisConfigCenter, set_default_validator
from .settings import CONFIG_FIELDS, MODES, validate_update
from .adaptive import AdaptivePartitioner, Decision
from .stream import AdaptiveBatchFunction, adaptive_foreach_batch
from .metrics import TASK_METRIC_COLUMNS, task_metrics
from .rebalance import REBALANCE_STATES, LoadAwareRebalancer, RebalanceDecision
from .flow import FlowNetwork, FlowResult, find_bottlenecks, learn_capacity, max_flow
from .flow import operator_min_cut
from .ds2 import TrueRate, ds2_parallelism, ds2_plan
from .elasticity import Advice, ElasticityAdvisor, apply_advice, follow_trigger_cap
from .bottleneck import BottleneckAdvisor, BottleneckListener, BottleneckReport

set_default_validator(validate_update)

__all__ = [
    "ConfigCenter",
    "RedisConfigCenter",
    "CONFIG_FIELDS",
    "MODES",
    "validate_update",
    "AdaptivePartitioner",
    "Decision",
    "AdaptiveBatchFunction",
    "adaptive_foreach_batch",
    "TASK_METRIC_COLUMNS",
    "task_metrics",
    "REBALANCE_STATES",
    "LoadAwareRebalancer",
    "RebalanceDecision",
    "FlowNetwork",
    "FlowResult",
    "find_bottlenecks",
    "learn_capacity",
    "max_flow",
    "ds2_parallelism",
    "ds2_plan",
    "TrueRate",
    "operator_min_cut",
    "Advice",
    "ElasticityAdvisor",
    "apply_advice",
    "follow_trigger_cap",
    "BottleneckAdvisor",
    "BottleneckListener",
    "BottleneckReport",
]
