"""Internal column names, and the one check that a column is in a DataFrame.

Every column the library adds to a user's rows is named here, with the ``_tl_`` prefix. Only
:data:`PARTITION_COL` (added by :func:`~trilink_spark.key_by`) and :data:`EVENT_TIME_COL` (seen
by keyed process hooks) reach user code; the others live inside one call.

Examples
--------
>>> from trilink_spark.columns import PARTITION_COL, INTERNAL_PREFIX
>>> PARTITION_COL.startswith(INTERNAL_PREFIX)
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._internal.validation import MAX_PARTITIONS
from .errors import InvalidArgumentTypeError, InvalidKeyTypeError, MissingColumnError
from .errors import ReservedColumnError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "ColumnCache",
    "python_input_columns",
    "INTERNAL_PREFIX",
    "PARTITION_COL",
    "EVENT_TIME_COL",
    "POS_COL",
    "ET_COL",
    "SLOT_COL",
    "ORDER_COL",
    "PUNCT_COL",
    "GROUP_COL",
    "WATERMARK_COL",
    "ARG_COL",
    "TABLE_KEY_COL",
    "TABLE_PID_COL",
    "CONST_TIME_COL",
    "NUM_PARTITIONS_META",
    "COMPACTED_META",
    "SLOT_ID_COL",
    "SLOT_PID_COL",
    "SCORE_KEY_COL",
    "SCORE_ROWS_COL",
    "SCORE_PART_COL",
    "SCORE_PID_COL",
    "strategy_partitions",
    "require_columns",
    "check_user_columns",
    "check_atomic_key",
    "quoted",
    "column_of",
    "python_aliases",
    "python_input",
]

#: Prefix of every internal column name.
INTERNAL_PREFIX = "_tl_"
#: Column added by :func:`~trilink_spark.key_by`: the partition id of the row.
PARTITION_COL = "_tl_partition"
#: Key of :data:`PARTITION_COL`'s column metadata: the strategy's partition count.
NUM_PARTITIONS_META = "trilink.num_partitions"
#: Key of :data:`PARTITION_COL`'s column metadata: ``True`` when ``key_by`` compacted the frame.
COMPACTED_META = "trilink.compacted"
#: Column holding each row's event time in internal units, in the frames keyed hooks receive.
EVENT_TIME_COL = "_tl_event_time"
#: Arrival position of a row within its input (``monotonically_increasing_id``).
POS_COL = "_tl_pos"
#: Event time in internal units, inside Local Merge.
ET_COL = "_tl_et"
#: Start of a row's time slot, inside Local Merge.
SLOT_COL = "_tl_slot"
#: The user's arrival-order column, copied, inside Local Merge.
ORDER_COL = "_tl_order"
#: The punctuation flag, inside Local Merge.
PUNCT_COL = "_tl_punct"
#: A row's key watermark in internal units, inside keyed watermarks and bounded keyed windows.
WATERMARK_COL = "_tl_watermark"
#: Key-group column of keyed watermarks with ``n_keys > 1``.
GROUP_COL = "_tl_group"
#: Prefix of aggregate argument columns of per-partition keyed aggregation.
ARG_COL = "_tl_arg"
#: Key and partition columns of a table strategy's broadcast table.
TABLE_KEY_COL = "_tl_table_key"
TABLE_PID_COL = "_tl_table_pid"
#: A compacting ``key_by``'s dense slot, and the partition id of its slot table.
SLOT_ID_COL = "_tl_slot_id"
SLOT_PID_COL = "_tl_slot_partition"
#: The constant event time of Global Merge without an event-time column.
CONST_TIME_COL = "_tl_gm_time"
#: ``trilink-spark balance``'s counts on the executors: a key, its rows, which score a row
#: belongs to, and a partition id.
SCORE_KEY_COL = "_tl_score_key"
SCORE_ROWS_COL = "_tl_score_rows"
SCORE_PART_COL = "_tl_score_part"
SCORE_PID_COL = "_tl_score_pid"


def require_columns(df: Any, columns: Iterable[Any], role: str = "column") -> None:
    """Raise unless every name in ``columns`` is a column of ``df``.

    Parameters
    ----------
    df : pyspark.sql.DataFrame, pandas.DataFrame or pyspark.sql.types.StructType
        Anything with a ``columns`` attribute, or a schema (its ``names``).
    columns : iterable of str
        Names to check; ``None`` entries are skipped.
    role : str
        What the columns are for, named in the message ("key column", "order_by column" ...).

    Raises
    ------
    InvalidArgumentTypeError
        A name that is not a str.
    MissingColumnError
        A name that is not a column; the message lists the columns there are.

    Notes
    -----
    O(columns of ``df``).

    Examples
    --------
    >>> import pandas as pd
    >>> require_columns(pd.DataFrame({"a": [1]}), ["a"])
    >>> require_columns(pd.DataFrame({"a": [1]}), ["b"], "key column")
    Traceback (most recent call last):
    ...
    trilink_spark.errors.MissingColumnError: key column 'b' is not in the DataFrame; its columns are ['a']
    """
    if not hasattr(df, "columns") and not hasattr(df, "names"):
        raise InvalidArgumentTypeError(f"expected a DataFrame, got {type(df).__name__}")
    if isinstance(columns, str):
        columns = [columns]
    have: Sequence[str] = list(df.columns if hasattr(df, "columns") else df.names)
    for name in columns:
        if name is None:
            continue
        if not isinstance(name, str):
            raise InvalidArgumentTypeError(
                f"{role} must be a column name (str), got {type(name).__name__}"
            )
        if name not in have:
            raise MissingColumnError(
                f"{role} {name!r} is not in the DataFrame; its columns are {list(have)}"
            )


def check_user_columns(df: Any, names: Iterable[str] = ()) -> None:
    """Refuse user columns (and output names) that would collide with internal ones.

    Every column whose name starts with :data:`INTERNAL_PREFIX` (``_tl_``) is reserved: a user
    column of that name would be silently replaced or make a reference ambiguous. ``names``
    are further names the caller will create (aggregate outputs), checked the same way.

    Raises
    ------
    ReservedColumnError
        Naming the first such column and how to fix it.

    Notes
    -----
    O(columns of ``df``).

    Examples
    --------
    >>> import pandas as pd
    >>> check_user_columns(pd.DataFrame({"a": [1]}))
    >>> check_user_columns(pd.DataFrame({"_tl_partition": [1]}))
    Traceback (most recent call last):
    ...
    trilink_spark.errors.ReservedColumnError: column '_tl_partition' uses the prefix '_tl_' that trilink-spark reserves for its internal columns; rename it first (df.withColumnRenamed)
    """
    if not hasattr(df, "columns") and not hasattr(df, "names"):
        raise InvalidArgumentTypeError(f"expected a DataFrame, got {type(df).__name__}")
    if isinstance(names, str):
        names = [names]
    have: Sequence[str] = list(df.columns if hasattr(df, "columns") else df.names)
    for name in [*have, *names]:
        if isinstance(name, str) and name.startswith(INTERNAL_PREFIX):
            raise ReservedColumnError(
                f"column {name!r} uses the prefix {INTERNAL_PREFIX!r} that trilink-spark "
                "reserves for its internal columns; rename it first (df.withColumnRenamed)"
            )


def check_atomic_key(df: Any, key: str) -> None:
    """Refuse a key column of a nested type (struct, array, map) where keys are grouped in
    Python: such values are not hashable there.

    Raises :class:`~trilink_spark.errors.InvalidKeyTypeError` naming the column and its type. O(1).
    """
    from pyspark.sql import types as T

    dtype = df.schema[key].dataType
    if isinstance(dtype, (T.StructType, T.ArrayType, T.MapType)):
        raise InvalidKeyTypeError(
            f"key column {key!r} is {dtype.simpleString()}; keyed processing groups keys in "
            "Python and needs an atomic key (number, string, binary, timestamp): derive one, "
            "e.g. with F.to_json or F.xxhash64"
        )


def strategy_partitions(df: Any, *, compacted: bool = False) -> int | None:
    """The partition count of the strategy that placed ``df``, as recorded in the metadata
    of its :data:`PARTITION_COL` by :func:`~trilink_spark.key_by`; ``None`` without that
    column or record, or with one no ``key_by`` writes (a column that is not an int, a count
    outside ``1 ..`` :data:`~trilink_spark._internal.validation.MAX_PARTITIONS`). With
    ``compacted=True``, only for a frame ``key_by`` compacted (:data:`COMPACTED_META`). O(columns),
    no Spark job.

    Examples
    --------
    >>> strategy_partitions(object()) is None
    True
    """
    schema = getattr(df, "schema", None)
    if schema is None or PARTITION_COL not in getattr(schema, "names", ()):
        return None
    column = schema[PARTITION_COL]
    metadata = getattr(column, "metadata", None) or {}
    if type(column.dataType).__name__ != "IntegerType":
        return None
    if compacted and metadata.get(COMPACTED_META) is not True:
        return None
    value = metadata.get(NUM_PARTITIONS_META)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
        return None
    return int(value)


def quoted(name: str) -> str:
    """``name`` as a Spark identifier in backticks (``a.b`` is one column, not a field). O(len).

    Examples
    --------
    >>> quoted("a.b`c")
    '`a.b``c`'
    """
    return "`" + name.replace("`", "``") + "`"


def column_of(name: str) -> Column:
    """The Spark column named ``name`` exactly (dots, spaces, backticks and all)."""
    from pyspark.sql import functions as F

    return F.col(quoted(name))


class ColumnCache:
    """Spark columns by exact name (:func:`column_of`), each built once.

    A column expression is not bound to a frame: a stream builds its columns once and uses
    them on every micro-batch, where each :func:`column_of` costs Py4J round trips on a
    classic session. O(1) per lookup; holds one expression per name asked for.

    Examples
    --------
    >>> cols = ColumnCache()
    >>> cols("a.b") is cols("a.b")  # doctest: +SKIP
    True
    """

    def __init__(self) -> None:
        self._built: dict[str, Column] = {}

    def __call__(self, name: str) -> Column:
        built = self._built.get(name)
        if built is None:
            built = self._built[name] = column_of(name)
        return built


def python_aliases(names: Iterable[str]) -> dict[str, str]:
    """``{internal alias: name}`` for each of ``names`` that PySpark cannot pass to Python.

    PySpark's Python operators (``mapInArrow``, ``mapInPandas``, ``groupBy().applyInPandas``
    ...) read every input column as ``df[name]``, which parses the name: one with a dot or a
    backtick fails there. Such a column travels under the alias ``_tl_col<i>`` (``i``: its
    position in ``names``) and is renamed back inside the task. Names without a dot or a
    backtick are left out. O(names).

    Examples
    --------
    >>> python_aliases(["user.id", "amount eur", "t`s"])
    {'_tl_col0': 'user.id', '_tl_col2': 't`s'}
    """
    return {f"{INTERNAL_PREFIX}col{i}": name for i, name in enumerate(names)
            if "." in name or "`" in name}


def python_input(df: DataFrame, col: Callable[[str], Column] = column_of
                 ) -> tuple[DataFrame, dict[str, str]]:
    """``df`` ready to be the input of a PySpark Python operator, and ``{alias: name}``.

    The columns :func:`python_aliases` names are renamed to their aliases (a projection; the
    others keep their column, so the frame's partitioning stays usable); ``df`` itself when
    there are none. Inside the task, rename back with
    ``table.rename_columns([aliases.get(n, n) for n in table.column_names])`` (Arrow) or
    ``frame.rename(columns=aliases)`` (pandas). O(columns), no job.
    """
    columns, aliases = python_input_columns(df.columns, col)
    if not aliases:
        return df, aliases
    renamed: DataFrame = df.select(*columns)
    return renamed, aliases


def python_input_columns(names: Sequence[str], col: Callable[[str], Column] = column_of
                         ) -> tuple[list[Column], dict[str, str]]:
    """The projection :func:`python_input` applies to a frame of the columns ``names`` (each
    renamed to its alias, or kept), and ``{alias: name}``. O(names), no Spark call."""
    aliases = python_aliases(names)
    inside = {name: alias for alias, name in aliases.items()}
    return [col(c).alias(inside[c]) if c in inside else col(c) for c in names], aliases
