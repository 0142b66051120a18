"""The exceptions of trilink-spark.

Every error the library raises derives from :class:`TrilinkError`. Argument errors also derive
from :class:`ValueError` or :class:`TypeError`, so ordinary ``except ValueError`` clauses work.

Examples
--------
>>> import trilink_spark as tl
>>> try:
...     tl.ModuloPartitioner(0)
... except tl.TrilinkError as err:
...     print(type(err).__name__)
InvalidArgumentError

Errors from Spark tasks and streams
-----------------------------------
A :class:`TrilinkError` raised inside a Spark task is typed again on the driver. Spark hands a task's exception to the driver as text: a ``PythonException`` (classic and
Connect) or a ``Py4JJavaError`` whose message holds the Python worker's traceback, and a JVM
``raise_error`` as a ``SparkRuntimeException`` holding its message. :func:`typed_error` reads
the exception line that ends the text's last traceback (the exception that left the task,
not one it handled or was raised from) or, without a traceback, a ``raise_error``'s message;
when that line is ``trilink_spark.errors.<Name>: <message>`` it builds the same class with
the same message (Spark's ``SQLSTATE`` suffix left off); :func:`typed_task_errors` raises it in
place of Spark's exception, which stays chained (``__cause__``) with the task's traceback.
Nothing is evaluated or unpickled: the class is looked up by name among the package's own
error classes, and any other name leaves Spark's exception as it is.

A streaming query's batch function runs where Spark calls it, and Spark wraps what it raised
in a ``StreamingQueryException`` around the worker's traceback: :func:`await_query` (a
``query.awaitTermination`` that raises the typed error) and :func:`query_error` (the typed
error of ``query.exception()``) give the same class and message as a batch run by hand,
Spark's exception chained.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
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
    "StreamingNotSupportedError",
    "ServerStartError",
    "ExecutorEnvironmentError",
    "TrilinkWarning",
    "typed_error",
    "typed_task_errors",
    "query_error",
    "await_query",
]


class TrilinkError(Exception):
    """Root of every exception raised by trilink-spark."""


class InvalidArgumentError(TrilinkError, ValueError):
    """An argument has a value outside what is allowed (the message says what is allowed)."""


class InvalidArgumentTypeError(TrilinkError, TypeError):
    """An argument has the wrong type (the message says which types are allowed)."""


class InvalidKeyTypeError(TrilinkError, TypeError):
    """A key (or key column) has a type the chosen strategy cannot place."""


class NullKeyError(TrilinkError, ValueError):
    """A key is ``None``/null and the null policy is ``"error"``."""


class UnknownStrategyError(TrilinkError, ValueError):
    """A strategy name that is not registered."""


class MissingColumnError(TrilinkError, ValueError):
    """A column named in a call is not in the DataFrame."""


class ConfigError(TrilinkError, ValueError):
    """A configuration update was refused: unknown field, wrong type, out of range, stale
    version or bad signature (the message says which)."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration field has the wrong type."""


class ConfigCenterUnavailableError(TrilinkError, ConnectionError):
    """The configuration store (Redis) cannot be reached; the message names the URL's host."""


class StoreUnavailableError(TrilinkError, ConnectionError):
    """A global store (Redis) cannot be reached; what was applied stays applied exactly once."""


class BrokerUnavailableError(TrilinkError, ConnectionError):
    """No Kafka broker answered at the bootstrap servers within the timeout."""


class PartitionCountError(TrilinkError, ValueError):
    """A Kafka topic's partition count differs from the one the keys were placed for."""


class KeysNotGroupedError(TrilinkError, ValueError):
    """Rows declared grouped by key per input partition are not: a key is in two partitions."""


class MissingDependencyError(TrilinkError, ImportError):
    """An optional package a feature needs is not installed; the message names the extra."""


class DataLossError(TrilinkError):
    """Records a reader was asked for are gone from the source (deleted by retention, or
    offsets that went backwards); the message names the partition and the offsets."""


class ReservedColumnError(InvalidArgumentError):
    """A user column has a name trilink-spark reserves for its internal columns (``_tl_...``)."""


