"""Advice: where a running job's bottleneck is and how much parallelism each operator needs.

The control plane's judging part: from what :mod:`trilink_spark.measurement` reads, it says
what to change, and changes nothing itself.

- flow networks (FAR-Flink, Li et al., 2019): the network of operator instances and its
  maximum flow (:class:`FlowNetwork`, :func:`max_flow`, :class:`FlowResult`; module
  :mod:`~trilink_spark.advice.network`), the cuts that never split an operator
  (:func:`operator_min_cut`, :class:`OperatorCut`; :mod:`~trilink_spark.advice.cuts`), the
  lambda-saturated cuts that name the operators to scale (:func:`find_bottlenecks`,
  :data:`LAMBDA_RANGE`; :mod:`~trilink_spark.advice.analysis`) and capacities learnt from
  latency feedback (:func:`learn_capacity`, :func:`capacity_step`;
  :mod:`~trilink_spark.advice.capacity`);
- DS2 (Kalavri et al., OSDI 2018): every operator's parallelism in one pass from its true
  rates (:func:`ds2_plan`, :class:`TrueRate`; :mod:`~trilink_spark.advice.ds2`);
- :class:`BottleneckAdvisor` (and :class:`BottleneckListener`) applies both to a running
  query's stages and operators and writes a :class:`BottleneckReport`.

Examples
--------
>>> from trilink_spark.advice import TrueRate, ds2_plan
>>> ds2_plan({"src": ["map"], "map": []}, {"map": TrueRate(500.0)}, {"src": 1800.0}).parallelism
{'map': 4}
"""

from .network import FlowNetwork, FlowResult, max_flow, operator_of
from .cuts import OperatorCut, operator_min_cut
from .analysis import LAMBDA_RANGE, BottleneckAnalysis, find_bottlenecks
from .capacity import CapacityObservation, CapacityStep, CapacityTrace, capacity_step
from .capacity import learn_capacity
from .ds2 import Ds2Plan, TrueRate, ds2_plan, fit_exponent, scaled_parallelism
from .bottleneck import BottleneckAdvisor, BottleneckListener, BottleneckReport, NodeReport

__all__ = [
    "FlowNetwork",
    "FlowResult",
    "max_flow",
    "operator_of",
    "OperatorCut",
    "operator_min_cut",
    "LAMBDA_RANGE",
    "BottleneckAnalysis",
    "find_bottlenecks",
    "CapacityObservation",
    "CapacityStep",
    "CapacityTrace",
    "capacity_step",
    "learn_capacity",
    "TrueRate",
    "Ds2Plan",
    "ds2_plan",
    "fit_exponent",
    "scaled_parallelism",
    "BottleneckAdvisor",
    "BottleneckListener",
    "BottleneckReport",
    "NodeReport",
]
