"""A running count that is slow for some keys: the rebalancer tests' skew of time, not rows."""

from __future__ import annotations

import sys
import time
from typing import Any

from pyspark import cloudpickle

from conftest import RunningCount

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the executors have no tests/

#: Milliseconds a slow key's row costs.
SLOW_MS_PER_ROW = 1.0


class SlowCount(RunningCount):
    """A running count that costs ``SLOW_MS_PER_ROW`` per row for the ``slow`` keys."""

    def __init__(self, slow: frozenset[str]) -> None:
        super().__init__()
        self.slow = slow

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        if key in self.slow:
            time.sleep(SLOW_MS_PER_ROW / 1000.0 * len(rows))
        return super().process_on_time(key, rows, ctx)

    def state_config(self) -> dict[str, Any]:
        return {"slow": sorted(self.slow)}
