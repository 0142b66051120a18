"""Elasticity: burst-aware resource allocation (CRAA), simulated and applied to a Spark query.

Li, Wei, Li and Wang, *Burstiness-aware elastic resource allocation in stream data processing*
(Chinese Journal of Computers, 2018) scale each operator of a stream job ahead of its load:
downstream operators predict their input from their upstream's state (a load-correlation
model), upstream operators slow down to spare a downstream one an adjustment (feedback), and an
adjustment against the input trend is refused (a cooperative judgement). This package
reproduces the paper's simulated setting:

- :class:`Operator`, :func:`paper_operators` (Table 2);
- :class:`Workload` (``step``, ``jitter``, ``sine``, ``random``) and :func:`paper_workload`;
- the policies :class:`TA`, :class:`KPA` and :class:`CRAA`, and their :class:`KalmanFilter`;
- :func:`simulate`, which returns a :class:`SimResult`;
- the equations themselves (:mod:`trilink_spark.elastic.model`).

In the control plane it is the part that sizes a running query's resources:

- :class:`ElasticityAdvisor` (:mod:`trilink_spark.elastic.advisor`) applies the same equations
  to a real Spark query, one ``StreamingQueryProgress`` at a time (read by
  :mod:`trilink_spark.measurement`), and says what to change in an :class:`Advice`;
  :func:`apply_advice` requests executors and caps admission (``maxOffsetsPerTrigger``
  through a config center), and :func:`follow_trigger_cap` carries that cap to a
  trilink-kafka stream;
- :class:`SimulatedPipeline` of :class:`SimulatedOperator` s
  (:mod:`trilink_spark.elastic.pipeline`) is the other simulator: a steady-state dataflow whose
  true rates DS2 and the flow-network advisor (:mod:`trilink_spark.advice`) size from, for
  tests and benchmarks.

The package never imports pyspark: the simulators need only NumPy and pandas, and the advisor
reads progress events and applies advice through the session it is given.

Examples
--------
>>> from trilink_spark import elastic as el
>>> ops = el.paper_operators()
>>> ta = el.simulate(ops, el.paper_workload("step"), el.TA(), duration_s=300)
>>> craa = el.simulate(ops, el.paper_workload("step"), el.CRAA(), duration_s=300)
>>> bool(craa.per_operator["data_loss"].sum() < ta.per_operator["data_loss"].sum())
True
"""

from .kalman import KalmanFilter
from .model import (Feedback, Operator, Upstream, admission_limit, buffer_state,
                    cooperative_judgement, feedback_adjustment, feedback_capacity, output_rate,
                    rate_change, trend_relation, unit_change)
from .policies import CRAA, KPA, TA, ChainState, Controller, Plan, Policy
from .simulator import PAPER_OPERATORS, SimResult, paper_operators, simulate
from .workloads import PAPER_WORKLOADS, Workload, paper_workload
from .pipeline import OperatorWindow, PipelineWindow, SimulatedOperator, SimulatedPipeline
from .advisor import ADVISOR_POLICIES, Advice, ElasticityAdvisor, apply_advice
from .advisor import follow_trigger_cap

__all__ = [
    "Operator",
    "Workload",
    "TA",
    "KPA",
    "CRAA",
    "Policy",
    "KalmanFilter",
    "simulate",
    "SimResult",
    "paper_operators",
    "paper_workload",
    "PAPER_OPERATORS",
    "PAPER_WORKLOADS",
    "ChainState",
    "Plan",
    "Controller",
    "Upstream",
    "Feedback",
    "output_rate",
    "buffer_state",
    "rate_change",
    "unit_change",
    "trend_relation",
    "cooperative_judgement",
    "admission_limit",
    "feedback_capacity",
    "feedback_adjustment",
    "SimulatedOperator",
    "SimulatedPipeline",
    "OperatorWindow",
    "PipelineWindow",
    "Advice",
    "ElasticityAdvisor",
    "apply_advice",
    "follow_trigger_cap",
    "ADVISOR_POLICIES",
]
