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
"""

from __future__ import annotations

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
