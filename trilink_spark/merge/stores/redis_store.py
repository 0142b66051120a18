"""A Redis global store for Global Merge, applying each delta exactly once, all or nothing.

Layout under ``prefix``: one hash per key, ``{prefix}:k:{token}``, whose fields are the partial
columns of the aggregates (see :mod:`~trilink_spark.merge.algebra.aggregates`) plus a version ``__v``; the
set ``{prefix}:keys`` of every key token; the set ``{prefix}:applied`` of applied delta
markers; ``{prefix}:meta`` (key, aggregates, and the exact types of the key, the partial
columns and the result).

Keys and values are stored exactly, by their Spark type: a key token is ``n`` for null or ``v``
followed by the value's exact text (integers and decimals in full, doubles in their shortest
round-trip form, ``nan`` and ``inf`` included, strings as UTF-8, binary as the bytes, booleans
``true``/``false``, timestamps as microseconds, dates as days); ``-0.0`` is stored as ``0.0``,
as Spark's ``groupBy`` groups them. Nothing stored is ever unpickled or evaluated.

A flush whose aggregates all merge by exact 64-bit addition (``count``: every partial column a
bigint, no null in the flush) is applied in one round trip: one script checks the marker and
that no addition can leave 64 bits, then adds with ``HINCRBY`` (exact in Redis), bumps the
versions and writes the marker; when a stored value is near the 64-bit limit (or not an
integer) it writes nothing and the flush takes the general path below, where the exact merge
in Python decides. :meth:`RedisStore.apply_flushes` sends many flushes (a micro-batch's, from
the driver) in that one script, their deltas added up per key on the client, with every
flush's marker and the metadata: the script applies them all when none of the markers is
known, skips them when all are, and otherwise writes nothing and the client sends them one by
one, so each flush is still applied exactly once.

Every other flush of a partition is applied in two phases: one pipelined read of the flush's key
hashes (and of its marker ``batch:partition:flush``), the merge of the stored partials with the
flush's deltas in Python by the aggregate algebra (exactly what the driver store does: Spark's
types, exact 64-bit sums, NaN and infinities as Spark treats them), then one ``EVALSHA`` that
writes every new value, the marker included, only if the marker is still new and no key's
version changed since the read; else it writes nothing (a changed version means another flush
got there first: the flush is read and merged again). A flush therefore applies wholly or not
at all, and a retried task or a replayed batch id never counts twice. A merge that fails (an
integral sum beyond 64 bits) writes nothing. With ``updated_field``, every key a flush touches
also gets the commit time (ms) in that field. Standalone Redis (the script touches keys it
computes).
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from ...errors import InvalidArgumentError, InvalidArgumentTypeError, StoreUnavailableError
from ..._internal.spark.compat import frame_of_arrow
from ..._internal.urls import redact, scrub
from ..algebra.aggregates import RedisOp
from ..algebra.expressions import AggSpec, specs_for_partials
from ..algebra.partials import finalize_frame, merge_partial_frames
from ..engines.pandas_engine import arrow_to_pandas, to_arrow

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["RedisStore", "lean_client"]

#: Shared head of both scripts: ARGV[1] prefix, ARGV[2] the field that receives the commit
#: time ('' for none), ARGV[3] that time, ARGV[4] nf, the nf field names, then nm and nm
#: (field, value) pairs written to the meta hash (KEYS[3]). ``at`` is the next ARGV index.
_HEAD_LUA = """
local prefix = ARGV[1]
local updated = ARGV[2]
local now = ARGV[3]
local nf = tonumber(ARGV[4])
local fields = {}
for j = 1, nf do fields[j] = ARGV[4 + j] end
local nm = tonumber(ARGV[5 + nf])
local meta_at = 5 + nf
local at = 6 + nf + 2 * nm
local function write_meta()
  for m = 1, nm do
    redis.call('HSET', KEYS[3], ARGV[meta_at + 2 * m - 1], ARGV[meta_at + 2 * m])
  end
end
"""

#: Commit of flushes merged in Python (KEYS: applied, keys, meta; ARGV: the head, then the
#: count of markers and the markers, the count of keys and per key its token, the version
#: read and nf values, each ``v`` + text or ``n`` for null). Writes nothing and returns -1
#: unless every marker is new and every version is as read; else writes every value, bumps
#: the versions, adds the markers and returns their count.
_COMMIT_LUA = _HEAD_LUA + """
local nk = tonumber(ARGV[at])
for i = 1, nk do
  if redis.call('SISMEMBER', KEYS[1], ARGV[at + i]) == 1 then return -1 end
