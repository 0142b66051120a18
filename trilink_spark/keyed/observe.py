"""What a keyed stream's committed state says about it: task timings, counters, values.

The bodies of :meth:`~trilink_spark.KeyedBatchFunction.task_timings`,
:meth:`~trilink_spark.KeyedBatchFunction.counters` and
:meth:`~trilink_spark.KeyedBatchFunction.state_values`; each reads the state files of a
committed version (no Spark job).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..state.store import KeyedStateStore
from .snapshot import decode_state, read_counters

__all__ = ["read_task_timings", "sum_counters", "read_state_values"]


def read_task_timings(store: KeyedStateStore, version: int | None = None) -> Any:
    """What each task of a committed batch measured of its own work.

    Parameters
    ----------
    store : KeyedStateStore
    version : int, optional
        A committed batch (the newest by default).

    Returns
    -------
    pandas.DataFrame
        Columns ``partition``, ``rows``, ``process_ms``, ``blocks``
        (:meth:`~trilink_spark.KeyedBatchFunction.task_timings`).

    Raises
    ------
    InvalidArgumentTypeError
        ``version`` is not an int.
    InvalidArgumentError
        ``version`` is not a committed batch (the committed ones are named).
    """
    import pandas as pd

    if version is not None and (isinstance(version, bool)
                                or not isinstance(version, (int, np.integer))):
        raise InvalidArgumentTypeError(
            f"version must be an int (a committed batch id) or None, got "
            f"{type(version).__name__}")
    manifest = store.read_manifest() or {}
    committed = [int(c) for c in manifest.get("committed") or []]
    if version is not None and int(version) not in committed:
        raise InvalidArgumentError(
            f"batch {version} is not a committed version of {store.path}; the "
            f"committed ones are {committed}")
    if not committed:
        return pd.DataFrame({"partition": [], "rows": [], "process_ms": [], "blocks": []})
    at, partitions = store.committed_layout(None if version is None else int(version))
    rows = []
    for p in range(partitions):
        t = store.timing(p, at)
        if t is None:
            rows.append((p, -1, -1.0, -1))
            continue
        per_block = t.get("block_rows")
        rows.append((p, int(t["rows"]), float(t["process_ms"]),
                     -1 if per_block is None else len(per_block["blocks"])))
    return pd.DataFrame(rows, columns=["partition", "rows", "process_ms", "blocks"])


def sum_counters(store: KeyedStateStore) -> dict[str, int]:
    """Rows, late rows (key watermark) and late rows by the partition watermark, summed
    over the partitions' latest committed state (zeros before the first commit).
    O(partitions) state reads."""
    total = {"rows": 0, "late": 0, "late_partition": 0}
    if not (store.read_manifest() or {}).get("committed"):
        return total
    version, partitions = store.committed_layout()
    for p in range(partitions):
        found = read_counters(store.load_table(p, version), store.version_path(p, version))
        for name in total:
            total[name] += found.get(name, 0)
    return total


def read_state_values(store: KeyedStateStore, version: int | None = None
                 ) -> dict[Any, dict[str, Any]]:
    """Every key's stored values in the newest (or a given) committed version:
    ``{key: {name: value}}`` (:meth:`~trilink_spark.KeyedBatchFunction.state_values`).

    Raises
    ------
    StateCorruptError
        A key is stored in two partitions, or a file is missing or corrupt.
    """
    owners = store.owners(version)
    manifest = store.read_manifest() or {}
    at = int(manifest["committed"][-1]) if version is None else version
    out: dict[Any, dict[str, Any]] = {}
    for p in sorted(set(owners.values())):
        where = store.version_path(p, at)
        out.update(decode_state(store.load_table(p, at), where).values)
    return out
