"""A ``StreamingQueryListener`` that hands on each progress as its JSON text, cheaply.

On a classic session PySpark turns every JVM progress event into Python objects field by
field before a listener sees it: about 50 Py4J round trips (some 70 ms on a 2-core driver)
per batch, on the driver that also plans the query's batches. :func:`progress_listener`
builds a listener whose JVM-facing side asks the event for its progress JSON once (one
round trip) and passes the text on. On Spark Connect the events arrive as JSON already and
the listener passes their progress on as it is.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .compat import is_connect

__all__ = ["progress_listener", "add_listener", "remove_listener"]

logger = logging.getLogger(__name__)

#: Per Spark Connect session, a listener that does nothing and stays registered: PySpark's
#: Connect client removes its *last* listener by joining its event thread while holding the
#: lock that thread needs to deliver a pending event, a deadlock (SPARK-59623). With this
#: one first in the bus, removing ours is never removing the last.
_KEEPERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_KEEPERS_LOCK = threading.Lock()


def add_listener(spark: Any, listener: Any) -> None:
    """``spark.streams.addListener(listener)``; on Spark Connect a do-nothing listener is
    registered before the session's first one of ours and kept (see :data:`_KEEPERS`), so
    that :func:`remove_listener` never hangs. O(1)."""
    if is_connect(spark):
        with _KEEPERS_LOCK:
            if spark not in _KEEPERS:
                from pyspark.sql.streaming.listener import StreamingQueryListener

                class _Keeper(StreamingQueryListener):  # type: ignore[misc]
                    def onQueryStarted(self, event: Any) -> None:
                        return None

                    def onQueryProgress(self, event: Any) -> None:
                        return None

                    def onQueryIdle(self, event: Any) -> None:
                        return None

                    def onQueryTerminated(self, event: Any) -> None:
                        return None

                keeper = _Keeper()
                spark.streams.addListener(keeper)
                _KEEPERS[spark] = keeper
    spark.streams.addListener(listener)


def remove_listener(spark: Any, listener: Any) -> None:
    """``spark.streams.removeListener(listener)`` for one added by :func:`add_listener`."""
    spark.streams.removeListener(listener)


class _JvmSide:
    """What the JVM calls (Py4J implements Spark's ``PythonStreamingQueryListener``): each
    callback is guarded, so an error never reaches Spark's listener bus."""

    def __init__(self, on_progress: Callable[[Any], None]) -> None:
        self.on_progress = on_progress

    def onQueryStarted(self, jevent: Any) -> None:
        return None

    def onQueryProgress(self, jevent: Any) -> None:
        self.hand_on(lambda: jevent.progress().json())

    def hand_on(self, progress: Callable[[], Any]) -> None:
        """``on_progress(progress())``; an error is logged, never raised."""
        try:
            self.on_progress(progress())
        except Exception as err:  # noqa: BLE001 - never into Spark's listener bus
            logger.warning("progress not handed on (%s: %s)", type(err).__name__, err)

    def onQueryIdle(self, jevent: Any) -> None:
        return None

    def onQueryTerminated(self, jevent: Any) -> None:
        try:
            self.on_progress(None)
        except Exception as err:  # noqa: BLE001
            logger.warning("end of query not handed on (%s: %s)", type(err).__name__, err)

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def progress_listener(on_progress: Callable[[Any], None]) -> Any:
    """A ``StreamingQueryListener`` calling ``on_progress(progress)`` after each batch of
    every query of the session it is added to (``spark.streams.addListener``), and
    ``on_progress(None)`` when a query ends.

    ``progress`` is the progress's JSON text on a classic session (one Py4J call instead of
    PySpark's conversion), a ``StreamingQueryProgress`` on Spark Connect. Errors of
    ``on_progress`` are logged, never raised into Spark.

    Examples
    --------
    >>> seen = []
    >>> listener = progress_listener(seen.append)
    >>> spark.streams.addListener(listener)  # doctest: +SKIP
    """
    from pyspark.sql.streaming.listener import StreamingQueryListener

    jvm_side = _JvmSide(on_progress)

    class _Progress(StreamingQueryListener):  # type: ignore[misc]
        def onQueryStarted(self, event: Any) -> None:
            return None

        def onQueryIdle(self, event: Any) -> None:
            return None

        def onQueryProgress(self, event: Any) -> None:  # Spark Connect's events
            jvm_side.hand_on(lambda: event.progress)

        def onQueryTerminated(self, event: Any) -> None:
            jvm_side.onQueryTerminated(None)

        @property
        def _jlistener(self) -> Any:  # classic: the JVM wraps the lean side, not PySpark's
            from pyspark import SparkContext

            if "_lean" not in self.__dict__:
                jvm: Any = SparkContext._jvm  # started: addListener runs on a live session
                self.__dict__["_lean"] = jvm.PythonStreamingQueryListenerWrapper(jvm_side)
            return self.__dict__["_lean"]

    return _Progress()
