"""What a keyed run leaves behind for its readers: the per-batch history record and the
committed-state reader (``read_state``, ``state_summary``, task timings).

Above :mod:`..swaps` (a reader binds the stored placement), below :mod:`..run`.
"""
