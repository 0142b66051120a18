"""The strategy interface every key partitioner implements, and the registry of strategies.

A strategy maps a key to a partition id in ``[0, num_partitions)`` and never splits a key. The
interface is: ``fit``, ``partition``, ``__call__`` (so that
``rdd.partitionBy(n, p)`` works), vectorised ``assign``, ``to_dict``/``from_dict`` and pickling.

Stateless strategies (Hash, Modulo, hash-mode Weight) compute the id from the key alone, so Spark
can compute it in the JVM (:meth:`Partitioner.spark_column`). Table strategies (LeastKey,
LeastCount, random-mode Weight) remember every decision in a history map; see
:mod:`trilink_spark.partitioners.tables.table`.
"""

from __future__ import annotations

import base64
import copy
import json
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np
import numpy.typing as npt

from ..._internal.validation import check_num_partitions, choice
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidKeyTypeError
from ...errors import TrilinkError, UnknownStrategyError
from .keys import DEFAULT_NULL_POLICY, Key, KeyArray, check_null_policy, normalize_key
from .keys import null_partition, to_counts, to_key_array

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "Partitioner",
    "check_num_partitions",
    "strategy_names",
    "strategy_class",
    "resolve_strategy_name",
    "encode_key",
    "decode_key",
    "KEY_KINDS",
    "column_key_type",
]

#: The kinds of key column a strategy places, and the Spark types of each (for messages):
#: Spark hashes every ``"int"`` type as a 32-bit int and ``"long"`` as a 64-bit long.
KEY_KINDS: dict[str, str] = {"int": "tinyint, smallint or int", "long": "bigint",
                             "string": "string", "binary": "binary"}


def column_key_type(key_type: str, kind: str, auto_int: str = "int",
                    strategy: str = "the strategy") -> str:
    """The key type a strategy of key type ``key_type`` hashes a key column of ``kind`` as.

    The JVM places a row by the column's own Spark type; the driver places stored keys in
    Python, where a key is a plain ``int``. Both agree only when the strategy names the type
    the JVM hashes, so a keyed stream fixes it once (:meth:`Partitioner.for_column`).

    Parameters
    ----------
    key_type : {"auto", "int", "long", "string", "binary"}
        The strategy's own.
    kind : {"int", "long", "string", "binary"}
        The key column's (:data:`KEY_KINDS`).
    auto_int : {"int", "long"}
        What ``"auto"`` hashes an ``"int"`` column as: ``"int"`` for a strategy whose JVM
        expression hashes the column itself (Hash, Block, hash-mode Weight), ``"long"`` for a
        table strategy's fallback (which casts to ``bigint``).
    strategy : str
        Its name, for the message.

    Returns
    -------
    str
        ``kind`` for ``"auto"`` (``auto_int`` for an ``"int"`` column), else ``key_type``.

    Raises
    ------
    InvalidKeyTypeError
        ``key_type`` cannot hold the column's values: ``"int"`` for a ``bigint`` column,
        an integer type for a string column, and so on. ``"long"`` for an ``"int"`` column
        is allowed (the JVM widens the column to ``bigint`` before hashing).

    Examples
    --------
    >>> column_key_type("auto", "int"), column_key_type("long", "int")
    ('int', 'long')

    Notes
    -----
    O(1).
    """
    choice(kind, "kind", KEY_KINDS)
    if key_type == "auto":
        return auto_int if kind == "int" else kind
    if key_type == kind or (key_type, kind) == ("long", "int"):
        return key_type
    raise InvalidKeyTypeError(
        f"{strategy} hashes keys as Spark {KEY_KINDS.get(key_type, key_type)}, but the key "
        f"column is {KEY_KINDS[kind]}: the rows and the stored keys would be placed apart; "
        f"use key_type='auto' (or {kind!r})")


def encode_key(key: Key | None) -> Any:
    """A JSON-safe form of a key: ints and strings as they are, bytes as ``{"b64": ...}``."""
    if isinstance(key, bytes):
        return {"b64": base64.b64encode(key).decode("ascii")}
    return key


