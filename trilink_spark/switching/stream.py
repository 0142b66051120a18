"""Adaptive placement of a Structured Streaming query, one micro-batch at a time.

:func:`adaptive_foreach_batch` wraps a ``foreachBatch`` function: each micro-batch is a batch
boundary (pending config updates take effect), is sampled and observed, a decision is taken per
the partitioner's mode, and the batch is placed with :func:`~trilink_spark.key_by` under the
strategy then current before it reaches the user's function.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .adaptive import AdaptivePartitioner, Decision
from .._internal.spark.compat import is_connect
from ..errors import ConnectUnsupportedError, InvalidArgumentError, InvalidArgumentTypeError
from ..partitioners import Partitioner
from ..placement.key_by import check_fit, key_by
from .._internal.validation import refuse_streaming_batch_function

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["adaptive_foreach_batch", "AdaptiveBatchFunction"]

logger = logging.getLogger(__name__)

STATEFUL_REASON = (
    "the pipeline keeps keyed state across micro-batches, and moving a key would strand its "
    "state; decisions are logged as recommendations only"
)


class AdaptiveBatchFunction:
    """The callable :func:`adaptive_foreach_batch` returns (``writeStream.foreachBatch(f)``).

    Attributes
    ----------
    adaptive : AdaptivePartitioner
    last_decision : Decision or None
        The decision taken for the latest batch.
    """

    def __init__(
        self,
        func: Callable[[DataFrame, int], Any],
        adaptive: AdaptivePartitioner,
        key: str,
        *,
        stateful: bool,
        fit: str,
        observe: str,
    ) -> None:
        self.func = func
        self.adaptive = adaptive
        self.key = key
        self.stateful = stateful
        self.fit = fit
        self.observe = observe
        self.last_decision: Decision | None = None
        self._observe_error: BaseException | None = None
        self._last_batch: tuple[int, Partitioner] | None = None

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        refuse_streaming_batch_function(batch_df, "AdaptiveBatchFunction",
                                        "adaptive_foreach_batch")
        if self.adaptive.config_detached and is_connect(batch_df):
            raise ConnectUnsupportedError(
                "adaptive_foreach_batch with a config center: Spark Connect runs foreachBatch "
                "in a Python process of its server, with a copy of this function that the "
                "config center (in the client) cannot reach, so run-time updates would be "
                "lost. Use a classic SparkSession for run-time configuration, or give the "
                "AdaptivePartitioner no config= (the copy then decides on its own, and logs "
                "each decision on the trilink_spark.switching.adaptive logger)"
            )
        replay = self._last_batch
        background = None
        if replay is not None and replay[0] == batch_id:
            # the same batch again (a retried foreachBatch): place it exactly as before
            logger.info("batch %d replayed: placing it with the strategy it had", batch_id)
            strategy, fit = replay[1].copy(), "none"
        else:
            self.adaptive.batch_boundary()
            seed = self.adaptive.seed + batch_id
            if self.observe == "sync":
                self.adaptive.observe_df(batch_df, self.key, seed=seed)
            self.last_decision = self.adaptive.decide()
            strategy, fit = self.adaptive.current, self.fit
            if self.observe == "async":
                background = threading.Thread(
                    target=self._observe_quietly, args=(batch_df, seed),
                    name=f"trilink-sample-{batch_id}", daemon=True,
                )
        placed = key_by(batch_df, self.key, strategy, fit=fit)
        self._last_batch = (batch_id, strategy.copy() if strategy.is_stateful else strategy)
        if background is not None:
            background.start()
        try:
            self.func(placed, batch_id)
        finally:
            if background is not None:
                background.join()  # the batch DataFrame is only valid during this call
        if self._observe_error is not None:
            error, self._observe_error = self._observe_error, None
            raise error

    def _observe_quietly(self, batch_df: DataFrame, seed: int) -> None:
        try:
            self.adaptive.observe_df(batch_df, self.key, seed=seed)
        except BaseException as err:  # re-raised on the calling thread
            self._observe_error = err


def adaptive_foreach_batch(
    func: Callable[[DataFrame, int], Any],
    adaptive: AdaptivePartitioner,
    key: str,
    *,
    stateful: bool = False,
    fit: str = "full",
    observe: str | bool = "sync",
) -> AdaptiveBatchFunction:
    """A ``foreachBatch`` function that places every micro-batch with an adaptive strategy.

    Parameters
    ----------
    func : callable
        ``func(placed_df, batch_id)``: ``placed_df`` is the batch after
        :func:`~trilink_spark.key_by` (it has :data:`~trilink_spark.PARTITION_COL`).
    adaptive : AdaptivePartitioner
    key : str
        Key column.
    stateful : bool
        True when ``func`` keeps keyed state across batches (its own store, a keyed processor).
        Switching would then move keys away from their state, so the partitioner is frozen:
        decisions are still taken and logged (with a warning) as recommendations, and config
        updates that pin another strategy are refused. For state kept by trilink-spark, give
        the AdaptivePartitioner to :func:`~trilink_spark.keyed_foreach_batch` as its
        ``strategy`` instead: its switches (and config pins) are then carried out as
        barrier-synchronised swaps of the keyed state.
    fit : {"full", "sample", "none"}
        How a table strategy learns each batch's new keys (see :func:`~trilink_spark.key_by`).
    observe : {"sync", "async", "off"}
        ``"sync"`` (default): sample each batch before deciding and placing it. ``"async"``:
        the paper's sampling thread; the batch is sampled while ``func`` processes it, and the
        decision it informs is taken at the next batch boundary (one batch later), which keeps
        the sampling job off the critical path. ``"off"`` (or False) leaves observing to the
        caller.

    Returns
    -------
    AdaptiveBatchFunction
        Pass it to ``df.writeStream.foreachBatch(...)``.

    Notes
    -----
    Cost per batch: one sampling job (:meth:`AdaptivePartitioner.observe_df`), the decision on
    the driver (only when the mode triggers), and the one shuffle of ``key_by`` (plus its
    counting job for a table strategy with ``fit="full"``). A batch replayed with the same id
    right after it ran is placed with the same strategy and table, without observing it again.

    On Spark Connect the server runs ``foreachBatch`` in a Python process of its own, with a
    copy of the returned function: decisions are taken (and logged) there, and this object's
    :attr:`~AdaptiveBatchFunction.last_decision` and the partitioner's ``decisions`` stay
    as they were in the client. A partitioner given a config center is refused there
    (:class:`~trilink_spark.errors.ConnectUnsupportedError`): the center could not reach the copy.
    Called by hand (``f(batch_df, batch_id)``) it works the same on both kinds of session.

    Examples
    --------
    >>> ap = tl.AdaptivePartitioner(8, mode="periodic", period_batches=10)  # doctest: +SKIP
    >>> def write(placed, batch_id):  # doctest: +SKIP
    ...     placed.groupBy(tl.PARTITION_COL, "user").count().write.mode("append").parquet(out)
    >>> from trilink_spark.switching import adaptive_foreach_batch
    >>> stream.writeStream.foreachBatch(
    ...     adaptive_foreach_batch(write, ap, "user")).start()  # doctest: +SKIP
    """
    if not callable(func):
        raise InvalidArgumentTypeError(f"func must be callable, got {type(func).__name__}")
    if not isinstance(adaptive, AdaptivePartitioner):
        raise InvalidArgumentTypeError(
            f"adaptive must be an AdaptivePartitioner, got {type(adaptive).__name__}"
        )
    if not isinstance(key, str):
        raise InvalidArgumentTypeError(f"key must be a column name (str), got {type(key).__name__}")
    check_fit(fit)
    modes = {True: "sync", False: "off", "sync": "sync", "async": "async", "off": "off"}
    if observe not in modes:
        raise InvalidArgumentError(f"observe must be 'sync', 'async' or 'off', got {observe!r}")
    if stateful:
        adaptive.freeze(STATEFUL_REASON)
    return AdaptiveBatchFunction(
        func, adaptive, key, stateful=stateful, fit=fit, observe=modes[observe]
    )
