"""Overlay: a few keys placed by an explicit map, every other key by a base strategy.

Live migration moves keys a few at a time: while it runs, the placement is the old one plus the
keys already moved. :class:`OverlayPartitioner` is exactly that: ``overrides[key]`` when the key
is listed, else ``base`` (any strategy). It is an internal placement (``by_name = False``: it
cannot be asked for by name), stored and restored like any strategy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ..._internal.validation import check_num_partitions
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidKeyTypeError
from ..core.keys import DEFAULT_NULL_POLICY, Key, KeyArray, key_index, normalize_key, to_counts
from ..core.keys import to_key_array
from ..core.base import Partitioner, decode_key, encode_key
from .table import TablePartitioner

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["OverlayPartitioner"]

_FAMILY = {"int": "int", "long": "int", "string": "string", "binary": "binary"}


def _family_of_type(key_type: str) -> str | None:
    """Key family a Spark key type takes (None for ``"auto"``)."""
    return _FAMILY.get(key_type)


def _lookup(kind: str, keys: list[Key], pids: npt.NDArray[np.int32], key: Column) -> Column:
    """``map[key]`` over a constant map built from one folded literal per side (null if absent)."""
    from pyspark.sql import functions as F

    values = F.split(F.lit(",".join(map(str, pids.tolist()))), ",").cast("array<int>")
    if kind == "int":
        ints = F.split(F.lit(",".join(map(str, keys))), ",").cast("array<bigint>")
        return F.map_from_arrays(ints, values)[key.cast("bigint")]
    if kind == "string":
        text = F.from_json(F.lit(json.dumps(keys, ensure_ascii=False)), "array<string>")
        return F.map_from_arrays(text, values)[key]
    hexes = F.split(F.lit(",".join(k.hex().upper() for k in keys)), ",")  # type: ignore[union-attr]
    return F.map_from_arrays(hexes, values)[F.hex(key)]


class OverlayPartitioner(Partitioner):
    """Place a key by ``overrides[key]`` when present, else by ``base``.

    Parameters
    ----------
    base : Partitioner
        The placement of every key not overridden (the old placement of a migration).
    overrides : mapping of key to int
        Explicit partitions (the keys already moved). Keys of one kind, the kind ``base``
        places (integers, strings or bytes); partitions in ``[0, num_partitions)``.
    num_partitions : int, optional
        Defaults to ``base.num_partitions``; may be larger (a migration to more partitions),
        never smaller, since ``base`` places keys on all of its own.
    null_policy : {"group", "error", "partition0"}, optional
        Defaults to ``base``'s.

    Notes
    -----
    Cost: one hash lookup per key (vectorised: a pandas index lookup over the batch) plus
    ``base`` for the keys not overridden. Over a table strategy (LeastKey, LeastCount, random
    Weight) placing never changes its table: a key neither overridden nor in the table gets
    the table's hash fallback (its ``lookup``), on the driver as in Spark; teach the table
    with :meth:`fit`. Memory: the overrides, and an index over them. In a
    DataFrame the id is ``coalesce(<overrides map>[key], base)`` computed in the JVM, the map
    one literal that Spark folds into a constant (see :meth:`spark_column`; over a table
    strategy its table travels the same way). The keys of the map must have the key column's
    kind (integer overrides look the key up cast to ``bigint``).

    Examples
    --------
    >>> from trilink_spark.partitioners import BlockPartitioner, OverlayPartitioner
    >>> base = BlockPartitioner(4, num_blocks=8)
    >>> p = OverlayPartitioner(base, {"a": 3})
    >>> base.assign(["a", "b"]).tolist(), p.assign(["a", "b"]).tolist()
    ([1, 0], [3, 0])
    """

    strategy_name = "overlay"
    by_name = False

    def __init__(
        self,
        base: Partitioner,
        overrides: Mapping[Any, int],
        num_partitions: int | None = None,
        *,
        null_policy: str | None = None,
    ) -> None:
        if not isinstance(base, Partitioner):
            raise InvalidArgumentTypeError(
                f"base must be a Partitioner, got {type(base).__name__}"
            )
        if isinstance(base, OverlayPartitioner):
            raise InvalidArgumentTypeError(
                "base is itself an overlay: merge the overrides, "
                "OverlayPartitioner(base.base, {**base.overrides, **more})"
            )
        n = base.num_partitions if num_partitions is None else check_num_partitions(
            num_partitions
        )
        if n < base.num_partitions:
            raise InvalidArgumentError(
                f"num_partitions={n} is below the base strategy's {base.num_partitions}: the "
                "base places keys on every one of its partitions"
            )
        super().__init__(n, null_policy=base.null_policy if null_policy is None else null_policy)
        if not isinstance(overrides, Mapping):
            raise InvalidArgumentTypeError(
                f"overrides must be a mapping {{key: partition}}, got {type(overrides).__name__}"
            )
        self._base = base
        keys, pids, kind = self._check_overrides(overrides)
        self._overrides: dict[Key, int] = dict(zip(keys, pids.tolist()))
        self._kind = kind
        self._index = key_index(keys)
        self._pids = pids

    def _check_overrides(
        self, overrides: Mapping[Any, int]
    ) -> tuple[list[Key], npt.NDArray[np.int32], str | None]:
        if not overrides:
            return [], np.zeros(0, dtype=np.int32), None
        raw = list(overrides.values())
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in raw):
            raise InvalidArgumentTypeError("override partitions must be ints")
        pids = np.asarray(raw, dtype=np.int64)
        bad = np.flatnonzero((pids < 0) | (pids >= self._num_partitions))
        if bad.size:
            key = list(overrides)[int(bad[0])]
            raise InvalidArgumentError(
                f"override {key!r}: {int(pids[bad[0]])} is outside [0, {self._num_partitions})"
            )
        keys = [normalize_key(k) for k in overrides]
        if any(k is None for k in keys):
            raise InvalidArgumentError("overrides cannot place a null key (null_policy does)")
        karr = to_key_array(keys)  # one kind only: InvalidKeyTypeError otherwise
        kind = _FAMILY[karr.kind]
        wanted = _family_of_type(str(getattr(self._base, "key_type", "auto")))
        if wanted is not None and wanted != kind:
            raise InvalidKeyTypeError(
                f"overrides have {kind} keys but the base strategy places "
                f"{getattr(self._base, 'key_type')} keys"
            )
        if getattr(self._base, "key_type", "auto") == "int":
            ints = karr.ints()
            if ints.min() < -(2**31) or ints.max() >= 2**31:
                raise InvalidKeyTypeError("override keys do not fit the base's 'int' key type")
        if len(set(keys)) != len(keys):  # e.g. 1 and numpy.int64(1)
            raise InvalidArgumentError("overrides list a key twice")
        return keys, pids.astype(np.int32), kind  # type: ignore[return-value]

    # ------------------------------------------------------------------ properties
    @property
    def base(self) -> Partitioner:
        """The strategy of every key not overridden."""
        return self._base

    @property
    def overrides(self) -> dict[Key, int]:
        """A copy of the overrides ``{key: partition}``."""
        return dict(self._overrides)

    def __len__(self) -> int:
        return len(self._overrides)

    @property
    def is_stateful(self) -> bool:
        return self._base.is_stateful

    # ------------------------------------------------------------------ key column
    def column_key_type(self, kind: str | None) -> str | None:
        """The base's (:meth:`~trilink_spark.Partitioner.column_key_type`): the overrides are
        looked up by value, whatever the type. O(1)."""
        return self._base.column_key_type(kind)

    def for_column(self, kind: str | None) -> Partitioner:
        """The same overrides over ``base.for_column(kind)``. O(overrides + base)."""
        return OverlayPartitioner(self._base.for_column(kind), self._overrides,
                                  self._num_partitions, null_policy=self._null_policy)

    # ------------------------------------------------------------------ placement
    def _table_base(self) -> TablePartitioner | None:
        base = self._base.unwrap()
        return base if isinstance(base, TablePartitioner) and base.is_stateful else None

    def _partition(self, key: Key) -> int:
        pid = self._overrides.get(key)
        if pid is not None:
            return pid
        table = self._table_base()
        return self._base.partition(key) if table is None else int(table.lookup([key])[0])

    def _assign(self, keys: KeyArray) -> npt.NDArray[np.int32]:
        out = np.zeros(len(keys), dtype=np.int32)
        valid = np.ones(len(keys), dtype=bool) if keys.null_mask is None else ~keys.null_mask
        rest = valid
        if self._overrides and len(keys):
            if _FAMILY[keys.kind] != self._kind:
                raise InvalidKeyTypeError(
                    f"keys are {keys.kind} but the overrides hold {self._kind} keys"
                )
            pos = self._index.get_indexer(keys.objects())  # type: ignore[arg-type]
            hit = (pos >= 0) & valid
            out[hit] = self._pids[pos[hit]]
            rest = valid & ~hit
        if rest.any():
            sub = keys.arrow if rest.all() else keys.arrow.filter(pa.array(rest))
            table = self._table_base()
            out[rest] = self._base.assign(sub) if table is None else table.lookup(sub)
        return out

    def fit(self, keys_or_counts: Any) -> Self:
        """Teach ``base`` the keys not overridden (a mapping stays a mapping); returns ``self``."""
        keys, counts, from_mapping = to_counts(keys_or_counts, self._null_policy)
        if not self._overrides:
            self._base.fit(keys_or_counts)
            return self
        if from_mapping:
            objs = keys.objects()
            keep = self._index.get_indexer(objs) < 0  # type: ignore[arg-type]
            self._base.fit(dict(zip(objs[keep].tolist(), counts[keep].tolist())))
        else:
            karr = to_key_array(keys_or_counts, self._null_policy)
            keep = self._index.get_indexer(karr.objects()) < 0  # type: ignore[arg-type]
            self._base.fit(karr.arrow.filter(pa.array(keep)))
        return self

    def overrides_column(self, key: Column) -> Column | None:
        """``<overrides map>[key]`` in the JVM (null for a key not overridden); None when
        nothing is overridden.

        The map is one string literal per side that Spark's optimiser folds into a constant:
        integer keys as comma-separated numbers, string keys as JSON, binary keys by their
        upper-case hex (looked up as ``map[hex(key)]``); about 10 bytes of plan a key.
        """
        if not self._overrides or self._kind is None:
            return None
        return _lookup(self._kind, list(self._overrides), self._pids, key)

    def spark_column(self, key: Column) -> Column:
        """``coalesce(<overrides map>[key], base)``, in the JVM, over a stateless base.

        Over a table strategy (LeastKey, LeastCount, random Weight) there is no expression:
        :func:`~trilink_spark.key_by` places the base through the table's broadcast join, as
        it places the table itself, and lays :meth:`overrides_column` over it.
        """
        from pyspark.sql import functions as F

        base = self._table_base()
        if base is not None:
            raise InvalidArgumentError(
                f"{type(self).__name__} over {type(base).__name__} has no JVM expression: "
                "key_by places it through the table's broadcast join, hashing unknown keys "
                "as the key column's type (or the table's key_type)"
            )
        column = self._base.spark_column(key)
        overrides = self.overrides_column(key)
        return column if overrides is None else F.coalesce(overrides, column)

    def table_base(self) -> TablePartitioner | None:
        """The base when it is a table strategy (placed through its table), else None."""
        return self._table_base()

    # ------------------------------------------------------------------ serialisation
    def _params(self) -> dict[str, Any]:
        return {
            "base": self._base.to_dict(),
            "overrides": [[encode_key(k), p] for k, p in self._overrides.items()],
        }

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> Partitioner:
        unknown = set(data) - {"strategy", "num_partitions", "null_policy", "base", "overrides"}
        if unknown:
            raise InvalidArgumentError(f"unknown field(s) {sorted(unknown)} for overlay")
        base = Partitioner.from_dict(data["base"])
        rows = data.get("overrides", [])
        if not isinstance(rows, list) or any(
            not isinstance(r, list) or len(r) != 2 for r in rows
        ):
            raise InvalidArgumentError("overrides must be a list of [key, partition]")
        overrides: dict[Key, int] = {}
        for key, pid in rows:
            k = decode_key(key)
            if k is None or k in overrides:
                raise InvalidArgumentError(f"overrides list {key!r} twice or as null")
            overrides[k] = pid
        return cls(base, overrides, data.get("num_partitions"),
                   null_policy=data.get("null_policy", DEFAULT_NULL_POLICY))

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._index = key_index(list(self._overrides))  # an unpickled index has no hash table

    def __repr__(self) -> str:
        return (
            f"OverlayPartitioner(base={self._base!r}, overrides={len(self._overrides)}, "
            f"num_partitions={self._num_partitions})"
        )
