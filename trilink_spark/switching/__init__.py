"""Switching: change a running job's partitioning at micro-batch boundaries.

The control plane's acting part. It takes samples and task latencies from a running stream and
changes how keys are placed, only between two micro-batches:

- :class:`AdaptivePartitioner` samples keys, scores the catalogue's strategies and switches to
  a better one by the modes of the Trilink paper (:data:`MODES`: periodic, quantity, threshold,
  manual); :func:`adaptive_foreach_batch` (:class:`AdaptiveBatchFunction`) runs it inside
  ``foreachBatch``; a :class:`Decision` says what it decided and why;
- :class:`LoadAwareRebalancer` moves key blocks of a ``BlockPartitioner`` from slow partitions
  to fast ones (:class:`RebalanceDecision`, :data:`REBALANCE_STATES`);
- the configuration centers (:class:`ConfigCenter` in process, :class:`RedisConfigCenter`
  across processes) carry run-time settings to the switches, every update checked by
  :func:`validate_update` against :data:`CONFIG_FIELDS` (wired here as the centers' default
  validator).

It reads :mod:`trilink_spark.partitioners` and :mod:`trilink_spark.placement`; the data plane
never imports it.

Examples
--------
>>> from trilink_spark.switching import ConfigCenter
>>> center = ConfigCenter()
>>> center.publish({"mode": "threshold", "threshold": 0.6})["version"]
1
"""

from .config_center import ConfigCenter, RedisConfigCenter
from .wire import set_default_validator
from .settings import CONFIG_FIELDS, MODES, validate_update
from .adaptive import AdaptivePartitioner, Decision
from .stream import AdaptiveBatchFunction, adaptive_foreach_batch
from .rebalance import REBALANCE_STATES, LoadAwareRebalancer, RebalanceDecision

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
    "REBALANCE_STATES",
    "LoadAwareRebalancer",
    "RebalanceDecision",
]
