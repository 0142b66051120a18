"""The runners: where Spark comes in.

- :mod:`.prepare`: arguments and arrival order of a keyed run;
- :mod:`.watermark`: ``keyed_watermark``, per-key watermarks as a DataFrame transform;
- :mod:`.window_plan`: the Spark (JVM) plan of a keyed window aggregate;
- :mod:`.task`: one partition's task and its state I/O;
- :mod:`.bounded`: ``keyed_process`` on a bounded frame;
- :mod:`.streaming`: ``keyed_foreach_batch`` and its ``KeyedBatchFunction``.

The top room of :mod:`trilink_spark.keyed`.
"""