def decode_key(value: Any) -> Key | None:
    """Inverse of :func:`encode_key`; refuses anything :func:`encode_key` cannot give."""
    if isinstance(value, dict):
        raw = value.get("b64")
        if set(value) != {"b64"} or not isinstance(raw, str):
            raise InvalidArgumentError(f"a stored binary key is {{'b64': <base64>}}, got {value!r}")
        try:
            return base64.b64decode(raw, validate=True)
        except ValueError:
            raise InvalidArgumentError(f"stored binary key {raw!r} is not base64") from None
    return normalize_key(value)


_REGISTRY: dict[str, type[Partitioner]] = {}
_ALIASES: dict[str, str] = {}


def _squash(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "").replace(" ", "")


def strategy_names() -> list[str]:
    """The strategy names usable by name, e.g. ``["hash", "modulo", "least_key", ...]``."""
    return [name for name, cls in _REGISTRY.items() if cls.by_name]


def strategy_class(name: str) -> type[Partitioner]:
    """The class registered under a stored ``strategy`` name (as :meth:`Partitioner.to_dict`
    writes it), wrappers such as ``"adaptive"`` included. O(1).

    Examples
    --------
    >>> strategy_class("hash").__name__
    'HashPartitioner'
    """
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"strategy name must be a str, got {type(name).__name__}")
    cls = _REGISTRY.get(name) or _REGISTRY.get(_ALIASES.get(_squash(name), ""))
    if cls is None:
        raise UnknownStrategyError(
            f"unknown strategy {name!r}; known: {', '.join(_REGISTRY)}"
        )
    return cls


def resolve_strategy_name(name: str) -> str:
    """Canonical strategy name for ``name`` (case, ``_`` and ``-`` are ignored)."""
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"strategy name must be a str, got {type(name).__name__}")
    canonical = _ALIASES.get(_squash(name))
    if canonical is None or not _REGISTRY[canonical].by_name:
        raise UnknownStrategyError(
            f"unknown strategy {name!r}; known: {', '.join(strategy_names())} (or 'auto')"
        )
    return canonical


