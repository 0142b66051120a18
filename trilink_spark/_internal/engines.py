"""Which engine runs an operator's call, and why: the one ladder of every operator with engines.

:func:`~trilink_spark.local_merge`, :func:`~trilink_spark.keyed_process` and
:func:`~trilink_spark.keyed_agg` each run a call on one of a few engines, and each has an
``explain_*`` twin that says which one and why. They all choose by one ladder
(:func:`resolve_engine`), given the operator's candidates (an :class:`EngineLadder`):

1. **what was asked** (:func:`request_engine`): the call's argument (``engine=`` or
   ``combine=``, checked by :func:`~trilink_spark._internal.validation.choice`), or for
   ``"auto"`` the operator's conf (``spark.trilink.<conf>``, checked the same way);
2. a value naming an engine other than the preferred one runs it; so does one naming the
   preferred engine where the ladder ``forces`` it (``keyed_agg(combine="always")``);
3. **what the input allows**: the operator's own check says whether the preferred engine
   runs this call, and why; yes, it runs;
4. **the fallback, with the reason**: an explicit request of the preferred engine the call
   cannot use is refused (:class:`~trilink_spark.errors.InvalidArgumentError` saying why and
   what to use); otherwise the fallback engine runs, the reason naming what decided.

An input may also fix the engine whatever was asked (``settled``: a frame declared
``keyed_by_source`` is aggregated where it is). Every answer is an :class:`EnginePlan`
(``engine``, ``reason``); the reason starts with what asked (``engine='auto'``,
``spark.trilink.mergeEngine=spark``, ``combine='never'``).

Examples
--------
>>> ladder = EngineLadder(
...     operator="demo", argument="engine", choices=("auto", "python", "spark"),
...     engines={"python": "python", "spark": "spark"}, preferred="spark",
...     fallback="python", runs={"spark": "Spark's plan", "python": "Python tasks"},
...     scope="numbers only")
>>> asked = request_engine(ladder, None, "auto")
>>> resolve_engine(ladder, asked, lambda: (False, "a string column"))
EnginePlan(engine='python', reason="engine='auto': a string column: Python tasks")
>>> resolve_engine(ladder, request_engine(ladder, None, "spark"),
...                lambda: (False, "a string column"))
Traceback (most recent call last):
...
trilink_spark.errors.InvalidArgumentError: engine='spark' cannot run a string column; ...
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError
from .spark.session import CONF_PREFIX, conf_get
from .validation import choice

__all__ = ["EnginePlan", "EngineRequest", "EngineLadder", "AUTO", "request_engine",
           "resolve_engine", "log_engine"]

#: The value of ``engine=`` (``combine=``) that leaves the choice to the ladder.
AUTO = "auto"


@dataclass(frozen=True)
class EnginePlan:
    """The engine an operator's call runs on, and why: what every ``explain_*`` returns.

    Attributes
    ----------
    engine : str
        The operator's engine: ``"spark"`` or ``"python"`` for
        :func:`~trilink_spark.local_merge`, :func:`~trilink_spark.global_merge` and
        :func:`~trilink_spark.keyed_process`; ``"combine"``, ``"exact"`` or ``"in_place"``
        for :func:`~trilink_spark.keyed_agg`.
    reason : str
        Why, in words, starting with what asked (the argument or the conf) and naming what
        decided (the input, an aggregate, the mode, the processor, ...).

    Examples
    --------
    >>> EnginePlan("python", "engine='python': the Python engine").engine
    'python'
    """

    engine: str
    reason: str


@dataclass(frozen=True)
class EngineRequest:
    """What a call asks for: ``engine`` one of the ladder's ``choices`` (``"auto"`` or a
    value naming an engine); ``explicit`` when the call named the value itself; ``source``
    what asked, in words (``"engine='spark'"``, ``"spark.trilink.mergeEngine=python"``,
    ``"engine='auto'"``)."""

    engine: str
    explicit: bool
    source: str


@dataclass(frozen=True)
class EngineLadder:
    """One operator's candidates on the ladder of :func:`resolve_engine`.

    Attributes
    ----------
    operator : str
        The operator, as its logs name it (``"local_merge"``).
    argument : str
        The argument that asks (``"engine"``, ``"combine"``).
    choices : tuple of str
        Its values, :data:`AUTO` among them, in the order messages list them.
    engines : mapping of str to str
        Each value that names one engine, and that engine (``{"always": "combine"}``).
    preferred : str
        The engine ``"auto"`` takes where the input allows it.
    fallback : str
        The engine it takes where the input does not.
    runs : mapping of str to str
        What each engine runs, in words (the reason when a value asked for it).
    scope : str
        What the preferred engine runs, in words (said when an explicit request is refused).
    conf : str or None
        ``spark.trilink.<conf>`` decides an ``"auto"`` call (its values are ``choices``).
    none_is_auto : bool
        Whether ``None`` means ``"auto"`` (else it is refused as not a string).
    forces : bool
        Whether a value naming the preferred engine runs it whatever the input (else the
        input is checked, and an input it cannot run is refused).
    titles : mapping of str to str
        How logs name each engine (default ``"the <engine> engine"``).
    """

    operator: str
    argument: str
    choices: tuple[str, ...]
    engines: Mapping[str, str]
    preferred: str
    fallback: str
    runs: Mapping[str, str]
    scope: str
    conf: str | None = None
    none_is_auto: bool = False
    forces: bool = False
    titles: Mapping[str, str] | None = None

    def value_of(self, engine: str) -> str:
        """The value of :attr:`argument` that asks for ``engine``. O(choices)."""
        return next(v for v, e in self.engines.items() if e == engine)

    def title(self, engine: str) -> str:
        """How logs name ``engine``. O(1)."""
        return (self.titles or {}).get(engine, f"the {engine} engine")


def request_engine(ladder: EngineLadder, spark: Any, value: Any) -> EngineRequest:
    """What a call asks for: ``value`` when it names an engine; for ``"auto"`` (or None where
    the ladder takes it for ``"auto"``) the ladder's conf, else ``"auto"``.

    Raises
    ------
    InvalidArgumentError
        ``value`` or the conf is a string outside ``ladder.choices`` (by
        :func:`~trilink_spark._internal.validation.choice`: the message names which and what
        is allowed).
    InvalidArgumentTypeError
        ``value`` is not a string.

    Notes
    -----
    Cost: O(1); one conf read when ``value`` is ``"auto"`` and the ladder has a conf (a
    round trip on Spark Connect).

    Examples
    --------
    >>> ladder = EngineLadder("demo", "engine", ("auto", "python"), {"python": "python"},
    ...                       "python", "python", {"python": "Python"}, "anything")
    >>> request_engine(ladder, None, "python")
    EngineRequest(engine='python', explicit=True, source="engine='python'")
    """
    if value is None and ladder.none_is_auto:
        value = AUTO
    asked = choice(value, ladder.argument, ladder.choices)
    if asked != AUTO:
        return EngineRequest(asked, True, f"{ladder.argument}={asked!r}")
    automatic = EngineRequest(AUTO, False, f"{ladder.argument}={AUTO!r}")
    if ladder.conf is None:
        return automatic
    conf = CONF_PREFIX + ladder.conf
    configured = choice(conf_get(spark, ladder.conf, AUTO), conf, ladder.choices)
    if configured == AUTO:  # unset, or set to the default
        return automatic
    return EngineRequest(configured, False, f"{conf}={configured}")


def resolve_engine(ladder: EngineLadder, request: EngineRequest,
                   allows: Callable[[], tuple[bool, str]],
                   settled: tuple[str, str] | None = None) -> EnginePlan:
    """The engine a call runs on, and why: the ladder of the module docs.

    Parameters
    ----------
    ladder : EngineLadder
        The operator's candidates.
    request : EngineRequest
        What the call asks for (:func:`request_engine`).
    allows : callable
        ``() -> (allowed, why)``: whether the preferred engine runs this call, and why, in
        words (a phrase the reason quotes). Called only when the request leaves it open.
    settled : (engine, why), optional
        An engine the input fixes whatever was asked, and why.

    Returns
    -------
    EnginePlan

    Raises
    ------
    InvalidArgumentError
        An explicit request of the preferred engine that the input does not allow, where
        the ladder does not force it: ``"<argument>='<value>' cannot run <why>; it runs
        <scope>: use <argument>='auto' or <argument>='<fallback value>'"``.

    Notes
    -----
    Cost: O(1) beyond ``allows``.
    """
    source = request.source
    if settled is not None:
        engine, why = settled
        if request.engine == AUTO:
            return EnginePlan(engine, f"{source}: {why}: {ladder.runs[engine]}")
        return EnginePlan(engine, f"{source} does not apply to {why}: {ladder.runs[engine]}")
    asked = ladder.engines.get(request.engine)
    if asked is not None and (asked != ladder.preferred or ladder.forces):
        return EnginePlan(asked, f"{source}: {ladder.runs[asked]}")
    allowed, why = allows()
    if allowed:
        return EnginePlan(ladder.preferred, f"{source}: {why}")
    if request.explicit:
        arg = ladder.argument
        raise InvalidArgumentError(
            f"{source} cannot run {why}; it runs {ladder.scope}: use {arg}={AUTO!r} or "
            f"{arg}={ladder.value_of(ladder.fallback)!r}")
    runs = ladder.runs[ladder.fallback]
    if asked is not None:  # the conf asked for the preferred engine
        return EnginePlan(ladder.fallback, f"{source} does not apply to {why}: {runs}")
    return EnginePlan(ladder.fallback, f"{source}: {why}: {runs}")


def log_engine(logger: logging.Logger, ladder: EngineLadder, key: str,
               plan: EnginePlan) -> None:
    """Log the engine a call takes and why (INFO): ``"<operator> on '<key>': <engine's
    title> (<reason>)"``. O(1)."""
    logger.info("%s on %r: %s (%s)", ladder.operator, key, ladder.title(plan.engine),
                plan.reason)
