"""The YSB catalogue: campaigns, their ads, and Redis's ``SET ad_id -> campaign_id``.

As in ``yahoo/streaming-benchmarks``: 100 campaigns of 10 ads each, with UUID ids, and one
Redis string per ad mapping it to its campaign. The ids are drawn from ``seed``, so the same
seed gives the same catalogue (and the same events, see :mod:`~benches.ysb.producer`).
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import StoreUnavailableError
from trilink_spark.merge.stores.redis_store import lean_client
from trilink_spark._internal.urls import redact

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Catalogue", "setup", "load_catalogue", "CATALOGUE_KEY", "redis_client"]

logger = logging.getLogger(__name__)

#: Redis key of the catalogue as JSON (``{"campaigns": [...], "ads": [[...], ...]}``).
CATALOGUE_KEY = "ysb:catalogue"


def redis_client(url: str, timeout: float = 5.0, lean: bool = False) -> Any:
    """A ``redis.Redis`` for ``url``; refuses a URL that is not ``redis://``/``rediss://``.

    ``lean``: the client :class:`~trilink_spark.merge.RedisStore` uses (no handshake commands, each
    request in one write; :func:`~trilink_spark.merge.stores.redis_store.lean_client`), else
    redis-py's defaults, as a user's own code gets them."""
    import redis

    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise InvalidArgumentError(
            f"redis_url must be a redis://, rediss:// or unix:// URL, got {redact(str(url))!r}")
    if lean:
        return lean_client(url, timeout)
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


@dataclass(frozen=True)
class Catalogue:
    """Campaigns and their ads.

    Attributes
    ----------
    campaigns : tuple of str
        Campaign ids (UUIDs).
    ads : tuple of tuple of str
        ``ads[i]`` are the ad ids of ``campaigns[i]``.
    """

    campaigns: tuple[str, ...]
    ads: tuple[tuple[str, ...], ...]

    @property
    def ad_ids(self) -> np.ndarray[Any, np.dtype[np.object_]]:
        """Every ad id, campaign by campaign (an object array)."""
        return np.array([a for group in self.ads for a in group], dtype=object)

    @property
    def ad_campaigns(self) -> np.ndarray[Any, np.dtype[np.object_]]:
        """The campaign of each entry of :attr:`ad_ids`."""
        return np.array([c for c, group in zip(self.campaigns, self.ads) for _ in group],
                        dtype=object)

    def mapping(self) -> dict[str, str]:
        """``{ad_id: campaign_id}``."""
        return {a: c for c, group in zip(self.campaigns, self.ads) for a in group}

    def to_json(self) -> str:
        """The catalogue as JSON text."""
        return json.dumps({"campaigns": list(self.campaigns), "ads": [list(g) for g in self.ads]})

    @classmethod
    def from_json(cls, text: str | bytes) -> Catalogue:
        """The catalogue :meth:`to_json` wrote; anything else is refused with
        :class:`~trilink_spark.errors.InvalidArgumentError`."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise InvalidArgumentError("the YSB catalogue is not JSON text") from None
        if (not isinstance(data, dict) or not isinstance(data.get("campaigns"), list)
                or not isinstance(data.get("ads"), list)
                or len(data["campaigns"]) != len(data["ads"])
                or not all(isinstance(c, str) for c in data["campaigns"])
                or not all(isinstance(g, list) and all(isinstance(a, str) for a in g)
                           for g in data["ads"])):
            raise InvalidArgumentError(
                "the YSB catalogue must be {'campaigns': [str, ...], 'ads': [[str, ...], ...]} "
                "with one list of ads per campaign")
        return cls(tuple(data["campaigns"]), tuple(tuple(g) for g in data["ads"]))

    def frame(self, spark: SparkSession) -> DataFrame:
        """The campaign table ``(ad_id string, campaign_id string)`` as a DataFrame (the
        table the queries broadcast-join with). Cost: one small local DataFrame."""
        import pyarrow as pa

        table = pa.table({"ad_id": pa.array(list(self.ad_ids), pa.string()),
                          "campaign_id": pa.array(list(self.ad_campaigns), pa.string())})
        frame: DataFrame = spark.createDataFrame(table.to_pandas())
        return frame


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise InvalidArgumentError(f"{name} must be >= 1, got {value}")
    return value


def setup(redis_url: str, campaigns: int = 100, ads_per_campaign: int = 10,
          seed: int = 0) -> Catalogue:
    """Create the YSB catalogue and store it in Redis (``SET ad_id campaign_id`` per ad).

    Parameters
    ----------
    redis_url : str
        ``redis://host:port/db``.
    campaigns, ads_per_campaign : int
        100 and 10 in YSB.
    seed : int
        The UUIDs are drawn from it: the same seed gives the same catalogue.

    Returns
    -------
    Catalogue

    Raises
    ------
    StoreUnavailableError
        Redis cannot be reached.

    Notes
    -----
    Cost: one Redis round trip (a pipelined ``MSET`` plus the catalogue's JSON under
    :data:`CATALOGUE_KEY`); O(campaigns x ads) memory.

    Examples
    --------
    >>> cat = setup("redis://127.0.0.1:6379/0")  # doctest: +SKIP
    >>> len(cat.campaigns), len(cat.ads[0])  # doctest: +SKIP
    (100, 10)
    """
    _check_count("campaigns", campaigns)
    _check_count("ads_per_campaign", ads_per_campaign)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidArgumentTypeError(f"seed must be an int, got {type(seed).__name__}")
    rng = random.Random(seed)

    def new_id() -> str:
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    ids = tuple(new_id() for _ in range(campaigns))
    ads = tuple(tuple(new_id() for _ in range(ads_per_campaign)) for _ in ids)
    catalogue = Catalogue(ids, ads)
    client = redis_client(redis_url)
    import redis

    try:
        pipe = client.pipeline(transaction=True)
        pipe.mset(catalogue.mapping())
        pipe.set(CATALOGUE_KEY, catalogue.to_json())
        pipe.execute()
    except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
        raise StoreUnavailableError(
            f"Redis at {redact(redis_url)} is unreachable ({type(err).__name__})") from None
    finally:
        client.close()
    logger.info("YSB catalogue: %d campaigns x %d ads stored in Redis", campaigns,
                ads_per_campaign)
    return catalogue


def load_catalogue(redis_url: str) -> Catalogue:
    """The catalogue :func:`setup` stored in Redis.

    Raises :class:`~trilink_spark.errors.InvalidArgumentError` when there is none (or it is not
    one). Cost: one round trip.
    """
    client = redis_client(redis_url)
    try:
        raw = client.get(CATALOGUE_KEY)
    finally:
        client.close()
    if raw is None:
        raise InvalidArgumentError(f"no YSB catalogue in Redis at {redact(redis_url)}; run setup")
    return Catalogue.from_json(raw)
