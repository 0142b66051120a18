"""Keys: the types a strategy can place, null policies, and conversion to arrays.

Keys are ``int`` (Spark ``byte``/``short``/``int``/``long``), ``str`` (Spark ``string``) or
``bytes`` (Spark ``binary``). Booleans and floats are refused: their equality is not what a user
means by "the same key" (``1 == 1.0 == True``). ``None`` is the null key: under the null policy
``"group"`` (the default) a key of its own, as in Spark's ``groupBy``, placed where Spark's hash
partitioning puts it (:func:`null_partition`); ``"partition0"`` places it on partition 0;
``"error"`` refuses it (:func:`null_key_error`).

Conversion to arrays goes through Arrow, so lists of Python objects, numpy arrays, pandas Series
and Arrow arrays are all accepted and strings never pass through a Python loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from ..._internal.validation import choice, fits_int64
from ...errors import InvalidArgumentError, InvalidKeyTypeError, NullKeyError

__all__ = [
    "Key",
    "KeyKind",
    "NullPolicy",
    "KeyArray",
    "NULL_POLICIES",
    "DEFAULT_NULL_POLICY",
    "NULL_HASH",
    "check_null_policy",
    "null_partition",
    "null_key_error",
    "normalize_key",
    "to_key_array",
    "to_counts",
]

Key = Union[int, str, bytes]
KeyKind = Literal["int", "long", "string", "binary"]
NullPolicy = Literal["group", "error", "partition0"]
#: The null policies: ``"group"`` (the null key is a key of its own, on the partition Spark's
#: hash gives it), ``"error"`` (refused) and ``"partition0"`` (on partition 0).
NULL_POLICIES: tuple[str, ...] = ("group", "error", "partition0")
#: The null policy of every entry point unless an argument or ``spark.trilink.nullPolicy``
#: says otherwise.
DEFAULT_NULL_POLICY = "group"
#: Spark's Murmur3 hash of a null value: the seed, 42 (``hash(NULL)`` is 42 for every type).
NULL_HASH = 42

_ALLOWED = "int, str or bytes (Spark byte/short/int/long, string or binary columns)"


def check_null_policy(policy: str) -> NullPolicy:
    """Validate a null policy name and return it."""
    return choice(policy, "null_policy", NULL_POLICIES)  # type: ignore[return-value]


def null_partition(policy: str, num_partitions: int) -> int:
    """The partition of the null key under ``policy`` on ``num_partitions`` partitions.

    ``"group"``: ``pmod(42, n)``, where Spark's hash partitioning (``repartition(n, key)``,
    ``groupBy``'s exchange) puts a null key, since Spark's Murmur3 hash of null is its seed;
    ``"partition0"``: 0. One rule for every strategy: a table, a block table or weights never
    move the null key. ``"error"`` raises :func:`null_key_error`.

    Examples
    --------
    >>> null_partition("group", 8), null_partition("group", 60), null_partition("partition0", 8)
    (2, 42, 0)

    Cost: O(1).
    """
    if policy == "group":
        return NULL_HASH % num_partitions
    if policy == "partition0":
        return 0
    raise null_key_error("key is None")


def null_key_error(subject: str) -> NullKeyError:
    """The one :class:`~trilink_spark.errors.NullKeyError` of the library: ``subject`` (what
    held a null key, e.g. ``"column 'k' has null keys"``), then the policy that refused it,
    where that policy came from and what to pass instead. The JVM's refusal
    (:func:`~trilink_spark.placement.key_by`) carries the same text.

    Examples
    --------
    >>> str(null_key_error("key is None")).split(";")[0]
    "key is None and null_policy='error' (argument null_policy, or conf spark.trilink.nullPolicy)"

    Cost: O(len(subject)).
    """
    return NullKeyError(
        f"{subject} and null_policy='error' (argument null_policy, or conf "
        "spark.trilink.nullPolicy); pass null_policy='group' to keep them as a group of their "
        "own as groupBy does, or 'partition0' to place them on partition 0")


def normalize_key(key: Any) -> Key | None:
    """Return ``key`` as a plain ``int``, ``str`` or ``bytes`` (``None`` passes through).

    Raises
    ------
    InvalidKeyTypeError
        For booleans, floats and every other type.
    """
    if key is None:
        return None
    if isinstance(key, (bool, np.bool_)):
        raise InvalidKeyTypeError(f"boolean key {key!r} is not supported; keys must be {_ALLOWED}")
    if isinstance(key, (int, np.integer)):
        return int(key)
    if isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise InvalidKeyTypeError(
        f"key {key!r} has type {type(key).__name__}; keys must be {_ALLOWED}"
    )


def key_index(keys: list[Key]) -> pd.Index:
    """A lookup index over distinct normalised ``keys``, safe to share between threads.

    pandas builds an index's hash table on its first lookup, and that first build is not
    thread-safe: two threads looking up at once can see a half-built table and be told the
    index is not unique. The table is built here, before the index is shared.

    Examples
    --------
    >>> key_index([3, 1]).get_indexer([1, 7]).tolist()
    [1, -1]

    Cost: O(len(keys)) time and memory, once.
    """
    index = pd.Index(keys, dtype=object if not keys else None, tupleize_cols=False)
    if not index.is_unique:
        raise InvalidArgumentError("a key index needs distinct keys")
    return index


@dataclass(frozen=True)
class KeyArray:
    """A validated batch of keys.

    Attributes
    ----------
    kind : {"int", "long", "string", "binary"}
        ``"int"`` for 8/16/32-bit integers (Spark hashes these as ``int``), ``"long"`` otherwise.
    arrow : pyarrow.Array
        The keys; integers as ``int64``/``int32``, text as ``string``, bytes as ``binary``.
    null_mask : numpy.ndarray or None
        True where the key is null (null policies ``"group"`` and ``"partition0"``; None
        when no key is null).
    """

    kind: KeyKind
    arrow: pa.Array
    null_mask: npt.NDArray[np.bool_] | None

    def __len__(self) -> int:
        return len(self.arrow)

    def ints(self) -> npt.NDArray[np.int64]:
        """The keys as int64 (integer kinds only; nulls read as 0)."""
        return np.asarray(
            self.arrow.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False),
            dtype=np.int64,
        )

    def objects(self) -> npt.NDArray[Any]:
        """The keys as a numpy array of Python objects or int64 (nulls as ``None``; integer
        keys with a null stay exact Python ints, never floats)."""
        if self.kind in ("int", "long"):
            if self.null_mask is None:
                return self.ints()
            out = self.ints().astype(object)
            out[self.null_mask] = None
            return out
        return np.asarray(self.arrow.to_numpy(zero_copy_only=False))


def _arrow_from(keys: Any) -> pa.Array:
    if isinstance(keys, pa.ChunkedArray):
        return keys.combine_chunks()
    if isinstance(keys, pa.Array):
        return keys
    if isinstance(keys, pd.Index):
        keys = keys.to_numpy()
    if isinstance(keys, pd.Series):
        keys = keys.to_numpy()
    if isinstance(keys, np.ndarray):
        if keys.dtype.kind in "iu":
            return pa.array(keys)
        if keys.dtype.kind == "b":
            raise InvalidKeyTypeError(f"boolean keys are not supported; keys must be {_ALLOWED}")
        if keys.dtype.kind in "fc":
            raise InvalidKeyTypeError(
                f"floating-point keys (dtype {keys.dtype}) are not supported; "
                f"cast them to int or str; keys must be {_ALLOWED}"
            )
        keys = keys.tolist()
    elif not isinstance(keys, list):
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
            raise InvalidKeyTypeError(
                f"expected an array-like of keys, got {type(keys).__name__}"
            )
        keys = list(keys)
    try:
        return pa.array(keys)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise InvalidKeyTypeError(
            f"keys must all be of one kind, {_ALLOWED}; integers must fit in 64 bits ({exc})"
        ) from None


def _kind_of(arrow: pa.Array) -> KeyKind:
    t = arrow.type
    if pa.types.is_integer(t):
        if t.bit_width <= 32 and pa.types.is_signed_integer(t):
            return "int"
        return "long"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_null(t):
        return "long"
    raise InvalidKeyTypeError(f"keys of Arrow type {t} are not supported; keys must be {_ALLOWED}")


def to_key_array(keys: Any, null_policy: str = "error") -> KeyArray:
    """Validate and convert an array-like of keys.

    Parameters
    ----------
    keys : list, numpy.ndarray, pandas.Series or pyarrow.Array
        The keys, one kind only.
    null_policy : {"error", "group", "partition0"}
        What a null key means: ``"error"`` (this function's default, for callers that have
        no null key to expect) refuses it; the others keep it (``null_mask``).

    Raises
    ------
    InvalidKeyTypeError
        Mixed or unsupported kinds, or integers beyond 64 bits.
    NullKeyError
        A null key under the ``"error"`` policy.

    Examples
    --------
    >>> to_key_array(["a", "b"]).kind
    'string'
    """
    policy = check_null_policy(null_policy)
    arrow = _arrow_from(keys)
    kind = _kind_of(arrow)
    if pa.types.is_unsigned_integer(arrow.type) and arrow.type.bit_width == 64:
        if len(arrow) and (arrow.null_count < len(arrow)):
            top = pa.compute.max(arrow).as_py()
            if top is not None and not fits_int64(top):
                raise InvalidKeyTypeError("integer keys must fit in a signed 64-bit long")
        arrow = arrow.cast(pa.int64())
    null_mask = None
    if arrow.null_count:
        if policy == "error":
            first = int(np.argmax(np.asarray(arrow.is_null())))
            raise null_key_error(
                f"{arrow.null_count} null key(s) (the first at position {first})")
        null_mask = np.asarray(arrow.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return KeyArray(kind=kind, arrow=arrow, null_mask=null_mask)


def to_counts(
    keys_or_counts: Any, null_policy: str = "error"
) -> tuple[KeyArray, npt.NDArray[np.float64], bool]:
    """Distinct keys (first-appearance order) with their record counts.

    Accepts a ``{key: count}`` mapping, a sequence of keys (one entry per record), or a pandas
    Series of counts indexed by key. Counts must be finite and non-negative.

    Returns
    -------
    (keys, counts, from_mapping)
        ``from_mapping`` is False when the input was a record sequence.
    """
    from_mapping = isinstance(keys_or_counts, Mapping)
    if from_mapping:
        key_list = list(keys_or_counts.keys())
        try:
            counts = np.asarray(list(keys_or_counts.values()), dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise InvalidArgumentError(
                "counts must be finite, non-negative numbers that fit a double"
            ) from None
        karr = to_key_array(key_list, null_policy)
    else:
        karr = to_key_array(keys_or_counts, null_policy)
        codes, uniques = pd.factorize(karr.objects())
        valid = codes >= 0
        counts = np.bincount(codes[valid], minlength=len(uniques)).astype(np.float64)
        distinct = pa.array(uniques, type=karr.arrow.type)
        n_null = int(codes.size - np.count_nonzero(valid))
        if n_null:
            distinct = pa.concat_arrays([distinct, pa.nulls(1, type=karr.arrow.type)])
            counts = np.append(counts, float(n_null))
        karr = to_key_array(distinct, null_policy)
    if counts.size and (not np.all(np.isfinite(counts)) or counts.min() < 0):
        raise InvalidArgumentError("counts must be finite and non-negative")
    return karr, counts, from_mapping