end
local kat = at + nk + 1
local n = tonumber(ARGV[kat])
local stride = nf + 2
for i = 0, n - 1 do
  local base = kat + i * stride
  local cur = redis.call('HGET', prefix .. ':k:' .. ARGV[base + 1], '__v') or ''
  if cur ~= ARGV[base + 2] then return -1 end
end
for i = 0, n - 1 do
  local base = kat + i * stride
  local token = ARGV[base + 1]
  local h = prefix .. ':k:' .. token
  for j = 1, nf do
    local v = ARGV[base + 2 + j]
    if string.sub(v, 1, 1) == 'v' then
      redis.call('HSET', h, fields[j], string.sub(v, 2))
    else
      redis.call('HDEL', h, fields[j])
    end
  end
  redis.call('HSET', h, '__v', tostring((tonumber(ARGV[base + 2]) or 0) + 1))
  if updated ~= '' then redis.call('HSET', h, updated, now) end
  redis.call('SADD', KEYS[2], token)
end
for i = 1, nk do redis.call('SADD', KEYS[1], ARGV[at + i]) end
write_meta()
return nk
"""

#: One-trip commit of flushes whose partials all add as 64-bit integers (KEYS: applied, keys,
#: meta; ARGV: the head, then the count of groups and per group its count of markers, the
#: markers, its count of keys and per key its token and nf integer deltas). A group is one
#: flush, or several flushes whose deltas the client added up (one row per key): it applies
#: wholly when none of its markers is known and is skipped when all are; when only some are,
#: the script writes nothing and returns -3 (the client sends those flushes one by one). It
#: returns -2, writing nothing, when a sum could leave 64 bits or a stored value is not an
#: integer (the client then merges in Python); else the count of markers applied.
_ADD_LUA = _HEAD_LUA + """
local ngroups = tonumber(ARGV[at])
local limit = 4611686018427387904
local groups = {}
local totals = {}
local pos = at + 1
for g = 1, ngroups do
  local nm = tonumber(ARGV[pos])
  local known = 0
  for i = 1, nm do
    if redis.call('SISMEMBER', KEYS[1], ARGV[pos + i]) == 1 then known = known + 1 end
  end
  if known > 0 and known < nm then return -3 end
  local rows = pos + nm + 1
  local n = tonumber(ARGV[rows])
  groups[g] = {pos, nm, rows, n, known == 0}
  if known == 0 then
    for i = 0, n - 1 do
      local base = rows + 1 + i * (nf + 1)
      local h = prefix .. ':k:' .. ARGV[base]
      local seen = totals[h]
      if seen == nil then seen = {}; totals[h] = seen end
      for j = 1, nf do
        local total = seen[j]
        if total == nil then
          local cur = redis.call('HGET', h, fields[j])
          total = 0
          if cur then
            if not string.match(cur, '^%-?%d+$') then return -2 end
            total = math.abs(tonumber(cur))
          end
        end
        total = total + math.abs(tonumber(ARGV[base + j]))
        if total >= limit then return -2 end
        seen[j] = total
      end
    end
  end
  pos = rows + 1 + n * (nf + 1)
end
local applied = 0
for g = 1, ngroups do
  local p, nm, rows, n, fresh = unpack(groups[g])
  if fresh then
    for i = 0, n - 1 do
      local base = rows + 1 + i * (nf + 1)
      local token = ARGV[base]
      local h = prefix .. ':k:' .. token
      for j = 1, nf do
        redis.call('HINCRBY', h, fields[j], ARGV[base + j])
      end
      redis.call('HINCRBY', h, '__v', 1)
      if updated ~= '' then redis.call('HSET', h, updated, now) end
      redis.call('SADD', KEYS[2], token)
    end
    for i = 1, nm do redis.call('SADD', KEYS[1], ARGV[p + i]) end
    applied = applied + nm
  end
