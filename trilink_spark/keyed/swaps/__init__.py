"""Placement and its changes at a micro-batch barrier.

- :mod:`.plan`: swap requests, plans by keys, and the segments that move;
- :mod:`.block_plan`: plans between block tables, cut by range scan of the local copies;
- :mod:`.replanner`: the one owner of a batch's placement decision (the first placement, a
  replay, a restart, a requested swap, the adaptive switcher, the rebalancer).

Above :mod:`..durable`, below :mod:`..records` and :mod:`..run`.
"""
