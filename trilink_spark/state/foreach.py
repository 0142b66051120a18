"""The base of the ``foreachBatch`` callables whose tasks keep state in a
:class:`~trilink_spark.state.KeyedStateStore`: after the user's function, every partition
must have written the batch's version (:meth:`StatefulBatchFunction._ensure_written`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import StateStoreError
from .store import KeyedStateStore

__all__ = ["StatefulBatchFunction"]

logger = logging.getLogger(__name__)


class StatefulBatchFunction:
    """Base of the ``foreachBatch`` callables whose tasks keep state in a KeyedStateStore."""

    def __init__(self, func: Callable[[Any, int], Any], store: KeyedStateStore,
                 options: dict[str, Any]) -> None:
        self.func = func
        self.store = store
        self.options = options

    def _ensure_written(self, out: Any, batch_id: int, partitions: int,
                        fill: Callable[[int], None] | None = None,
                        snapshots: bool = False) -> list[list[int]]:
        """After ``func``: make sure every partition wrote state ``batch_id``, computing ``out``
        once more (to a no-op sink) if ``func`` did not. A partition no task ran for (an empty
        micro-batch) is written by ``fill(partition)``; without ``fill`` it is an error.
        Returns each partition's versions. ``snapshots``: only a snapshot counts (the tasks
        of this batch write whole versions: a changelog is an earlier attempt's)."""
        def listing() -> list[list[int]]:  # one listing each
            found = [self.store.listing(p) for p in range(partitions)]
            return [sorted(s if snapshots else s | logs) for s, logs in found]

        listed = listing()
        if not all(batch_id in versions for versions in listed):
            logger.info("batch %d: output not computed by func; computing it for the state",
                        batch_id)
            out.write.format("noop").mode("overwrite").save()
            listed = listing()
        missing = [p for p, versions in enumerate(listed) if batch_id not in versions]
        if missing:
            if fill is None:
                raise StateStoreError(
                    f"partitions {missing[:10]} wrote no state version {batch_id} under "
                    f"{self.store.path}")
            for p in missing:
                fill(p)
                listed[p].append(batch_id)
        return listed

    def _complete(self, out: Any, batch_id: int, partitions: int) -> None:
        """:meth:`_ensure_written`, then prune old versions."""
        listed = self._ensure_written(out, batch_id, partitions)
        self.store.prune(partitions, batch_id, listed=listed)
