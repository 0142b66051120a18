"""Durable keyed state: what a partition keeps between micro-batches, and how it is kept.

- :mod:`.codec`: a partition's state as an Arrow table, one row per key (no pickle);
- :mod:`.manifest`: the manifest protocol (one writer, the version a batch starts from, the
  commit);
- :mod:`.snapshot_writer`: snapshots written beside the batches, from a checkpoint of the
  local copy;
- :mod:`.local_sync`: the executor-local copy (RocksDB) kept in step with the state path.

Above :mod:`..semantics`, below every other room.
"""
