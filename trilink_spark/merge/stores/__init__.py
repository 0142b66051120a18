"""Global Merge and its stores: partial results merged into one global result, exactly once.

- :mod:`.global_merge`: ``global_merge`` and ``explain_global_merge`` (the driver-embedded
  store, or a store of the user's);
- :mod:`.redis_store`: ``RedisStore``, versioned per batch in Redis.

The top room of :mod:`trilink_spark.merge`.
"""
