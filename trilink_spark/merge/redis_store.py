"""A Redis global store for Global Merge, applying each delta exactly once.

Layout under ``prefix``: one hash per key, ``{prefix}:k:{key}``, whose fields are the partial
columns of the aggregates (see :mod:`~trilink_spark.merge.algebra`); the set ``{prefix}:keys`` of
every key; the set ``{prefix}:applied`` of applied delta markers; ``{prefix}:meta`` (key type).

Each flush of a partition is one ``EVALSHA`` of a Lua script: if the flush's marker
``batch:partition:flush`` is new, every delta of the flush is applied (counts and sums with
``HINCRBY``/``HINCRBYFLOAT``, min and max by comparison, first and last by (time, position)),
all or nothing; if the marker is known, nothing happens. A retried task or a replayed batch
id therefore never counts twice. Standalone Redis (the script touches keys it computes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..errors import InvalidArgumentError, StoreUnavailableError
from ..urls import redact, scrub
from .algebra import AggSpec, RedisOp, finalize_frame, specs_for_partials

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["RedisStore"]

_APPLY_LUA = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
local data = cjson.decode(ARGV[2])
local prefix = ARGV[3]
for _, row in ipairs(data.rows) do
  local key = row[1]
  local h = prefix .. ':k:' .. key
  redis.call('SADD', KEYS[2], key)
  for i, op in ipairs(data.ops) do
    local v = row[i + 1]
    local f = op[1]
    local kind = op[2]
    if v ~= cjson.null then
      if kind == 'int' then
        redis.call('HINCRBY', h, f, v)
      elseif kind == 'float' then
        redis.call('HINCRBYFLOAT', h, f, v)
      elseif kind == 'min' or kind == 'max' then
        local cur = redis.call('HGET', h, f)
        local x = tonumber(v)
        if (not cur) or (kind == 'min' and x < tonumber(cur)) or (kind == 'max' and x > tonumber(cur)) then
          redis.call('HSET', h, f, v)
        end
      elseif kind == 'first' or kind == 'last' then
        local t, p = v[2], v[3]
        local ct = redis.call('HGET', h, f .. '__t')
        local better = not ct
        if ct then
          local cp = tonumber(redis.call('HGET', h, f .. '__p'))
          ct = tonumber(ct)
          if kind == 'first' then better = (t < ct) or (t == ct and p < cp)
          else better = (t > ct) or (t == ct and p > cp) end
        end
        if better then
          redis.call('HSET', h, f, cjson.encode(v[1]), f .. '__t', t, f .. '__p', p)
        end
      end
    end
  end
end
return #data.rows
"""


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

    Notes
    -----
    Cost: one round trip per flush of a partition (a script applying all its deltas), so in
    quantity mode one per ``quantity`` input rows at most; :meth:`read` costs one round trip
    per 1,000 keys. Memory in Redis: one hash per key plus one marker per flush.
    """

    def __init__(self, url: str, prefix: str = "trilink:merge", *, socket_timeout: float = 2.0) -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise InvalidArgumentError(
                f"url must be a redis://, rediss:// or unix:// URL, got {redact(str(url))!r}")
        if not isinstance(prefix, str) or not prefix:
            raise InvalidArgumentError("prefix must be a non-empty str")
        self.url = url
        self.prefix = prefix
        self.socket_timeout = socket_timeout
        self._client: Any = None
        self._script: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_script"] = None
        return state

    def _redis(self) -> Any:
        import redis

        if self._client is None:
            self._client = redis.Redis.from_url(
                self.url, socket_timeout=self.socket_timeout,
                socket_connect_timeout=self.socket_timeout,
            )
        return self._client

    def _call(self, fn: Any) -> Any:
        import redis

        try:
            return fn(self._redis())
        except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
            raise StoreUnavailableError(
                f"Redis at {redact(self.url)} is unreachable "
                f"({type(err).__name__}: {scrub(str(err), self.url)}); "
                "deltas already applied stay applied once, and a retry applies the rest"
            ) from err

    # ------------------------------------------------------------------ writing
    @staticmethod
    def ops(specs: Sequence[AggSpec]) -> list[RedisOp]:
        """The Redis form of the aggregates: (partial column, Lua op, hash field) per value
        shipped, as each aggregate gives it (see :mod:`~trilink_spark.merge.algebra`).

        Raises :class:`~trilink_spark.InvalidArgumentError` for an aggregate Redis cannot
        merge (a :class:`~trilink_spark.Combine`). Cost: O(aggregates), no Redis call.

        Examples
        --------
        >>> from trilink_spark.merge.algebra import parse_aggs
        >>> [op.kind for op in RedisStore.ops(parse_aggs({"m": ("mean", "v")}, ["v"]))]
        ['float', 'int']
        """
        return [op for spec in specs for op in spec.aggregate.redis_ops()]

    def apply(self, deltas: pd.DataFrame, key: str, specs: list[AggSpec], marker: str) -> bool:
        """Apply one flush's partial rows atomically unless ``marker`` was applied before.

        Returns True when applied, False when the marker was already known.
        """
        ops = self.ops(specs)
        columns = [deltas[key].tolist()]
        for spec in specs:
            columns += spec.aggregate.redis_encode(deltas)
        rows = [[str(values[0]), *values[1:]] for values in zip(*columns)]
        payload = json.dumps({"ops": [[op.field, op.kind] for op in ops], "rows": rows})

        def run(client: Any) -> Any:
            if self._script is None:  # one Script per process: EVALSHA, loaded once
                self._script = client.register_script(_APPLY_LUA)
            return self._script(keys=[f"{self.prefix}:applied", f"{self.prefix}:keys"],
                          args=[marker, payload, self.prefix])

        return bool(self._call(run))

    def set_meta(self, key: str, spark_type: str, specs: list[AggSpec]) -> None:
        """Record the key column, its Spark type and the aggregates (for :meth:`read`)."""
        described = json.dumps([[s.name, s.func, s.column] for s in specs])
        self._call(lambda c: c.hset(f"{self.prefix}:meta", mapping={
            "key_type": spark_type, "key": key, "aggs": described}))

    def _meta(self) -> dict[str, str]:
        raw = self._call(lambda c: c.hgetall(f"{self.prefix}:meta"))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def clear(self) -> None:
        """Delete every key of this store."""
        def run(client: Any) -> None:
            keys = [k.decode() for k in client.smembers(f"{self.prefix}:keys")]
            names = [f"{self.prefix}:k:{k}" for k in keys]
            names += [f"{self.prefix}:{s}" for s in ("keys", "applied", "meta")]
            for i in range(0, len(names), 1000):
                client.delete(*names[i:i + 1000])

        self._call(run)

    def applied_flushes(self) -> int:
        """Flushes applied so far (one Redis round trip each)."""
        return int(self._call(lambda c: c.scard(f"{self.prefix}:applied")))

    # ------------------------------------------------------------------ reading
    def read_frame(self, specs: list[AggSpec], key: str) -> pd.DataFrame:
        """The global result as pandas (keys as strings unless the key type is numeric)."""
        def run(client: Any) -> tuple[list[str], list[dict[bytes, bytes]], bytes | None]:
            keys = sorted(k.decode() for k in client.smembers(f"{self.prefix}:keys"))
            hashes: list[dict[bytes, bytes]] = []
            for i in range(0, len(keys), 1000):
                pipe = client.pipeline(transaction=False)
                for k in keys[i:i + 1000]:
                    pipe.hgetall(f"{self.prefix}:k:{k}")
                hashes += pipe.execute()
            return keys, hashes, client.hget(f"{self.prefix}:meta", "key_type")

        keys, hashes, key_type = self._call(run)
        merged = pd.DataFrame({key: keys})
        for spec in specs:
            for column, values in spec.aggregate.redis_decode(hashes).items():
                merged[column] = values
        if key_type is not None and key_type.decode() in ("bigint", "int", "smallint", "tinyint"):
            merged[key] = merged[key].astype(np.int64)
        return finalize_frame(merged, [key], specs)

    def read(self, spark: Any, aggs: Any = None, key: str | None = None) -> DataFrame:
        """The global result as a Spark DataFrame: the key, then one column per aggregate.

        ``aggs`` and ``key`` default to those of the last :func:`~trilink_spark.global_merge`
        into this store (kept in Redis).
        """
        if aggs is None or key is None:
            meta = self._meta()
            if "aggs" not in meta:
                raise InvalidArgumentError(
                    f"store {self.prefix!r} has no results yet; pass aggs= and key= to read it"
                )
            aggs = aggs if aggs is not None else [tuple(a) for a in json.loads(meta["aggs"])]
            key = key if key is not None else meta["key"]
        specs = specs_for_partials(aggs)
        frame = self.read_frame(specs, key)
        if not len(frame):
            empty: DataFrame = spark.createDataFrame([], f"`{key}` string")
            return empty
        result: DataFrame = spark.createDataFrame(frame)
        return result

    def __repr__(self) -> str:
        return f"RedisStore({redact(self.url)!r}, prefix={self.prefix!r})"