end
write_meta()
return applied
"""

#: Commit attempts of one flush before contention is reported (each re-reads and re-merges).
_MAX_TRIES = 200
_TOKEN = "__token"
_VERSION = b"__v"
#: Deltas at or beyond this magnitude take the general path (the Python merge checks them).
_ADD_LIMIT = 2**62
#: Values (keys x (fields + 1)) of the flushes one script of :meth:`RedisStore.apply_flushes`
#: carries at most; more flushes take more scripts (a flush is never split).
_CHUNK_VALUES = 250_000

#: Redis clients of this process, by URL and socket timeout (Spark reuses its Python workers,
#: so a task reuses the connection of the previous task instead of opening one per batch).
_clients: dict[tuple[str, float], Any] = {}
#: Scripts this process has run on each server (by client key and SHA1): EVALSHA for them,
#: EVAL with the body otherwise (one round trip either way; NOSCRIPT costs one more).
_loaded: set[tuple[tuple[str, float], str]] = set()
_clients_lock = threading.Lock()


def _sha(body: str) -> str:
    return hashlib.sha1(body.encode()).hexdigest()


_COMMIT_SHA, _ADD_SHA = _sha(_COMMIT_LUA), _sha(_ADD_LUA)


_one_write: list[Any] = []


def _one_write_connection() -> Any:
    """redis-py's TCP connection, sending each command (and each pipeline) in ONE write.

    redis-py cuts a request larger than 6,000 bytes into several writes, and Redis then
    reads (and counts) each piece as it arrives; a script carrying a batch's flushes is
    sent whole instead. Only public methods of the connection are used (``pack_command``,
    ``pack_commands``, ``send_packed_command``). Cost: one copy of the request."""
    if not _one_write:
        from redis.connection import Connection

        class OneWriteConnection(Connection):  # type: ignore[misc]
            def send_command(self, *args: Any, **kwargs: Any) -> None:
                packed: list[bytes] = self.pack_command(*args)  # type: ignore[no-untyped-call]
                self.send_packed_command(  # type: ignore[no-untyped-call]
                    [b"".join(packed)], check_health=kwargs.get("check_health", True))

            def pack_commands(self, commands: Any) -> list[bytes]:
                packed: list[bytes] = super().pack_commands(  # type: ignore[no-untyped-call]
                    commands)
                return [b"".join(packed)]

        _one_write.append(OneWriteConnection)
    return _one_write[0]


def _scheme_of(url: object) -> str:
    """What an error may say of a refused URL: its scheme only (text without ``://`` may be
    a password pasted in the wrong place, so none of it is quoted)."""
    if isinstance(url, str) and "://" in url:
        return f"a {url.split('://', 1)[0][:20]!r}:// URL"
    return f"a {type(url).__name__} without a scheme"


def _check_seconds(value: object, name: str) -> None:
    """Refuse a timeout that is not a positive finite number of seconds (InvalidArgumentError
    naming ``name``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 < value < float("inf"):
        raise InvalidArgumentError(f"{name} must be a positive number of seconds, got {value!r}")


def lean_client(url: str, timeout: float = 5.0) -> Any:
    """A new ``redis.Redis`` for ``url`` as :class:`RedisStore` makes its own: RESP2, no
    ``CLIENT SETINFO`` or ``HELLO`` on connect, and over TCP each request (a pipeline too) in
    one write, so one request is one read on the server (:func:`_one_write_connection`).

    Examples
    --------
    >>> client = lean_client("redis://127.0.0.1:6379/0")  # doctest: +SKIP

    Raises :class:`~trilink_spark.errors.InvalidArgumentTypeError` for a ``url`` that is not a str
    or a ``timeout`` that is not a number, and :class:`~trilink_spark.errors.InvalidArgumentError`
    for another scheme than ``redis://``, ``rediss://`` or ``unix://`` or a timeout not
    above 0 (the message quotes the URL with its credentials redacted).
    """
    import redis

    if not isinstance(url, str):
        raise InvalidArgumentTypeError(f"url must be a str, got {type(url).__name__}")
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise InvalidArgumentError(
            f"url must be a redis://, rediss:// or unix:// URL, got {_scheme_of(url)}")
    _check_seconds(timeout, "timeout")
    extra = {"connection_class": _one_write_connection()} if url.startswith("redis://") else {}
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                driver_info=None, protocol=2, **extra)


def drop_cached_clients() -> int:
    """Close and forget every cached Redis client of this process; returns how many."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
        _loaded.clear()
    for client in clients:
        client.close()
    return len(clients)


def _encode(array: pa.Array) -> list[bytes | None]:
    """Exact bytes of each value of an Arrow array (None for null); vectorised in Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = array.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        values: list[bytes | None] = array.to_pylist()
        return values
    if pa.types.is_timestamp(t):
        array = pc.cast(array, pa.int64())
    elif pa.types.is_date32(t):
        array = pc.cast(array, pa.int32())
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        array = pc.cast(array, pa.string())
    out: list[bytes | None] = pc.cast(array, pa.binary()).to_pylist()
    return out


def _decode(values: Sequence[bytes | None], t: pa.DataType) -> pa.Array:
    """The inverse of :func:`_encode` for Arrow type ``t``; vectorised in Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    raw = pa.array(list(values), pa.binary())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return raw.cast(t)
    text = pc.cast(raw, pa.string())
    if pa.types.is_timestamp(t):
        return pc.cast(pc.cast(text, pa.int64()), t)
    if pa.types.is_date32(t):
        return pc.cast(pc.cast(text, pa.int32()), t)
    return pc.cast(text, t)


def _tokens(keys: pa.Array) -> list[bytes]:
    """One exact token per key: ``n`` for null, ``v`` + the key's exact bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_floating(keys.type):
        keys = pc.add(keys, pa.scalar(0.0, keys.type))  # -0.0 is 0.0, as Spark groups it
    return [b"n" if v is None else b"v" + v for v in _encode(keys)]


