"""Oracle checks of keyed state across swaps: every key stored once, with its exact count.

For runs whose processor keeps a running count per key in the state column ``n``
(``conftest.RunningCount``).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from trilink_spark.keyed import KeyedBatchFunction


def _is_null(key: Any) -> bool:
    """Whether a stored key is the null key (None, or NaN for a double key)."""
    return key is None or (isinstance(key, float) and math.isnan(key))


def stored_counts(run: KeyedBatchFunction, version: int | None = None, *,
                  null_key: Any = None) -> dict[Any, int]:
    """Every key's stored count in the newest (or a given) committed version
    (``state_values`` refuses a key found in two partitions).

    ``null_key``: the label the oracle gives the null key (e.g. ``"<null>"``, as
    ``pd.Series.fillna`` writes it); the stored null key (None or NaN) is then named by it, and
    no two stored keys may share a label. Default: keys as stored.
    """
    values = run.state_values(version)
    if null_key is None:
        return {key: int(v["n"]) for key, v in values.items()}
    counts = {(null_key if _is_null(key) else key): int(v["n"]) for key, v in values.items()}
    assert len(counts) == len(values), f"two stored keys are labelled {null_key!r}"
    return counts


def check_invariants(run: KeyedBatchFunction, oracle: pd.Series,
                     version: int | None = None, *, null_key: Any = None) -> None:
    """Every stored key in exactly one partition, with its exact count: the oracle's
    (``{key: count}``, the null key labelled ``null_key``), no key more or less."""
    counts = stored_counts(run, version, null_key=null_key)
    assert counts == {k: int(v) for k, v in oracle.items()}


def die_after_writing(out: Any, batch_id: int) -> None:
    """A ``foreachBatch`` sink whose driver dies after the batch's tasks wrote their state and
    before the commit: it computes ``out`` (to a no-op sink), then raises ``RuntimeError``
    ("driver died")."""
    out.write.format("noop").mode("overwrite").save()  # the tasks ran and wrote state
    raise RuntimeError("driver died")


def dies_at(batch_id: int) -> Any:
    """A sink that counts its batch, except batch ``batch_id``, after whose tasks wrote their
    state the driver dies (:func:`die_after_writing`)."""
    def sink(out: Any, b: int) -> None:
        if b == batch_id:
            die_after_writing(out, b)
        out.count()
    return sink