class StateCorruptError(TrilinkError, ValueError):
    """A stored state or strategy file (or a state directory's layout) is truncated, corrupt or
    foreign; the message names the file. State never silently starts from empty."""


class StateStoreError(TrilinkError, OSError):
    """A state path cannot be created, listed, read or written (permissions, a missing
    filesystem); the message names the path and the operation."""


class StateTypeError(TrilinkError, TypeError):
    """A keyed state value does not fit the processor's declared ``state_schema`` (or, without
    one, is not JSON-representable); the message names the key and the value."""


class StateOwnershipError(StateStoreError):
    """A second writer (another query or runner) tried to use a state path that belongs to
    another one; the message names both."""


class ArithmeticOverflowError(TrilinkError, ArithmeticError):
    """An integral sum left the 64-bit range, or a decimal sum or mean its decimal type
    (Spark's ANSI mode fails such a query with ``ARITHMETIC_OVERFLOW`` or
    ``NUMERIC_VALUE_OUT_OF_RANGE``); the message names the aggregate."""


class ConnectUnsupportedError(TrilinkError, NotImplementedError):
    """A feature that needs classic PySpark (its JVM through Py4J, or RDDs) was used with a
    Spark Connect session or DataFrame; the message says what to use instead."""


class StreamingNotSupportedError(InvalidArgumentError, TypeError):
    """A streaming DataFrame was given to a call that runs on batch DataFrames only; raised at
    call time, before any query starts. The message names the call, says why, and gives the
    route that runs on a stream (``writeStream.foreachBatch``: the call on each micro-batch, or
    :func:`~trilink_spark.keyed_foreach_batch` for state kept across micro-batches). Also a
    ``TypeError`` (the frame is of the wrong kind) and, as the refusals it replaced were, an
    :class:`InvalidArgumentError`."""


class ServerStartError(TrilinkError, RuntimeError):
    """A server that :mod:`trilink_spark.testing` launched exited, or did not accept
    connections in time."""


class ExecutorEnvironmentError(TrilinkError, RuntimeError):
    """The executors cannot run trilink-spark's tasks: their Python cannot import the package
    or one of its dependencies (or imports another version of it), or they cannot see the
    ``state_path`` the driver writes to. The message names what is missing, the executors'
    host and Python, and the fix (``tl.ship(spark)``, a packed environment, shared storage)."""


class TrilinkWarning(UserWarning):
    """Root of the warnings trilink-spark issues (``warnings.filterwarnings`` can single them
    out), such as a local ``state_path`` given to a job whose executors run elsewhere."""


#: A Python traceback's start: the exception that left the task ends the last one.
_TRACEBACK = "Traceback (most recent call last):"
#: The exception line that ends a traceback, or a JVM raise_error's message: at a line's start.
_NAMED = re.compile(r"^(?:\[USER_RAISED_EXCEPTION\] )?trilink_spark\.errors\.([A-Z][A-Za-z]*): ",
                    re.MULTILINE)
#: Where a task's message ends in Spark's text: the JVM's frames or its stack trace section,
#: or the SQLSTATE Spark appends to a raised error.
_END = re.compile(r"\n\s*\n|\n\tat |\n\s*JVM stacktrace:|\n\s*at [a-z]+\.[a-z]|"
                  r"\s*SQLSTATE: [0-9A-Z]{5}")
#: The longest message kept (a task's message is short; Spark's text may hold megabytes).
MAX_MESSAGE = 8_000


