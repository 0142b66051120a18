"""A keyed table held as numpy columns: per-key rows of a vectorised processor's state.

A :class:`KeyedColumns` in ``runtime.shared`` is per-key state, like a pandas DataFrame whose
first index level is the key: it moves with its keys when partitions are swapped, and the
durable layer stores it in the same Arrow layout (one ``list<struct>`` column per table, one
list per key). It keeps what a DataFrame with a MultiIndex costs to build and take apart out
of every batch: the keys are one object array (the runtime's own key objects), every other
field one numpy array, and the operations a processor needs (take, drop keys, merge rows by
key and a second field) are numpy passes with no index.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ...errors import StateCorruptError
from .keys import NULL_KEY, object_array

__all__ = ["KeyedColumns", "FORM", "frame_keys"]

#: The value of a stored table's ``form`` (in its ``trilink.shared_tables`` entry) that
#: decodes as a :class:`KeyedColumns`; a table without it decodes as a pandas DataFrame.
FORM = "columns"


def frame_keys(frame: pd.DataFrame) -> np.ndarray[Any, Any]:
    """The key of each row of a keyed DataFrame (its first index level) as the runtime
    identifies it: an index holds the null key as a missing value (NaN), which becomes
    :data:`~trilink_spark.keyed.semantics.keys.NULL_KEY` again. O(rows)."""
    keys = object_array(frame.index.get_level_values(0).tolist())
    keys[np.flatnonzero(pd.isna(keys))] = NULL_KEY
    return keys


@dataclass(frozen=True)
class KeyedColumns:
    """Rows of per-key state as columns: ``keys[i]`` owns row ``i`` of every column.

    Parameters
    ----------
    keys : numpy.ndarray of object
        One runtime key per row (:data:`~trilink_spark.keyed.semantics.keys.NULL_KEY`,
        :data:`~trilink_spark.keyed.semantics.keys.NAN_KEY` and scalars as the runtime
        identifies them); repeats allowed.
    columns : mapping of str to numpy.ndarray
        The other fields, each one value per row, in their stored order.
    levels : tuple of str
        The names the rows are identified by: the key's, then those of columns that are
        part of a row's identity (a window's start); stored with the table.

    Raises
    ------
    StateCorruptError
        A column's length is not one value per key.

    Notes
    -----
    Immutable: every operation returns a new table. Memory: one pointer per row for the keys
    plus the columns' own bytes.

    Examples
    --------
    >>> t = KeyedColumns(object_array(["a", "b"]), {"s": np.array([0.0, 5.0])}, ("k", "s"))
    >>> len(t), t.take(np.array([False, True])).keys.tolist()
    (2, ['b'])
    """

    keys: np.ndarray[Any, Any]
    columns: Mapping[str, np.ndarray[Any, Any]]
    levels: tuple[str, ...] = ("k",)

    def __post_init__(self) -> None:
        n = len(self.keys)
        for name, column in self.columns.items():
            if len(column) != n:
                raise StateCorruptError(
                    f"keyed table column {name!r} holds {len(column)} values for {n} keys")

    def __len__(self) -> int:
        return len(self.keys)

    def take(self, rows: np.ndarray[Any, Any]) -> KeyedColumns:
        """The rows ``rows`` selects (a boolean mask or positions). O(rows)."""
        return KeyedColumns(self.keys[rows], {k: v[rows] for k, v in self.columns.items()},
                            self.levels)

    def without_keys(self, keys: Iterable[Hashable]) -> KeyedColumns:
        """The table without the rows of ``keys`` (the null key found as any NaN).
        O(rows + keys), hashed."""
        gone = list(keys)
        if not gone or not len(self):
            return self
        member = pd.Index(self.keys, dtype=object).isin(gone)
        return self.take(~np.asarray(member, dtype=bool)) if member.any() else self

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> KeyedColumns:
        """The same rows as a pandas DataFrame keyed by its first index level (the form of
        state written before this type), further index levels first among the columns.
        O(rows)."""
        index = frame.index
        keys = frame_keys(frame)
        columns: dict[str, np.ndarray[Any, Any]] = {}
        names = [str(n) for n in index.names]
        for i in range(1, index.nlevels):
            columns[names[i]] = index.get_level_values(i).to_numpy()
        for name in frame.columns:
            columns[str(name)] = frame[name].to_numpy()
        return cls(keys, columns, tuple(names))

    def concat(self, other: KeyedColumns) -> KeyedColumns:
        """This table's rows, then ``other``'s (the same columns). O(rows)."""
        if list(self.columns) != list(other.columns):
            raise StateCorruptError(
                f"keyed tables with columns {list(self.columns)} and {list(other.columns)} "
                "do not combine")
        return KeyedColumns(
            np.concatenate([self.keys, other.keys]),
            {k: np.concatenate([v, other.columns[k]]) for k, v in self.columns.items()},
            self.levels)

    def groups(self, by: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The rows grouped by key and column ``by``: an order of the rows in which each
        group's rows are together (in their order here), and where each group starts in it.
        O(rows log rows).

        Returns
        -------
        order : numpy.ndarray of intp
        starts : numpy.ndarray of intp
        """
        if not len(self):
            return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
        # by Python hash and equality, as a dict finds the runtime's keys; every NaN (the
        # null key) is one group
        codes, _ = pd.factorize(self.keys, use_na_sentinel=False)
        second = self.columns[by]
        order = np.lexsort((second, codes))  # stable: a group keeps its rows' order
        c, s = codes[order], second[order]
        new = np.ones(len(order), dtype=bool)
        new[1:] = (c[1:] != c[:-1]) | (s[1:] != s[:-1])
        return order, np.flatnonzero(new)
