"""YSB's ``--check`` and latencies: what Redis holds against what the producer sent.

:func:`check` recomputes the view count of every (campaign, 10-second window) from the
producer's event log and compares it with ``seen_count`` in Redis; :func:`latencies` gives,
per window, ``time_updated - window end`` (YSB's latency).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from trilink_spark.errors import InvalidArgumentError
from .catalogue import Catalogue, redis_client
from .producer import read_log
from .queries import WINDOW_MS

__all__ = ["Mismatch", "check", "expected_counts", "read_windows", "latencies",
           "latency_summary"]


@dataclass(frozen=True)
class Mismatch:
    """One window whose stored count is not the count of the events sent.

    ``stored`` is None for a window missing in Redis; ``expected`` is 0 for a window Redis
    holds that no event falls in.
    """

    campaign_id: str
    window_start: int
    expected: int
    stored: int | None


def expected_counts(log_path: str | Path | list[str | Path], catalogue: Catalogue,
                    window_ms: int = WINDOW_MS) -> pd.DataFrame:
    """Views per ``(campaign_id, window_start)`` in the event log(s), plus each window's last
    event time: columns ``campaign_id``, ``window_start``, ``expected``, ``last_event``.

    Cost: one Parquet read; Arrow filters, joins and groups (no Python loop per event).
    """
    paths = log_path if isinstance(log_path, list) else [log_path]
    table = pa.concat_tables([read_log(p) for p in paths])
    views = table.filter(pc.equal(table.column("event_type"), "view"))
    ads = pa.table({"ad_id": pa.array(list(catalogue.ad_ids), pa.string()),
                    "campaign_id": pa.array(list(catalogue.ad_campaigns), pa.string())})
    joined = views.join(ads, "ad_id", join_type="inner")
    if joined.num_rows != views.num_rows:
        raise InvalidArgumentError(
            f"{views.num_rows - joined.num_rows} logged views name ads the catalogue does not "
            "have; check with the catalogue the events were produced from")
    et = joined.column("event_time")
    # epoch milliseconds are positive: integer division floors them
    start = pc.multiply(pc.divide(et, pa.scalar(window_ms, pa.int64())),
                        pa.scalar(window_ms, pa.int64()))
    grouped = pa.table({"campaign_id": joined.column("campaign_id"), "window_start": start,
                        "event_time": et}).group_by(["campaign_id", "window_start"]).aggregate(
        [("event_time", "count"), ("event_time", "max")])
    frame: pd.DataFrame = grouped.to_pandas()
    return frame.rename(columns={"event_time_count": "expected",
                                 "event_time_max": "last_event"})[
        ["campaign_id", "window_start", "expected", "last_event"]]


#: The hash field the global_merge variant's store counts in (its key hashes are the windows).
_STORE_COUNT = "seen_count"


def read_windows(redis_url: str, prefix: str) -> pd.DataFrame:
    """The windows a query wrote under ``prefix``: ``campaign_id``, ``window_start``,
    ``seen_count``, ``time_updated`` (ints; ms).

    Both layouts (see :mod:`~benches.ysb.queries`): the hashes
    ``{prefix}:w:{campaign}:{start}`` named in ``{prefix}:windows``, and the ``global_merge``
    variant's store keys ``{prefix}:gm:k:v{campaign}:{start}`` named in ``{prefix}:gm:keys``.

    Raises :class:`~trilink_spark.errors.InvalidArgumentError` for a window hash whose fields are
    not integers, or a store key that is not a window (not written by these queries). Cost: two
    round trips (both name sets, then one pipelined ``HMGET`` per window).
    """
    client = redis_client(redis_url)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.smembers(f"{prefix}:windows")
        pipe.smembers(f"{prefix}:gm:keys")
        plain, stored = pipe.execute()
        hashes = {m.decode(): f"{prefix}:w:{m.decode()}" for m in plain}
        for token in stored:
            text = token.decode()
            if not text.startswith("v"):
                raise InvalidArgumentError(
                    f"store key {prefix}:gm:k:{text} is not a YSB window (null key)")
            hashes.setdefault(text[1:], f"{prefix}:gm:k:{text}")
        members = sorted(hashes)
        pipe = client.pipeline(transaction=False)
        for m in members:
            pipe.hmget(hashes[m], _STORE_COUNT, "time_updated")
        values = pipe.execute() if members else []
    finally:
        client.close()
    rows: list[tuple[str, int, int, int]] = []
    for m, (count, updated) in zip(members, values):
        campaign, _, start = m.rpartition(":")
        try:
            rows.append((campaign, int(start), int(count), int(updated)))
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"window {hashes[m]} holds seen_count={count!r}, time_updated={updated!r}; "
                "expected integers") from None
    return pd.DataFrame(rows, columns=["campaign_id", "window_start", "seen_count",
                                       "time_updated"]).astype(
        {"window_start": "int64", "seen_count": "int64", "time_updated": "int64"})


def check(redis_url: str, prefix: str, log_path: str | Path | list[str | Path],
          catalogue: Catalogue, window_ms: int = WINDOW_MS) -> list[Mismatch]:
    """YSB's check: the windows whose Redis count differs from the events sent.

    Parameters
    ----------
    redis_url, prefix : str
        Where the query wrote (``prefix`` as given to
        :func:`~benches.ysb.start_query`).
    log_path : str, Path or list of them
        The producer's event log(s).
    catalogue : Catalogue
    window_ms : int
        Window length (10,000 in YSB).

    Returns
    -------
    list of Mismatch
        Empty when every window holds exactly the views sent.

    Notes
    -----
    Cost: :func:`expected_counts` plus :func:`read_windows`; O(events) Arrow work.

    Examples
    --------
    >>> check("redis://127.0.0.1:6379/0", "ysb:ahead", "/tmp/events.parquet", cat)  # doctest: +SKIP
    []
    """
    want = expected_counts(log_path, catalogue, window_ms)
    have = read_windows(redis_url, prefix)
    both = want.merge(have, on=["campaign_id", "window_start"], how="outer")
    expected = both["expected"].fillna(0).astype("int64")
    stored = both["seen_count"]
    bad = both[stored.isna() | (stored.fillna(-1).astype("int64") != expected)]
    out: list[Mismatch] = []
    for campaign, start, want_n, have_n in zip(bad["campaign_id"].tolist(),
                                               bad["window_start"].tolist(),
                                               bad["expected"].tolist(),
                                               bad["seen_count"].tolist()):
        out.append(Mismatch(str(campaign), int(start),
                            0 if pd.isna(want_n) else int(want_n),
                            None if pd.isna(have_n) else int(have_n)))
    return out


def latencies(redis_url: str, prefix: str, log_path: str | Path | list[str | Path] | None = None,
              catalogue: Catalogue | None = None, window_ms: int = WINDOW_MS) -> pd.DataFrame:
    """Per window: ``time_updated - window end`` (YSB's latency), in ms.

    Returns
    -------
    pandas.DataFrame
        ``campaign_id``, ``window_start``, ``window_end``, ``seen_count``, ``time_updated``,
        ``latency_ms``; with the log and catalogue also ``last_event`` (the window's last
        event time) and ``complete``: whether events were still sent after the window ended
        (YSB's latency means something only for such windows; for the last, still open
        windows ``time_updated - last_event`` is the better measure, in ``event_latency_ms``).

    Notes
    -----
    Cost: :func:`read_windows` (plus :func:`expected_counts` with a log).

    Examples
    --------
    >>> lat = latencies(url, "ysb:baseline", "/tmp/events.parquet", cat)  # doctest: +SKIP
    >>> lat[lat.complete].latency_ms.quantile(0.99)  # doctest: +SKIP
    """
    have = read_windows(redis_url, prefix)
    have["window_end"] = have["window_start"] + window_ms
    have["latency_ms"] = have["time_updated"] - have["window_end"]
    if log_path is not None:
        if catalogue is None:
            raise InvalidArgumentError("latencies with a log_path needs the catalogue too")
        want = expected_counts(log_path, catalogue, window_ms)
        have = have.merge(want[["campaign_id", "window_start", "last_event"]],
                          on=["campaign_id", "window_start"], how="left")
        last_sent = int(want["last_event"].max()) if len(want) else 0
        have["complete"] = have["window_end"] <= last_sent
        have["event_latency_ms"] = have["time_updated"] - have["last_event"]
    return have


def latency_summary(frame: pd.DataFrame) -> dict[str, Any]:
    """p50 and p99 of ``latency_ms`` over the complete windows (None when there is none), and
    of ``event_latency_ms`` over every window. O(windows)."""
    def q(values: Any, p: float) -> float | None:
        arr = np.asarray(values, dtype=np.float64)
        arr = arr[~np.isnan(arr)]
        return float(np.percentile(arr, p)) if len(arr) else None

    complete = frame[frame["complete"]] if "complete" in frame else frame
    out: dict[str, Any] = {"p50_latency_ms": q(complete["latency_ms"], 50),
                           "p99_latency_ms": q(complete["latency_ms"], 99),
                           "complete_windows": int(len(complete))}
    if "event_latency_ms" in frame:
        out["p50_event_latency_ms"] = q(frame["event_latency_ms"], 50)
        out["p99_event_latency_ms"] = q(frame["event_latency_ms"], 99)
    return out
