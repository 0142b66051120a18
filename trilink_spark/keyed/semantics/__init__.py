"""Event-time semantics, with no I/O and no Spark: what a keyed processor means.

- :mod:`.keys`: the runtime's key identities (the null key, the NaN key) and one partition's
  plain state;
- :mod:`.timers`: the ordered timer service;
- :mod:`.process`: the process-function contract and the one runtime that drives it (the
  lateness rule, the idle rule, TTL);
- :mod:`.windows`: the keyed window aggregate built on that contract.

The bottom room of :mod:`trilink_spark.keyed`: it imports nothing of the other rooms.
"""
