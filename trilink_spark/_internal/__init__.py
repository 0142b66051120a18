"""Internal building blocks of trilink-spark, shared by every layer; not a public API.

- :mod:`.validation`: the one module of argument checks (counts, numbers, durations,
  interval strings);
- :mod:`.spark`: the Spark glue (Connect/classic compatibility, the session, plan reading);
- :mod:`.io`: files on any ``pyarrow.fs`` filesystem and the checksummed Arrow IPC format;
- :mod:`.urls`: connection URLs with their passwords redacted;
- :mod:`.optiming`: per-operator timings that tasks write and the driver reads;
- :mod:`.deprecation`: the warning a moved name gives at its old place.

Names here may change in any release; the public homes are the subpackages' ``__all__``.
"""