def _schema_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _schema_of(text: str) -> pa.Schema:
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


class RedisStore:
    """Global store of :func:`~trilink_spark.global_merge` in Redis (picklable: tasks use it).

    Parameters
    ----------
    url : str
        ``redis://`` or ``rediss://`` URL (password included if needed).
    prefix : str
        Key prefix of this result (one prefix per aggregation).
    socket_timeout : float
        Seconds before a Redis call is abandoned.
    updated_field : str, optional
        When given, every key a flush touches also gets this hash field set to the time of
        the commit (milliseconds since the epoch, the writing client's clock): when the key
        last changed. :meth:`read` ignores it. It must not be a partial column's name.

    Notes
    -----
    Every key and value round-trips exactly (module docs): a null key and a NaN key are two
    keys, as are the string ``"nan"`` and null; binary, boolean, double, decimal and timestamp
    keys come back as themselves; sums of integers are exact 64-bit integers, of doubles
    doubles (``inf`` and NaN propagate as in Spark), min/max/first/last keep the input type and
    every digit. Nulls in values are skipped as Spark skips them; NaN is a value (``max`` is
    NaN when a key has one, Spark's order). A flush applies wholly or not at all: a failure
    (Redis unreachable, an integral sum beyond 64 bits, raised as
    :class:`~trilink_spark.errors.ArithmeticOverflowError`) leaves nothing of it and no
    marker, so a rerun of the batch applies it.

    Cost: one round trip per flush of a partition when its aggregates all add as 64-bit
    integers (``count``: the script adds in Redis); else two (a pipelined read of its keys,
    then one script writing them), plus one more of each when another flush changed one of
    its keys in between; the merge runs in the task (pandas, vectorised, O(keys of the
    flush)). The client is cached per process (by URL and timeout), so a task reuses the
    connection of the task before it; a client whose call failed is dropped. Scripts run by
    EVALSHA once this process ran them on that server, by EVAL with their body before (no
    NOSCRIPT round trip). :meth:`apply_flushes` applies many flushes (each still exactly
    once, by its own marker) in one round trip when they all add as 64-bit integers, the
    metadata included: what ``global_merge(..., apply_on="driver")`` uses. :meth:`read`
    costs one round trip per 1,000 keys. Memory in Redis: one hash per key plus one marker per
    flush.
    """

    def __init__(self, url: str, prefix: str = "trilink:merge", *, socket_timeout: float = 2.0,
                 updated_field: str | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise InvalidArgumentError(
                f"url must be a redis://, rediss:// or unix:// URL, got {_scheme_of(url)}")
        if not isinstance(prefix, str) or not prefix:
            raise InvalidArgumentError("prefix must be a non-empty str")
        _check_seconds(socket_timeout, "socket_timeout")
        if updated_field is not None and (not isinstance(updated_field, str) or not updated_field
                                          or updated_field.startswith("__")):
            raise InvalidArgumentError(
                "updated_field must be None or a non-empty str not starting with '__' (the "
                f"store's own fields), got {updated_field!r}")
        self.url = url
        self.prefix = prefix
        self.socket_timeout = socket_timeout
        self.updated_field = updated_field
        self.schema: pa.Schema | None = None
        self.result: str | None = None
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    @property
    def _client_key(self) -> tuple[str, float]:
        return (self.url, float(self.socket_timeout))

    def _redis(self) -> Any:
        """This process's client for the URL and timeout (created on first use; no
        ``CLIENT SETINFO`` and no ``HELLO`` on connect (RESP2): nothing but the commands
        themselves; over TCP each request goes in one write, see
        :func:`_one_write_connection`)."""
        import redis

        if self._client is None:
            key = self._client_key
            with _clients_lock:
                client = _clients.get(key)
                if client is None:
                    client = lean_client(self.url, self.socket_timeout)
                    _clients[key] = client
            self._client = client
        return self._client

    def _forget_client(self) -> None:
        """Drop the failed client (this instance's and the process cache's)."""
        key = self._client_key
        with _clients_lock:
            client = _clients.get(key)
            if client is not None and client is self._client:
                del _clients[key]
            for entry in [e for e in _loaded if e[0] == key]:
                _loaded.discard(entry)
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - closing a broken client is best effort
                pass
        self._client = None

    def _script(self, client: Any, body: str, sha: str, keys: list[str], args: list[Any]) -> Any:
        """Run a script in one round trip: EVALSHA when this process ran it on this server
        before, else EVAL with its body (which caches it there); NOSCRIPT (the server was
        restarted or flushed its scripts) costs one more round trip."""
        import redis

        mark = (self._client_key, sha)
        if mark in _loaded:
            try:
                return client.evalsha(sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                _loaded.discard(mark)
        result = client.eval(body, len(keys), *keys, *args)
        _loaded.add(mark)
        return result

    def _call(self, fn: Any) -> Any:
        import redis

        try:
            return fn(self._redis())
        except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
            self._forget_client()
            raise StoreUnavailableError(
                f"Redis at {redact(self.url)} is unreachable "
                f"({type(err).__name__}: {scrub(str(err), self.url)}); "
                "deltas already applied stay applied once, and a retry applies the rest"
            ) from err

    # ------------------------------------------------------------------ writing
    @staticmethod
    def ops(specs: Sequence[AggSpec]) -> list[RedisOp]:
        """The Redis form of the aggregates: (partial column, merge, hash field) per value
        stored, as each aggregate gives it (see :mod:`~trilink_spark.merge.algebra.aggregates`).

        Raises :class:`~trilink_spark.errors.InvalidArgumentError` for an aggregate Redis cannot
        merge (a :class:`~trilink_spark.merge.Combine`). Cost: O(aggregates), no Redis call.

        Examples
        --------
        >>> from trilink_spark.merge.algebra.expressions import parse_aggs
        >>> [op.kind for op in RedisStore.ops(parse_aggs({"m": ("mean", "v")}, ["v"]))]
        ['float', 'int']
        """
        return [op for spec in specs for op in spec.aggregate.redis_ops()]

    def bind_schema(self, schema: pa.Schema, result: str | None = None) -> None:
        """The exact Arrow types of the key and partial columns that :meth:`apply` stores,
        and the result's Spark schema (DDL) that :meth:`read` gives; :meth:`set_meta` records
        both. Set by :func:`~trilink_spark.global_merge` before its tasks; without it the
        types are inferred from each flush's pandas dtypes. O(1), no Redis call."""
        self.schema = schema
        self.result = result

    def _flush_schema(self, deltas: pd.DataFrame, columns: list[str]) -> pa.Schema:
        import pyarrow as pa

        if self.schema is not None and self.schema.names == columns:
            return self.schema
        return pa.Table.from_pandas(deltas[columns], preserve_index=False).schema

    def _check_updated(self, partial: list[str]) -> None:
        if self.updated_field is not None and self.updated_field in partial:
            raise InvalidArgumentError(
                f"updated_field {self.updated_field!r} is also a partial column of the "
                f"aggregates ({partial}); choose another name")

    def _head(self, partial: list[str], meta: dict[str, str] | None) -> list[Any]:
        """The scripts' common arguments: prefix, updated field and the time now (ms), the
        fields, and the meta pairs to write with the commit."""
        pairs = [v for item in (meta or {}).items() for v in item]
        return [self.prefix, self.updated_field or "", str(int(time.time() * 1000)),
                len(partial), *partial, len(pairs) // 2, *pairs]

    def apply(self, deltas: pd.DataFrame, key: str, specs: list[AggSpec], marker: str) -> bool:
        """Apply one flush's partial rows wholly, unless ``marker`` was applied before.

        Returns True when applied, False when the marker was already known. Raises
        :class:`~trilink_spark.errors.StoreUnavailableError` when Redis cannot be reached (or stays
        contended), and ArithmeticOverflowError for an integral sum beyond 64 bits; in every
        failure nothing of the flush is written. Cost: one round trip when the aggregates all
        add as 64-bit integers, else two (class notes).
        """
        partial = [c for spec in specs for c in spec.partial_columns]
        schema = self._flush_schema(deltas, [key, *partial])
        return self.apply_flushes([(marker, to_arrow(deltas, schema))], key, specs) > 0

    def apply_flushes(self, flushes: Sequence[tuple[str, pa.Table]], key: str,
                      specs: list[AggSpec], *, meta: dict[str, str] | None = None) -> int:
        """Apply several flushes, each wholly and exactly once (by its own marker), in as few
        round trips as the aggregates allow.

        Parameters
        ----------
        flushes : sequence of (marker, pyarrow.Table)
            Each flush's partial rows: the key column, then the partial columns of
            ``specs`` (the types given to :meth:`bind_schema`; one row per key and flush).
        key : str
        specs : list of AggSpec
        meta : dict, optional
            Fields written to the store's meta hash with the commit (:meth:`meta_fields`).

        Returns
        -------
        int
            Flushes applied now (those whose marker was known are skipped).

        Raises
        ------
        StoreUnavailableError
            Redis cannot be reached (or stays contended). Flushes of a script that failed
            leave nothing behind; those of scripts before it stay applied, once.
        ArithmeticOverflowError
            An integral sum beyond 64 bits (nothing of that script is written).

        Notes
        -----
        Cost: flushes are grouped into scripts of up to 250,000 values (a flush is never
        split; a micro-batch of a few thousand keys takes one). A script whose flushes all
        add as 64-bit integers (every partial a bigint: ``count``) is one round trip for all its
        flushes and the metadata; others take two (one pipelined read of every marker and
        key, the merge of all fresh flushes with the stored partials in Python by the
        aggregate algebra, then one script that commits them if nothing changed in between).
        """
        import pyarrow as pa

        self.ops(specs)
        partial = [c for spec in specs for c in spec.partial_columns]
        self._check_updated(partial)
        prepared = []
        for marker, table in flushes:
            if table.column_names != [key, *partial]:
                raise InvalidArgumentError(
                    f"flush {marker} has columns {table.column_names}, expected "
                    f"{[key, *partial]}")
            tokens = _tokens(table.column(0).combine_chunks())
            delta = table.drop_columns([key]).append_column(_TOKEN, pa.array(tokens,
                                                                               pa.binary()))
            prepared.append((str(marker), table.schema, tokens, delta))
        applied = 0
        chunk: list[Any] = []
        size = 0
        for item in prepared:
            values = len(item[2]) * (len(partial) + 1)
            if chunk and size + values > _CHUNK_VALUES:
                applied += self._apply_chunk(chunk, specs, partial, meta)
                chunk, size = [], 0
            chunk.append(item)
            size += values
        if chunk:
            applied += self._apply_chunk(chunk, specs, partial, meta)
        return applied

    def _apply_chunk(self, chunk: list[Any], specs: list[AggSpec], partial: list[str],
                     meta: dict[str, str] | None) -> int:
        """One script's flushes: the adding script when it can, else read, merge, commit."""
        import pyarrow as pa

        keys = [f"{self.prefix}:applied", f"{self.prefix}:keys", f"{self.prefix}:meta"]
        # the adding script's groups: every flush summed into one group (one row per key)
        # when that cannot leave 62 bits, and one group per flush for a partly applied chunk
        singles: list[Any] | None = [len(chunk)]
        for marker, schema, tokens, delta in chunk:
            flat = (self._add_flat(delta, schema, specs, partial, tokens)
                    if len(set(tokens)) == len(tokens) else None)
            if flat is None or singles is None:
                singles = None
                break
            singles += [1, marker, len(tokens), *flat]
        merged = (self._merged_group(chunk, specs, partial)
                  if singles is not None and len(chunk) > 1 else None)
        adding = merged if merged is not None else singles
        schema = chunk[0][1]
        markers = [c[0] for c in chunk]
        base = self.prefix.encode() + b":k:"
        unique = list(dict.fromkeys(t for c in chunk for t in c[2]))

        def run(client: Any) -> int:
            if adding is not None:
                done = int(self._script(client, _ADD_LUA, _ADD_SHA, keys,
                                        self._head(partial, meta) + adding))
                if done == -3 and singles is not None:  # some flushes were applied before
                    done = int(self._script(client, _ADD_LUA, _ADD_SHA, keys,
                                            self._head(partial, meta) + singles))
                if done >= 0:
                    return done
            for attempt in range(_MAX_TRIES):
                pipe = client.pipeline(transaction=False)
                for marker in markers:
                    pipe.sismember(keys[0], marker)
                for token in unique:
                    pipe.hgetall(base + token)
                read = pipe.execute()
                fresh = [c for c, known in zip(chunk, read[:len(markers)]) if not known]
                if not fresh:
                    return 0
                hashes = dict(zip(unique, read[len(markers):]))
                mine = list(dict.fromkeys(t for c in fresh for t in c[2]))
                delta = pa.concat_tables([c[3] for c in fresh])
                body = self._commit_args([hashes[t] for t in mine], mine, delta, schema,
                                         specs, partial)
                args = [*self._head(partial, meta), len(fresh), *[c[0] for c in fresh], *body]
                done = int(self._script(client, _COMMIT_LUA, _COMMIT_SHA, keys, args))
                if done >= 0:
                    return done
                time.sleep(random.uniform(0, 0.001 * min(attempt + 1, 50)))
            raise StoreUnavailableError(
                f"Redis at {redact(self.url)}: flush(es) {markers[0]}.. found their keys "
                f"changed by other flushes {_MAX_TRIES} times in a row; nothing of them was "
                "applied, a retry applies them"
            )

        return int(self._call(run))

    def _merged_group(self, chunk: list[Any], specs: list[AggSpec],
                      partial: list[str]) -> list[Any] | None:
        """The adding script's args for ONE group holding every flush of ``chunk``, their
        deltas added up per key (exact int64 sums; None when the sums could reach 2**62).
        Cost: one Arrow concat and hash group-by over the chunk's rows."""
        import pyarrow as pa
        import pyarrow.compute as pc

        both = pa.concat_tables([c[3] for c in chunk])
        for c in partial:
            bounds = pc.min_max(both.column(c)).as_py()
            if bounds["min"] is None:
                return None
            if max(abs(bounds["min"]), abs(bounds["max"])) * both.num_rows >= _ADD_LIMIT:
                return None
        summed = both.group_by(_TOKEN, use_threads=False).aggregate(
            [(c, "sum") for c in partial])
        delta = pa.table({**{c: summed.column(f"{c}_sum") for c in partial},
                          _TOKEN: summed.column(_TOKEN)})
        tokens = delta.column(_TOKEN).to_pylist()
        flat = self._add_flat(delta, chunk[0][1], specs, partial, tokens)
        if flat is None:
            return None
        return [1, len(chunk), *[c[0] for c in chunk], len(tokens), *flat]

    def _add_flat(self, delta_table: pa.Table, schema: pa.Schema, specs: list[AggSpec],
                  partial: list[str], tokens: list[bytes]) -> list[Any] | None:
        """One flush's part of the adding script's args (per key its token and one integer
        delta per field) when every partial adds as a 64-bit integer, else None.

        Needs: every op of kind ``int``, every partial column a bigint without nulls and with
        values of magnitude below 2**62, one row per key. Cost: one Arrow cast and min/max
        per column, one C-level interleave of the columns.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        if not partial or any(op.kind != "int" for op in self.ops(specs)):
            return None
        ops_columns = {op.column for op in self.ops(specs)}
        if set(partial) != ops_columns:
            return None
        columns: list[list[bytes]] = []
        for c in partial:
            if not pa.types.is_int64(schema.field(c).type):
                return None
            col = delta_table.column(c)
            if col.null_count:
                return None
            bounds = pc.min_max(col).as_py()
            if bounds["min"] is not None and (bounds["min"] <= -_ADD_LIMIT
                                              or bounds["max"] >= _ADD_LIMIT):
                return None
            columns.append(pc.cast(col.combine_chunks(), pa.string()).cast(
                pa.binary()).to_pylist())
        stride = len(partial) + 1
        flat: list[Any] = [b""] * (len(tokens) * stride)
        flat[0::stride] = tokens
        for j, values in enumerate(columns, start=1):
            flat[j::stride] = values
        return flat

    @staticmethod
    def _commit_args(hashes: list[dict[bytes, bytes]], unique: list[bytes],
                     delta_table: pa.Table, schema: pa.Schema, specs: list[AggSpec],
                     partial: list[str]) -> list[Any]:
        """Merge the stored partials of ``unique`` keys with the deltas (of one flush or
        several); the commit script's per-key args (count, then token, version read and
        values per key).

        Cost: one decode per stored column (Arrow), one pandas merge of stored plus delta rows
        (:func:`~trilink_spark.merge.algebra.partials.merge_partial_frames`), one encode per column.
        """
        import pyarrow as pa

        stored = [i for i, h in enumerate(hashes) if h]
        current = pa.table(
            {**{c: _decode([hashes[i].get(c.encode()) for i in stored], schema.field(c).type)
                for c in partial},
             _TOKEN: pa.array([unique[i] for i in stored], pa.binary())})
        both = pa.concat_tables([current, delta_table.select([*partial, _TOKEN])])
        merged = merge_partial_frames(arrow_to_pandas(both), [_TOKEN], specs, None)
        out_schema = pa.schema([schema.field(c) for c in partial]
                               + [pa.field(_TOKEN, pa.binary())])
        table = to_arrow(merged, out_schema)
        versions = {unique[i]: hashes[i].get(_VERSION, b"") for i in stored}
        columns = [[b"n" if v is None else b"v" + v
                    for v in _encode(table.column(c).combine_chunks())] for c in partial]
        args: list[Any] = [len(table)]
        for row, token in enumerate(table.column(_TOKEN).to_pylist()):
            args += [token, versions.get(token, b""), *[col[row] for col in columns]]
        return args

    def meta_fields(self, key: str, spark_type: str, specs: list[AggSpec]) -> dict[str, str]:
        """What :meth:`set_meta` records: the key column, its Spark type, the aggregates, and
        the types given to :meth:`bind_schema`. O(aggregates), no Redis call."""
        described = json.dumps([[s.name, s.func, s.column] for s in specs])
        mapping = {"key_type": spark_type, "key": key, "aggs": described}
        if self.schema is not None:
            mapping["schema"] = _schema_text(self.schema)
        if self.result is not None:
            mapping["result"] = self.result
        return mapping

    def set_meta(self, key: str, spark_type: str, specs: list[AggSpec]) -> None:
        """Record the key column, its Spark type and the aggregates (for :meth:`read`), and
        the types given to :meth:`bind_schema` (:meth:`meta_fields`). One round trip."""
        mapping = self.meta_fields(key, spark_type, specs)
        self._call(lambda c: c.hset(f"{self.prefix}:meta", mapping=mapping))

    def _meta(self) -> dict[str, str]:
        raw = self._call(lambda c: c.hgetall(f"{self.prefix}:meta"))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def clear(self) -> None:
        """Delete every key of this store."""
        def run(client: Any) -> None:
            base = self.prefix.encode() + b":k:"
            names = [base + k for k in client.smembers(f"{self.prefix}:keys")]
            names += [f"{self.prefix}:{s}".encode() for s in ("keys", "applied", "meta")]
            for i in range(0, len(names), 1000):
                client.delete(*names[i:i + 1000])

        self._call(run)

    def applied_flushes(self) -> int:
        """Flushes applied so far (one Redis round trip each)."""
        return int(self._call(lambda c: c.scard(f"{self.prefix}:applied")))

    # ------------------------------------------------------------------ reading
    def read_frame(self, specs: list[AggSpec], key: str) -> pd.DataFrame:
        """The global result as pandas: the key (its exact values; nullable dtypes), then
        one column per aggregate.

        Raises InvalidArgumentError when the store holds no types (written by something else
        than :func:`~trilink_spark.global_merge`). Cost: one round trip per 1,000 keys, then
        one Arrow decode per column."""
        import pyarrow as pa

        meta = self._meta()
        if "schema" not in meta:
            raise InvalidArgumentError(
                f"store {self.prefix!r} holds no column types; write it with global_merge")
        schema = _schema_of(meta["schema"])
        partial = [c for spec in specs for c in spec.partial_columns]
        base = self.prefix.encode() + b":k:"

        def run(client: Any) -> tuple[list[bytes], list[dict[bytes, bytes]]]:
            tokens = sorted(client.smembers(f"{self.prefix}:keys"))
            hashes: list[dict[bytes, bytes]] = []
            for i in range(0, len(tokens), 1000):
                pipe = client.pipeline(transaction=False)
                for t in tokens[i:i + 1000]:
                    pipe.hgetall(base + t)
                hashes += pipe.execute()
            return tokens, hashes

        tokens, hashes = self._call(run)
        columns = {key: _decode([None if t == b"n" else t[1:] for t in tokens],
                                schema.field(0).type)}
        for c in partial:
            columns[c] = _decode([h.get(c.encode()) for h in hashes], schema.field(c).type)
        merged = arrow_to_pandas(pa.table(columns))
        return finalize_frame(merged, [key], specs)

    def read(self, spark: Any, aggs: Any = None, key: str | None = None) -> DataFrame:
        """The global result as a Spark DataFrame: the key, then one column per aggregate,
        with the types ``groupBy(key).agg`` gives.

        ``aggs`` and ``key`` default to those of the last :func:`~trilink_spark.global_merge`
        into this store (kept in Redis).
        """
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        meta = self._meta()
        if aggs is None or key is None:
            if "aggs" not in meta:
                raise InvalidArgumentError(
                    f"store {self.prefix!r} has no results yet; pass aggs= and key= to read it"
                )
            aggs = aggs if aggs is not None else [tuple(a) for a in json.loads(meta["aggs"])]
            key = key if key is not None else meta["key"]
        specs = specs_for_partials(aggs)
        if "result" not in meta:
            raise InvalidArgumentError(
                f"store {self.prefix!r} holds no column types; write it with global_merge")
        struct = StructType.fromDDL(meta["result"])
        if not isinstance(struct, StructType):  # pragma: no cover - a DDL of fields
            raise InvalidArgumentError(f"store {self.prefix!r} holds a foreign result schema")
        frame = self.read_frame(specs, key)
        if not len(frame):
            empty: DataFrame = spark.createDataFrame([], struct)
            return empty
        timezone = spark.conf.get("spark.sql.session.timeZone")
        table = to_arrow(frame, to_arrow_schema(struct, timezone=timezone))
        result: DataFrame = frame_of_arrow(spark, table)
        return result

    def __repr__(self) -> str:
        return f"RedisStore({redact(self.url)!r}, prefix={self.prefix!r})"
