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

from collections.abc import Iterable, Sequence
from typing import Any

from .errors import InvalidArgumentTypeError, MissingColumnError

__all__ = [
    "INTERNAL_PREFIX",
    "PARTITION_COL",
    "EVENT_TIME_COL",
    "POS_COL",
    "ET_COL",
    "SLOT_COL",
    "ORDER_COL",
    "PUNCT_COL",
    "GROUP_COL",
    "ARG_COL",
    "TABLE_KEY_COL",
    "TABLE_PID_COL",
    "CONST_TIME_COL",
    "require_columns",
]

#: Prefix of every internal column name.
INTERNAL_PREFIX = "_tl_"
#: Column added by :func:`~trilink_spark.key_by`: the partition id of the row.
PARTITION_COL = "_tl_partition"
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
#: Key-group column of keyed watermarks with ``n_keys > 1``.
GROUP_COL = "_tl_group"
#: Prefix of aggregate argument columns of per-partition keyed aggregation.
ARG_COL = "_tl_arg"
#: Key and partition columns of a table strategy's broadcast table.
TABLE_KEY_COL = "_tl_table_key"
TABLE_PID_COL = "_tl_table_pid"
#: The constant event time of Global Merge without an event-time column.
CONST_TIME_COL = "_tl_gm_time"


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
