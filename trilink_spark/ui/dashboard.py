"""``tl.dashboard(...)``: a live page of a running query's skew, in the driver process."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .._internal.spark.listener import add_listener, progress_listener, remove_listener
from .._internal.validation import count, seconds
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .feed import Feed, RunSource
from .report import require_ui

if TYPE_CHECKING:  # both need Bokeh: imported when a dashboard starts
    from .model import DashboardModel
    from .server import DashboardServer

__all__ = ["Dashboard", "dashboard"]

logger = logging.getLogger(__name__)


class Dashboard(str):
    """The URL of a running dashboard (a ``str``: print it, open it), and its handle.

    Attributes
    ----------
    url : str
        The page's address (with ``?token=`` when a token guards it).
    model : DashboardModel
        What the page shows, bounded to the last ``history`` batches.

    Examples
    --------
    >>> url = tl.dashboard(spark, runs=[run])  # doctest: +SKIP
    >>> print(url)  # doctest: +SKIP
    http://127.0.0.1:41817/
    >>> url.stop()  # doctest: +SKIP
    """

    model: DashboardModel
    _parts: tuple[Any, Any, Any, Any]

    def __new__(cls, url: str, model: DashboardModel, server: DashboardServer, feed: Feed,
                listener: tuple[Any, Any] | None) -> Dashboard:
        self = super().__new__(cls, url)
        self.model = model
        self._parts = (server, feed, listener, threading.Lock())
        return self

    @property
    def url(self) -> str:
        """The page's address, as a plain ``str``."""
        return str.__str__(self)

    def refresh(self) -> None:
        """Read the runs, partitioners and advisors now (the feed does it after each batch
        and every few seconds on its own). O(new batches)."""
        self._parts[1].poll()

    def stop(self) -> None:
        """Stop the page: the listener is removed, the feed's thread ends and the port is
        closed. Idempotent."""
        server, feed, listener, lock = self._parts
        with lock:
            if listener is not None:
                spark, registered = listener
                try:
                    remove_listener(spark, registered)
                except Exception as err:  # noqa: BLE001 - a closed session has none to remove
                    logger.debug("dashboard listener not removed: %s", err)
                self._parts = (server, feed, None, lock)
            feed.stop()
            server.stop()

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        """The URL with its token masked (``str(url)`` is the URL to open)."""
        shown = self.url
        if "?token=" in shown:
            shown = shown.split("?token=", 1)[0] + "?token=***"
        return f"Dashboard({shown!r})"

    def __reduce__(self) -> Any:  # a running server is not shipped anywhere: the URL is
        return (str, (self.url,))


def _several(items: Any) -> list[Any]:
    """``items`` as a list: one run, state path, partitioner or advisor given alone is a list
    of one (a state path is never read as its characters); its type is checked where it is
    used. O(items)."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        return [items]
    return list(items)


def dashboard(spark: Any = None, *, runs: Iterable[Any] | Mapping[str, Any] = (),
              partitioners: Iterable[Any] = (), advisors: Iterable[Any] = (),
              host: str = "127.0.0.1", port: int = 0, token: str | None = None,
              history: int = 200, refresh: str | float = "1 second",
              title: str = "trilink-spark") -> Dashboard:
    """Start a live page of per-partition load, key watermarks, swaps and advice.

    Parameters
    ----------
    spark : SparkSession, optional
        Its streaming queries' progress is followed (a ``StreamingQueryListener``): each
        batch's input rows and duration, and a prompt refresh after each batch. Classic or
        Connect. Without it the page follows the runs every ``refresh`` on its own.
    runs : iterable or mapping
        ``keyed_foreach_batch`` runs (or their state paths, or ``{name: run}``): their
        per-partition rows and task time, hot keys, late rows, swaps and rebalances, from
        the history each run keeps on its state path (:mod:`trilink_spark.keyed.records.history`).
        One run or state path alone is a list of one (so are one partitioner, one advisor).
    partitioners : iterable of AdaptivePartitioner
        Their switching decisions, with the reason.
    advisors : iterable of BottleneckAdvisor or ElasticityAdvisor
        Fed by the dashboard after each batch (do not also register their own listener), and
        shown with their reason; a bottleneck advisor's DS2 parallelism too.
    host : str
        The address to bind: ``127.0.0.1`` by default. Any other address needs ``token``.
    port : int
        0 (default): a free port.
    token : str, optional
        Required by every request (``?token=`` on the page's URL, which the returned URL
        carries). Required when ``host`` is not a loopback address.
    history : int
        Batches kept per run (the page's memory is bounded by it, however long the query
        runs).
    refresh : str or float
        How often the page asks for new figures (an interval string or seconds).
    title : str

    Returns
    -------
    Dashboard
        The page's URL (a ``str``) with ``stop()``; also a context manager.

    Raises
    ------
    InvalidArgumentError
        A bad ``history``, ``refresh`` or ``port``, or a non-loopback ``host`` without a
        token.
    InvalidArgumentTypeError
        A run, partitioner or advisor of another type.
    MissingDependencyError
        Bokeh is not installed (the ``[ui]`` extra); the message names an install that
        works, from a clone or an index.

    Notes
    -----
    Read-only: no request changes the query. Cost: the listener only queues each progress;
    one thread of the driver reads each run's new history record (O(partitions) per batch)
    and serves the page's data requests from a snapshot computed once per change. Every
    asset comes from the installed ``bokeh`` package: the page works offline. Needs the
    ``[ui]`` extra (``pip install -e '.[ui]'`` in a clone).

    Examples
    --------
    >>> run = tl.keyed_foreach_batch(sink, "user", "ts", processor, "10 seconds",
    ...                              "/tmp/state")  # doctest: +SKIP
    >>> url = tl.dashboard(spark, runs=[run])  # doctest: +SKIP
    >>> query = events.writeStream.foreachBatch(run).start()  # doctest: +SKIP
    >>> print(url)  # doctest: +SKIP
    http://127.0.0.1:41817/
    """
    require_ui()
    from .model import DashboardModel
    from .server import DashboardServer

    keep = count(history, "history")
    wait = seconds(refresh, "refresh")
    if not 0.05 <= wait <= 3600:
        raise InvalidArgumentError(
            f"refresh must be between 50 ms and 1 hour, got {refresh!r}")
    items = (list(runs.items()) if isinstance(runs, Mapping)
             else [(None, r) for r in _several(runs)])
    sources = [RunSource.of(item, name) for name, item in items]
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(
            f"two runs share a name ({names}); pass runs={{name: run}} to name them apart")
    model = DashboardModel(history=keep)
    feed = Feed(model, sources, _several(partitioners),
                _several(advisors), spark, poll_s=max(wait, 1.0))
    server = DashboardServer(model, host=host, port=port, token=token,
                             refresh_ms=int(wait * 1000), title=title)
    url = server.start()
    listener = None
    try:
        feed.start()
        if spark is not None:
            if not hasattr(spark, "streams"):
                raise InvalidArgumentTypeError(
                    f"spark must be a SparkSession, got {type(spark).__name__}")
            registered = progress_listener(feed.on_progress)
            add_listener(spark, registered)
            listener = (spark, registered)
    except BaseException:
        feed.stop()
        server.stop()
        raise
    logger.info("dashboard at %s", url.split("?", 1)[0])
    return Dashboard(url, model, server, feed, listener)