def typed_error(err: BaseException) -> TrilinkError | None:
    """The :class:`TrilinkError` a Spark task raised, as Spark's exception ``err`` tells it,
    or None (no package error named in it, or ``err`` is one already). O(len(str(err))).

    Examples
    --------
    >>> text = ("An exception was thrown from the Python worker.\\nTraceback (most recent "
    ...         "call last):\\n  File \\"task.py\\", line 1\\ntrilink_spark.errors."
    ...         "StateCorruptError: p00001.json fails its checksum\\n")
    >>> found = typed_error(RuntimeError(text))
    >>> type(found).__name__, str(found)
    ('StateCorruptError', 'p00001.json fails its checksum')
    >>> typed_error(RuntimeError("java.lang.OutOfMemoryError")) is None
    True
    """
    if isinstance(err, TrilinkError):
        return None
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 - an exception whose text fails names nothing
        return None
    at = text.rfind(_TRACEBACK)
    if at >= 0:  # the last traceback's exception line: the first unindented line after it
        tail = text[at + len(_TRACEBACK):]
        last = re.search(r"^\S.*$", tail, re.MULTILINE)
        found = _NAMED.match(tail, last.start()) if last is not None else None
        text = tail
    else:  # no Python traceback: a JVM raise_error's message
        found = _NAMED.search(text)
    if found is None:
        return None
    cls = globals().get(found.group(1)) if found.group(1) in __all__ else None
    if not (isinstance(cls, type) and issubclass(cls, TrilinkError)):
        return None
    rest = text[found.end():]
    end = _END.search(rest)
    message = (rest[: end.start()] if end else rest).strip()[:MAX_MESSAGE]
    return cls(message)


@contextmanager
def typed_task_errors() -> Iterator[None]:
    """Raise the :class:`TrilinkError` a Spark task raised inside the block as that error
    (:func:`typed_error`), Spark's exception chained; every other exception as it is.

    Examples
    --------
    >>> with typed_task_errors():  # doctest: +SKIP
    ...     df.write.format("noop").mode("overwrite").save()
    """
    try:
        yield
    except TrilinkError:
        raise
    except Exception as err:
        typed = typed_error(err)
        if typed is None:
            raise
        raise typed from err


def query_error(query: Any) -> BaseException | None:
    """Why a streaming query stopped, typed: the :class:`TrilinkError` at the root of
    ``query.exception()``, or Spark's exception where none of the package's errors is named,
    or ``None`` while the query runs or after it stopped without an error.

    Parameters
    ----------
    query : pyspark.sql.streaming.StreamingQuery
        A query of a classic or Spark Connect session (anything with ``exception()``).

    Returns
    -------
    BaseException or None
        The typed error has the message the batch function raised and Spark's
        ``StreamingQueryException`` (with the worker's traceback) as its ``__cause__``.

    Examples
    --------
    >>> q = df.writeStream.foreachBatch(run).start()  # doctest: +SKIP
    >>> q.awaitTermination(60)  # doctest: +SKIP
    >>> err = tl.errors.query_error(q)  # doctest: +SKIP
    >>> isinstance(err, tl.errors.StateCorruptError)  # doctest: +SKIP
    True

    Notes
    -----
    Cost: one call to the query (a Py4J or Connect round trip); O(len of Spark's message).
    """
    failed = query.exception()
    if failed is None:
        return None
    typed = typed_error(failed)
    if typed is None:
        return failed  # type: ignore[no-any-return]
    typed.__cause__ = failed
    return typed


def await_query(query: Any, timeout: float | None = None) -> bool:
    """``query.awaitTermination(timeout)``, raising the typed error that stopped the query.

    Parameters
    ----------
    query : pyspark.sql.streaming.StreamingQuery
        A query of a classic or Spark Connect session.
    timeout : float, optional
        Seconds to wait; ``None`` waits until the query stops.

    Returns
    -------
    bool
        Whether the query has stopped (always ``True`` without a timeout).

    Raises
    ------
    TrilinkError
        The package error that a batch function or one of its tasks raised (the same class
        and message), Spark's ``StreamingQueryException`` chained as ``__cause__``. Any other
        failure is raised as Spark raises it.

    Examples
    --------
    >>> q = df.writeStream.foreachBatch(run).start()  # doctest: +SKIP
    >>> try:  # doctest: +SKIP
    ...     tl.errors.await_query(q)
    ... except tl.errors.ExecutorEnvironmentError as err:
    ...     print(err)  # the executors lack a module, and the fix

    Notes
    -----
    Cost: blocks like ``awaitTermination``; O(len of Spark's message) on failure.
    """
    with typed_task_errors():  # Spark itself refuses a timeout that is not seconds >= 0
        if timeout is None:
            query.awaitTermination()
            return True
        return bool(query.awaitTermination(timeout))