class Partitioner(ABC):
    """Base class of every key-placement strategy.

    Parameters
    ----------
    num_partitions : int
        Number of partitions, at least 1.
    null_policy : {"group", "error", "partition0"}
        ``"group"`` (default): the null key (``None``) is a key of its own, as in Spark's
        ``groupBy``, on partition ``pmod(42, num_partitions)``, where Spark's hash
        partitioning puts it, whatever the strategy (a table, block table or weights never
        move it; :func:`~trilink_spark.partitioners.core.keys.null_partition`). ``"error"``
        refuses it with :class:`~trilink_spark.errors.NullKeyError`; ``"partition0"`` places
        it on partition 0.

    Notes
    -----
    Subclasses set ``strategy_name`` (which registers them: :func:`strategy_class`) and
    implement ``_partition`` (one normalised, non-null key) and ``_assign`` (a
    :class:`~trilink_spark.partitioners.core.keys.KeyArray`). What a strategy learns is listed in
    ``learned_fields`` (the :meth:`to_dict` fields that :meth:`fresh` drops). To offer a new
    strategy to ``"auto"``, the adaptive partitioner and the config center, add it to the
    catalogue (:mod:`trilink_spark.partitioners.choosing.catalogue`).
    """

    strategy_name: ClassVar[str] = ""
    #: Whether the strategy can be asked for by name (``key_by(df, k, "least_count")``).
    by_name: ClassVar[bool] = True
    #: :meth:`to_dict` fields that hold learned state rather than configuration.
    learned_fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.strategy_name:
            _REGISTRY[cls.strategy_name] = cls
            _ALIASES[_squash(cls.strategy_name)] = cls.strategy_name
            _ALIASES[_squash(cls.__name__)] = cls.strategy_name
            _ALIASES[_squash(cls.__name__.replace("Partitioner", ""))] = cls.strategy_name

    def __init__(self, num_partitions: int, *, null_policy: str = DEFAULT_NULL_POLICY) -> None:
        self._num_partitions = check_num_partitions(num_partitions)
        self._null_policy = check_null_policy(null_policy)

    # ------------------------------------------------------------------ properties
    @property
    def num_partitions(self) -> int:
        """Number of partitions this strategy places keys on."""
        return self._num_partitions

    @property
    def null_policy(self) -> str:
        """``"group"``, ``"error"`` or ``"partition0"``."""
        return self._null_policy

    def with_null_policy(self, null_policy: str) -> Partitioner:
        """``self`` when its null policy is ``null_policy``, else a copy with that policy and
        everything else (a learnt table included) kept. O(1), or O(table) for a copy.

        Examples
        --------
        >>> import trilink_spark as tl
        >>> tl.HashPartitioner(4).with_null_policy("error").null_policy
        'error'
        """
        if check_null_policy(null_policy) == self._null_policy:
            return self
        return Partitioner.from_dict({**self.to_dict(), "null_policy": null_policy})

    @property
    def is_stateful(self) -> bool:
        """True when placement depends on a learned table (Least*, random Weight)."""
        return False

    def unwrap(self, refit: bool = False) -> Partitioner:
        """The strategy that places keys now: ``self``, or the current one of an adaptive one.

        ``refit=True`` says the strategy is about to learn every key of the data
        (:func:`~trilink_spark.key_by` with ``fit="full"``); an adaptive partitioner whose table
        was only learnt from a sample then starts that table afresh.
        """
        return self

    def before_batch(self, df: Any, key: str, batch_id: int) -> None:
        """Called by a stateful runner (:func:`~trilink_spark.keyed_foreach_batch`) before each
        new micro-batch, with the batch: an adaptive strategy observes it and decides here,
        and the runner swaps state when :meth:`unwrap` then names another strategy. Default:
        nothing (O(1))."""

    # ------------------------------------------------------------------ placement
    def partition(self, key: Any) -> int:
        """Partition id of one key.

        Runtime complexity: O(len(key)) for hashing strategies, O(1) expected for a key a table
        strategy already knows, O(log n) for a new one.
        """
        k = normalize_key(key)
        if k is None:
            return self._null_partition()
        return self._partition(k)

    def __call__(self, key: Any) -> int:
        """Same as :meth:`partition`; lets a strategy serve as ``rdd.partitionBy(n, p)``."""
        return self.partition(key)

    def assign(self, keys: Any) -> npt.NDArray[np.int32]:
        """Partition ids of many keys, vectorised (numpy/Arrow, no Python loop per key).

        Parameters
        ----------
        keys : array-like
            List, numpy array, pandas Series or Arrow array of keys of one kind.

        Returns
        -------
        numpy.ndarray of int32
        """
        karr = to_key_array(keys, self._null_policy)
        out = np.asarray(self._assign(karr), dtype=np.int32)
        if karr.null_mask is not None:
            out[karr.null_mask] = self._null_partition()
        return out

    def fit(self, keys_or_counts: Any) -> Self:
        """Learn from keys (one per record) or a ``{key: count}`` mapping; returns ``self``.

        Stateless strategies only validate the input: they have nothing to learn.
        """
        to_counts(keys_or_counts, self._null_policy)
        return self

    def _null_partition(self) -> int:
        """The null key's partition (:func:`~trilink_spark.partitioners.core.keys.null_partition`)."""
        return null_partition(self._null_policy, self._num_partitions)

    @abstractmethod
    def _partition(self, key: Key) -> int: ...

    @abstractmethod
    def _assign(self, keys: KeyArray) -> npt.NDArray[np.int32]: ...

    # ------------------------------------------------------------------ key column
    #: What key type ``"auto"`` hashes an ``"int"`` key column as (:func:`column_key_type`).
    auto_int_key_type: ClassVar[str] = "int"

    def column_key_type(self, kind: str | None) -> str | None:
        """The key type this strategy places a key column of ``kind`` as (None: the strategy
        hashes no key type, e.g. Modulo, or ``kind`` is None: a type no strategy hashes
        in Python). See :func:`column_key_type`; O(1).

        Raises
        ------
        InvalidKeyTypeError
            The strategy's key type cannot hold the column's values.
        """
        key_type = getattr(self, "key_type", None)
        if kind is None or not isinstance(key_type, str):
            return None
        return column_key_type(key_type, kind, self.auto_int_key_type, type(self).__name__)

    def for_column(self, kind: str | None) -> Partitioner:
        """A copy whose key type is the one the JVM hashes a key column of ``kind`` as, so
        that :meth:`assign` of the column's values (plain Python ints included) equals the
        JVM's placement of its rows (:func:`~trilink_spark.key_by`).

        A keyed stream binds every placement to its key column this way, and stores it so:
        ``"auto"`` is resolved once, never again by the type of a Python value.

        Parameters
        ----------
        kind : {"int", "long", "string", "binary"} or None
            The key column's kind (None: returned as it is, copied).

        Raises
        ------
        InvalidKeyTypeError
            The strategy's key type cannot hold the column's values.

        Notes
        -----
        O(1) when the key type is fixed already, else a rebuild through :meth:`to_dict`
        (O(table) for a table strategy).

        Examples
        --------
        >>> import trilink_spark as tl
        >>> tl.HashPartitioner(4).for_column("int").key_type
        'int'
        """
        bound = self.column_key_type(kind)
        if bound is None or bound == getattr(self, "key_type", None):
            return self.copy()
        return Partitioner.from_dict({**self.to_dict(), "key_type": bound})

    # ------------------------------------------------------------------ Spark
    def spark_column(self, key: Column) -> Column:
        """The partition id as a Spark column expression computed in the JVM.

        Only stateless strategies have one; table strategies are placed through a broadcast
        join of their table (see :func:`trilink_spark.key_by`).
        """
        raise InvalidArgumentError(
            f"{type(self).__name__} has no JVM expression; it is placed through its table"
        )

    # ------------------------------------------------------------------ serialisation
    def _params(self) -> dict[str, Any]:
        """Constructor parameters and learned state beyond ``num_partitions``/``null_policy``."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description, learned state included."""
        out: dict[str, Any] = {
            "strategy": self.strategy_name,
            "num_partitions": self._num_partitions,
            "null_policy": self._null_policy,
        }
        out.update(self._params())
        return out

    @classmethod
    def _from_params(cls, num_partitions: int, null_policy: str, params: dict[str, Any]) -> Self:
        return cls(num_partitions, null_policy=null_policy, **params)

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> Partitioner:
        """Rebuild from :meth:`to_dict` output (subclasses with another layout override it)."""
        params = {
            k: v for k, v in data.items() if k not in ("strategy", "num_partitions", "null_policy")
        }
        return cls._from_params(
            data.get("num_partitions", 0), data.get("null_policy", DEFAULT_NULL_POLICY), params
        )

    def fresh(self, null_policy: str | None = None) -> Partitioner:
        """An unfitted strategy of the same kind and configuration (nothing learned kept).

        Examples
        --------
        >>> import trilink_spark as tl
        >>> p = tl.LeastKeyPartitioner(3).fit(["a", "b"])
        >>> len(p), len(p.fresh())
        (2, 0)
        """
        data = {k: v for k, v in self.to_dict().items() if k not in self.learned_fields}
        if null_policy is not None:
            data["null_policy"] = null_policy
        return Partitioner.from_dict(data)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Partitioner:
        """Rebuild a strategy from :meth:`to_dict` output.

        Examples
        --------
        >>> import trilink_spark as tl
        >>> p = tl.LeastKeyPartitioner(3).fit(["a", "b"])
        >>> tl.Partitioner.from_dict(p.to_dict()).partition("b") == p.partition("b")
        True
        """
        if not isinstance(data, dict) or "strategy" not in data:
            raise InvalidArgumentError("from_dict needs a dict with a 'strategy' field")
        cls = strategy_class(data["strategy"])
        try:
            return cls._from_dict(data)
        except TrilinkError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError,
                IndexError) as err:  # a malformed dict: say so, whatever broke on it
            raise InvalidArgumentError(
                f"not a stored {data['strategy']!r} strategy: {type(err).__name__}: {err}"
            ) from None

    def to_json(self) -> str:
        """:meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Partitioner:
        """Inverse of :meth:`to_json`."""
        return Partitioner.from_dict(json.loads(text))

    def copy(self) -> Self:
        """An independent deep copy (learned state included)."""
        return copy.deepcopy(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partitioner):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_partitions={self._num_partitions})"
