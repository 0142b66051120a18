"""The ``trilink-spark`` command.

``trilink-spark balance`` tells how badly Spark's hash placement fits a key column and what every
strategy would do. With no arguments it runs the Trilink paper's four scenarios on local Spark.
``trilink-spark config get|set`` reads or publishes the dynamic configuration
(:mod:`trilink_spark.cli.config`). ``trilink-spark advise --progress progress.jsonl`` reads
saved ``StreamingQueryProgress`` events (one JSON object per line) and prints the bottleneck
report of :class:`~trilink_spark.advice.BottleneckAdvisor`. ``trilink-spark state PATH``
summarises a keyed stream's state path (:mod:`trilink_spark.cli.state`); ``trilink-spark report
PATH --html out.html`` writes its history as one self-contained page (:mod:`trilink_spark.cli.report`).

Examples
--------
::

    trilink-spark balance                                   # the four paper scenarios
    trilink-spark balance events.parquet --key user_id --partitions 32
    trilink-spark balance flights.csv.gz --key tailnum         # compressed CSV or JSON
    trilink-spark balance --scenario zipf --zipf 1.1 --json
    trilink-spark balance --plot loads.png
    trilink-spark advise --progress progress.jsonl --json
    trilink-spark state /data/state
    trilink-spark report /data/state --html state.html
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, TextIO

from .._internal.install import install_hint
from .config import add_config_parser, run_config
from .inputs import FORMATS, check_input
from .report import add_report_parser, run_report
from .state import add_state_parser, run_state
from ..errors import InvalidArgumentError, TrilinkError
from ..partitioners.choosing.catalogue import ruled_out_by_keys
from .._internal.validation import check_num_partitions, fraction, refuse_streaming
from ..partitioners.choosing.evaluation import StrategyScore, choose_best, evaluate_strategies
from ..partitioners.choosing.scenarios import (MAX_SCENARIO_KEYS, PAPER_SCENARIOS, SCENARIOS,
                                               make_scenario, scenario_frame)

__all__ = ["main", "build_parser", "BalanceResult", "run_balance", "run_advise", "add_advise_parser"]

logger = logging.getLogger(__name__)


@dataclass
class BalanceResult:
    """What ``trilink-spark balance`` found for one data set."""

    name: str
    records: int
    distinct_keys: int
    sampled_records: int
    scores: list[StrategyScore]
    best: str
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)
    kafka: dict[str, float] | None = None
    #: strategies left out, with why (``{"modulo": "string keys (Modulo needs integer keys)"}``)
    skipped: dict[str, str] = field(default_factory=dict)
    #: Records whose key is null (counted in ``records``, one key of ``distinct_keys``).
    null_rows: int = 0
    #: Set when the column has more distinct keys than this (``spark.trilink.table.maxKeys``):
    #: every score was then counted on the executors (:mod:`trilink_spark.cli.wide`), the
    #: tables in their bounded form, and one entry per key was not computed.
    max_keys: int | None = None

    def to_dict(self) -> dict[str, Any]:
        extra = {"kafka_murmur2": self.kafka} if self.kafka is not None else {}
        return {
            "name": self.name,
            "records": self.records,
            "null_rows": self.null_rows,
            "distinct_keys": self.distinct_keys,
            "sampled_records": self.sampled_records,
            "keyed_bound": self.scores[0].keyed_bound if self.scores else 1.0,
            "best": self.best,
            "strategies": [s.to_dict() for s in self.scores],
            "skipped": dict(self.skipped),
            "measured": self.measured,
            "counted_on_executors": self.max_keys is not None,
            "max_keys": self.max_keys,
            **extra,
        }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trilink-spark",
        description="Key placement that keeps keys whole and balances load, for Apache Spark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    bal = sub.add_parser(
        "balance",
        help="how Spark's hash placement and every strategy would balance a key column",
        description=(
            "Score every placement strategy on a key column (a Parquet/CSV/JSON path with "
            "--key) or on built-in scenarios. Without a path: the four scenarios of the paper. "
            "A local PATH, its format and the key column are checked before Spark starts."
        ),
    )
    bal.add_argument("path", nargs="?",
                     help="Parquet, CSV or JSON file or directory; CSV and JSON may be "
                     "compressed (.gz, .bz2, .deflate, .zst, Hadoop's .lz4 and .snappy)")
    bal.add_argument("--key", help="key column of PATH")
    bal.add_argument("--format", choices=FORMATS,
                     help="input format (default: from the name, or a directory's files)")
    bal.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="built-in scenario, repeatable (default: the paper's four)",
    )
    bal.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent s (default 1.1)")
    bal.add_argument("--records", type=int, default=1_000_000, help="records per scenario")
    bal.add_argument("--keys", type=int, default=10_000, help="distinct keys per scenario")
    bal.add_argument("--partitions", type=int, default=60, help="partitions (default 60)")
    bal.add_argument(
        "--sample-rate",
        type=float,
        default=1.0,
        help="fit strategies on this fraction of rows, score on all rows (default 1.0)",
    )
    bal.add_argument("--seed", type=int, default=0)
    bal.add_argument(
        "--null-policy",
        choices=("group", "error", "partition0"),
        default="group",
        help="null keys: 'group' (default) a key of its own, as Spark's groupBy and hash "
        "partitioning place it; 'error' refuse them; 'partition0' place them on partition 0",
    )
    bal.add_argument(
        "--measure",
        action="store_true",
        help="also place the data with Spark and measure hash and the best strategy (starts "
        "Spark; without it a local file that fits in memory is scored with Arrow, no Spark)",
    )
    bal.add_argument("--no-measure", action="store_false", dest="measure",
                     help="do not measure with Spark (the default)")
    bal.add_argument(
        "--kafka",
        action="store_true",
        help="also show Kafka's default partitioner (murmur2 of the key as text) on "
        "--partitions Kafka partitions, as a producer without Ahead KeyBy places keys",
    )
    bal.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bal.add_argument("--plot", metavar="PNG", help="draw per-partition loads per strategy")
    bal.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    bal.add_argument(
        "--remote",
        metavar="URL",
        help="use Spark Connect instead: sc://host:15002, or local[N] to start a local "
        "Connect server (default: $SPARK_REMOTE if set, else classic Spark on --master)",
    )
    add_config_parser(sub)
    add_advise_parser(sub)
    add_state_parser(sub)
    add_report_parser(sub)
    return parser


def _read(spark: Any, path: str, fmt: str) -> Any:
    """``path`` as a DataFrame, in the format :func:`~.inputs.check_input` told (Spark
    decompresses CSV and JSON by the name's suffix)."""
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    return reader.load(path)


def _reads_local_files(master: str, remote: str | None) -> bool:
    """Whether Spark reads a path without a scheme from this machine's file system: a local
    master, in this process or behind a local Spark Connect server (``--remote local[N]``)."""
    import os

    remote = remote if remote is not None else os.environ.get("SPARK_REMOTE") or None
    where = master if remote is None else remote
    return where.strip().lower().startswith("local")


@contextmanager
def _spark_reading(path: str, fmt: str) -> Iterator[None]:
    """Turn what Spark raises while reading ``path`` (a gzip cut short past what was checked,
    a JSON object naming a field twice, a file that vanished) into one
    :class:`~trilink_spark.errors.InvalidArgumentError` naming the path and Spark's reason,
    instead of a Java stack trace. TrilinkErrors pass through."""
    from pyspark.errors import PySparkException

    spark_errors: tuple[type[BaseException], ...] = (PySparkException,)
    try:  # classic PySpark: a failed job is a Py4JJavaError (a Connect client has no py4j)
        from py4j.protocol import Py4JError

        spark_errors += (Py4JError,)
    except ImportError:  # pragma: no cover - pyspark-client
        pass
    try:
        yield
    except spark_errors as err:
        raise InvalidArgumentError(
            f"Spark failed reading {path!r:.300} as {fmt.upper()}: {_spark_reason(err)}") \
            from None


def _spark_reason(err: BaseException) -> str:
    """The line of a Spark error that says what went wrong: the innermost ``Caused by:`` of a
    Java stack trace, else the first line; at most 400 characters."""
    text = str(err)
    causes = [line.strip()[len("Caused by:"):].strip() for line in text.splitlines()
              if line.strip().startswith("Caused by:")]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = causes[-1] if causes else (lines[0] if lines else type(err).__name__)
    return reason[:400]


def _key_column(df: Any, key: str) -> tuple[Any, str]:
    """The key column of a file alone (other columns are not needed), and its name: a file's
    header may name it ``user.id`` or with a backtick, which every call quotes."""
    from ..columns import column_of, require_columns

    require_columns(df, [key], "key column")
    return df.select(column_of(key)), key


def _measure(df: Any, key: str, score: StrategyScore) -> dict[str, Any]:
    from ..partitioners.core.balance import partition_balance
    from ..placement.key_by import key_by

    report = partition_balance(key_by(df, key, score.partitioner.copy(), fit="none"))
    out = report.to_dict()
    out.pop("loads")
    return out


def run_balance(
    df: Any,
    key: str,
    name: str,
    partitions: int,
    sample_rate: float,
    seed: int,
    measure: bool,
    kafka: bool = False,
    null_policy: str = "group",
) -> BalanceResult:
    """Score every strategy on ``df[key]``; optionally measure hash and the best with Spark,
    and score Kafka's default partitioner (``kafka=True``).

    Null keys follow ``null_policy``: under ``"group"`` and ``"partition0"`` their records
    are counted and placed like every other key's (``null_rows`` says how many), under
    ``"error"`` they are refused (:class:`~trilink_spark.errors.NullKeyError`)."""
    import numpy as np

    from ..placement.fit import key_head
    from ..placement.key_by import key_counts, key_kind, table_max_keys
    from .wide import loads_balance, wide_balance

    refuse_streaming(df, "run_balance", "it counts every key of the frame with a job")
    sample_rate = fraction(sample_rate, "sample_rate")
    kind, dtype = key_kind(df, key)
    if kind is None:
        raise InvalidArgumentError(
            f"key column {key!r} is {dtype.simpleString()}; balance needs int, long, string "
            "(UTF8_BINARY collation) or binary keys"
        )
    limit = table_max_keys(df.sparkSession)
    head = key_head(df, key, limit)
    if not head.complete:  # more keys than a table names: counted on the executors
        wide = wide_balance(df, key, kind, partitions, sample_rate, seed, null_policy, limit,
                            kafka=kafka)
        best = choose_best(wide.scores)
        result = BalanceResult(
            name=name, records=wide.records, distinct_keys=wide.distinct_keys,
            sampled_records=wide.sampled_records, scores=wide.scores, best=best.name,
            skipped=ruled_out_by_keys(kind), null_rows=wide.null_rows, max_keys=limit)
        if wide.kafka_loads is not None:
            result.kafka = loads_balance(wide.kafka_loads)
    else:
        full_map = dict(zip(head.keys.to_pylist() + [None] * bool(head.nulls),
                            head.rows.astype(np.int64).tolist() + [head.nulls] * bool(head.nulls)))
        fit_map = full_map
        if sample_rate < 1.0:
            sample = key_counts(df, key, sample_rate, seed, null_policy)
            fit_map = dict(zip(sample.column(0).to_pylist(),
                               sample.column(1).to_numpy().tolist()))
        result = score_counts(name, kind, full_map, fit_map, partitions, seed, kafka,
                              null_policy, sample_rate)
        best = next(s for s in result.scores if s.name == result.best)
    if measure:
        for score in {s.name: s for s in (result.scores[0], best)}.values():
            result.measured[score.name] = _measure(df, key, score)
    return result


def score_counts(name: str, kind: str, full_map: dict[Any, int], fit_map: dict[Any, int],
                 partitions: int, seed: int, kafka: bool = False, null_policy: str = "group",
                 sample_rate: float = 1.0) -> BalanceResult:
    """Score every strategy on counted keys: the one scoring of ``balance``, whoever counted.

    Parameters
    ----------
    name : str
        The data set's name in the result.
    kind : str
        The key kind (``"int"``, ``"long"``, ``"string"``, ``"binary"``).
    full_map : dict
        ``{key: rows}`` of every row, sorted by key with the null key (``None``) last.
    fit_map : dict
        ``{key: rows}`` the table strategies are fitted on (``full_map``, or a sample's).
    partitions, seed, kafka, null_policy, sample_rate
        As :func:`run_balance` takes them (``sample_rate`` names an empty sample).

    Returns
    -------
    BalanceResult

    Examples
    --------
    >>> counts = {1: 5, 2: 3, 3: 1}
    >>> score_counts("tiny", "long", counts, counts, 2, 0).records
    9

    Notes
    -----
    Cost: no Spark; O(keys x strategies) on the driver.
    """
    from ..partitioners.core.keys import check_null_policy, null_key_error

    if None in full_map and check_null_policy(null_policy) == "error":
        raise null_key_error(f"{name!r} has null keys")
    if not fit_map:
        raise InvalidArgumentError(f"a {sample_rate} sample of {name} has no rows")
    scores = evaluate_strategies(fit_map, partitions, evaluate_on=full_map, key_type=kind,
                                 seed=seed, null_policy=null_policy)
    result = BalanceResult(
        name=name, records=int(sum(full_map.values())), distinct_keys=len(full_map),
        sampled_records=int(sum(fit_map.values())), scores=scores,
        best=choose_best(scores).name, skipped=ruled_out_by_keys(kind),
        null_rows=int(full_map.get(None, 0)))
    if kafka:
        result.kafka = _kafka_placement(full_map, partitions)
    return result


def thinned(counts: dict[Any, int], rate: float, seed: int) -> dict[Any, int]:
    """A ``rate`` sample of counted rows without Spark: each key keeps a seeded binomial
    share of its rows (keys left with none are dropped). It draws other rows than Spark's
    ``DataFrame.sample`` with the same seed, so fitted figures differ from a Spark read's.

    Examples
    --------
    >>> thinned({"a": 1000, "b": 0}, 0.5, 1)["a"] in range(400, 600)
    True

    Notes
    -----
    Cost: O(keys), numpy.
    """
    import numpy as np

    if rate >= 1.0:
        return counts
    drawn = np.random.default_rng(seed).binomial(
        np.fromiter(counts.values(), np.int64, len(counts)), rate)
    return {k: n for k, n in zip(counts, drawn.tolist()) if n}


def _kafka_placement(counts: dict[Any, int], partitions: int) -> dict[str, float]:
    """Balance of Kafka's default partitioner over ``partitions`` Kafka partitions."""
    import numpy as np

    from ..partitioners.core.kafka_hash import kafka_default_partition
    from .wide import loads_balance

    keys = [k for k in counts if k is not None]
    weights = np.array([counts[k] for k in keys], dtype=np.float64)
    loads = np.bincount(kafka_default_partition(keys, partitions), weights=weights,
                        minlength=partitions).astype(np.float64)
    return loads_balance(loads)


def _format_table(results: Sequence[BalanceResult], partitions: int, out: TextIO) -> None:
    for res in results:
        sampled = (
            "" if res.sampled_records == res.records else f", fitted on {res.sampled_records:,}"
        )
        nulls = f" ({res.null_rows:,} with a null key)" if res.null_rows else ""
        out.write(
            f"\n{res.name}: {res.records:,} records{nulls}, {res.distinct_keys:,} keys, "
            f"{partitions} partitions{sampled}; keyed bound {res.scores[0].keyed_bound:.3f}\n"
        )
        out.write(
            f"  {'strategy':<24}{'balance':>9}{'extra time':>12}{'max/mean':>10}"
            f"{'max load':>12}{'mean load':>12}\n"
        )
        for s in res.scores:
            mark = "*" if s.name == res.best else " "
            ratio = s.max_load / s.mean_load if s.mean_load else 1.0
            out.write(
                f"{mark} {s.name:<24}{s.balance_degree:>9.3f}{s.extra_compute_time:>11.1%}"
                f"{ratio:>10.3f} {s.max_load:>11,.0f} {s.mean_load:>11,.1f}\n"
            )
        for s in res.scores:
            if s.per_key_balance is not None:
                p = s.partitioner
                out.write(
                    f"  {s.name}: bounded ({len(p):,} keys by name, the rest by "  # type: ignore[arg-type]
                    f"{p.num_groups:,} key groups); one entry per key would give "  # type: ignore[attr-defined]
                    f"{s.per_key_balance:.3f} ({s.bounded_gap:+.3f})\n")
        if res.max_keys is not None:
            out.write(
                f"  more than {res.max_keys:,} keys (spark.trilink.table.maxKeys): counted on "
                "the executors; tables scored in their bounded form (heaviest keys by name, "
                "the rest by key group), one entry per key not computed\n")
        for name, m in res.measured.items():
            out.write(
                f"  measured with Spark, {name}: balance {m['balance_degree']:.3f}, "
                f"extra time {m['extra_compute_time']:.1%}\n"
            )
        if res.kafka is not None:
            out.write(
                f"  Kafka's default partitioner (murmur2), {partitions} Kafka partitions: "
                f"balance {res.kafka['balance_degree']:.3f}, "
                f"extra time {res.kafka['extra_compute_time']:.1%}\n"
            )
        for name, why in res.skipped.items():
            out.write(f"  {name}: skipped, {why}\n")
    out.write("\n* = chosen (a table strategy must beat hash/modulo by > 0.01)\n")


def _short_name(name: str) -> str:
    """A data set's name for a plot: a path's last component (a scenario's label as is),
    at most 40 characters."""
    short = PurePosixPath(name.rstrip("/")).name or name
    return short if len(short) <= 40 else short[:24] + "..." + short[-13:]


def _check_plot(path: str) -> None:
    """Refuse ``--plot`` before any work when matplotlib is missing or ``path`` cannot be
    written (its folder is missing, or the suffix is no format matplotlib writes; no suffix
    is PNG)."""
    import os

    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise InvalidArgumentError(
            "--plot needs matplotlib: " + install_hint("plot", "matplotlib>=3.7")) from None
    if os.path.isdir(path):
        raise InvalidArgumentError(f"--plot {path!r} is a directory; give a file name (.png)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidArgumentError(
            f"--plot {path!r}: cannot write into {folder!r} (missing or not writable)")
    suffix = PurePosixPath(path).suffix.lower().lstrip(".")
    kinds = sorted(FigureCanvasBase.get_supported_filetypes())
    if suffix and suffix not in kinds:
        raise InvalidArgumentError(
            f"--plot {path!r}: matplotlib writes no .{suffix} file; end the name in .png "
            f"(or {', '.join('.' + k for k in kinds if k != 'png')})")


#: Bar colours: every strategy, and the chosen one.
_BAR, _CHOSEN = "#4477aa", "#228833"


def _plot(results: Sequence[BalanceResult], path: str) -> None:
    """Draw :func:`_plot_figure` into ``path`` (PNG, or as the suffix says)."""
    fig = _plot_figure(results)  # picks the Agg backend, refuses a missing matplotlib
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_figure(results: Sequence[BalanceResult]) -> Any:
    """One row of bar charts per data set, one panel per strategy: records per partition,
    the mean as a dashed red line, the chosen strategy in green with a star; titles name the
    data set (a path's file name) and the strategy's balance degree. O(partitions x panels)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import EngFormatter, MaxNLocator
    except ImportError:
        raise InvalidArgumentError(
            "--plot needs matplotlib: " + install_hint("plot", "matplotlib>=3.7")
        ) from None
    cols = max(len(r.scores) for r in results)
    fig, axes = plt.subplots(
        len(results),
        cols,
        figsize=(3.4 * cols, 2.8 * len(results) + 0.5),
        squeeze=False,
        sharey="row",
    )
    for row, res in enumerate(results):
        name = _short_name(res.name)
        for col in range(cols):
            ax = axes[row][col]
            if col >= len(res.scores):
                ax.axis("off")
                continue
            s = res.scores[col]
            chosen = s.name == res.best
            ax.bar(range(s.loads.size), s.loads, width=0.8, color=_CHOSEN if chosen else _BAR)
            ax.axhline(s.mean_load, color="#cc3311", linewidth=1, linestyle="--", zorder=3)
            star = "\u2605 " if chosen else ""
            ax.set_title(f"{name}\n{star}{s.name}: balance {s.balance_degree:.3f}",
                         fontsize=8, fontweight="bold" if chosen else "normal",
                         color=_CHOSEN if chosen else "black")
            ax.set_xlabel("partition", fontsize=7)
            if col == 0:
                ax.set_ylabel("records", fontsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))
            ax.tick_params(labelsize=6)
            ax.margins(x=0.01)
    fig.suptitle("records per partition; dashed red line: mean; \u2605 green: chosen strategy",
                 fontsize=9)
    fig.tight_layout()
    return fig


def _balance_spark(args: argparse.Namespace, checked: Any,
                   scenarios: list[tuple[str, Any]]) -> list[BalanceResult]:
    """Read and score with Spark: to ``--measure``, or where Arrow cannot read as Spark."""
    from .._internal.spark.session import get_session

    spark = get_session(args.master, shuffle_partitions=max(2, args.partitions),
                        remote=args.remote)
    if checked is not None:
        with _spark_reading(args.path, checked.format):
            df, key = _key_column(_read(spark, checked.spark_path or args.path,
                                        checked.format), args.key)
            return [run_balance(df, key, args.path, args.partitions, args.sample_rate,
                                args.seed, args.measure, args.kafka, args.null_policy)]
    return [run_balance(scenario_frame(spark, sc), "key", label, args.partitions,
                        args.sample_rate, args.seed, args.measure, args.kafka,
                        args.null_policy) for label, sc in scenarios]


def _check_balance_args(args: argparse.Namespace) -> None:
    """Refuse bad ``balance`` flags by their names, before any file is read or engine starts."""
    check_num_partitions(args.partitions, "--partitions")
    if not 0.0 < args.sample_rate <= 1.0:
        raise InvalidArgumentError(f"--sample-rate must be in (0, 1], got {args.sample_rate}")
    if args.seed < 0:
        raise InvalidArgumentError(f"--seed must be >= 0, got {args.seed}")
    if args.path and not args.key:
        raise InvalidArgumentError("a PATH needs --key COLUMN")
    if args.path and args.scenario:
        raise InvalidArgumentError("give either PATH --key or --scenario, not both")
    if not args.path:
        for flag, given in (("--key", args.key), ("--format", args.format)):
            if given is not None:
                raise InvalidArgumentError(
                    f"{flag} names a column or format of a PATH, and no PATH was given; "
                    f"pass PATH {flag} {given}, or leave {flag} out for the scenarios")
        for flag, number in (("--records", args.records), ("--keys", args.keys)):
            if number < 1:
                raise InvalidArgumentError(f"{flag} must be >= 1, got {number}")
        # a scenario holds one entry per key on the driver (autoincrement: per record)
        sized = [("--keys", args.keys)]
        if "autoincrement" in (args.scenario or PAPER_SCENARIOS):
            sized.append(("--records", args.records))
        for flag, number in sized:
            if number > MAX_SCENARIO_KEYS:
                raise InvalidArgumentError(
                    f"{flag} must be at most {MAX_SCENARIO_KEYS:,} (a scenario keeps one count "
                    f"per key in driver memory), got {number:,}")
        if "zipf" in (args.scenario or ()) and not args.zipf > 0:
            raise InvalidArgumentError(f"--zipf must be > 0, got {args.zipf}")


def _null_keys_refused(name: str, key: str) -> TrilinkError:
    """The CLI's wording of a refused null key: the flag that refused it and the flags that
    keep it."""
    from ..errors import NullKeyError

    return NullKeyError(
        f"{name}: column {key!r} has null keys; --null-policy error refuses them; pass "
        "--null-policy group (a key of their own, as Spark's groupBy and hash partitioning "
        "place them) or --null-policy partition0")


def _balance_local(args: argparse.Namespace, checked: Any) -> BalanceResult | None:
    """Score a local PATH read with Arrow, without Spark, or ``None`` where Spark must read
    it (see :mod:`~trilink_spark.cli.local_counts`)."""
    from .local_counts import local_key_counts

    counts = local_key_counts(checked, args.key)
    if counts is None:
        return None
    order = sorted(range(len(counts.keys)), key=counts.keys.__getitem__)
    full = {counts.keys[i]: int(counts.rows[i]) for i in order}
    if counts.nulls:
        full[None] = counts.nulls
    return score_counts(args.path, counts.kind, full, thinned(full, args.sample_rate, args.seed),
                        args.partitions, args.seed, args.kafka, args.null_policy,
                        args.sample_rate)


def _balance(args: argparse.Namespace, out: TextIO) -> int:
    from ..errors import NullKeyError
    from ..partitioners.tables.table import DEFAULT_MAX_KEYS

    _check_balance_args(args)
    # everything that can be checked without Spark is, before it starts (seconds)
    checked = check_input(args.path, args.key, args.format,
                          local=_reads_local_files(args.master, args.remote)) \
        if args.path else None
    if args.plot:
        _check_plot(args.plot)
    names = args.scenario or PAPER_SCENARIOS
    scenarios = [] if checked is not None else [
        (f"zipf(s={args.zipf})" if name == "zipf" else name,
         make_scenario(name, args.records, args.keys, zipf_s=args.zipf, seed=args.seed))
        for name in names]
    results: list[BalanceResult] = []
    try:
        if not args.measure:  # scored without Spark where the counts are at hand
            if checked is not None:
                local = _balance_local(args, checked) if checked.local_files else None
                results.extend([local] if local is not None else [])
            elif all(int((sc.counts > 0).sum()) <= DEFAULT_MAX_KEYS for _, sc in scenarios):
                results.extend(
                    score_counts(label, "long", sc.as_mapping(),
                                 thinned(sc.as_mapping(), args.sample_rate, args.seed),
                                 args.partitions, args.seed, args.kafka, args.null_policy,
                                 args.sample_rate)
                    for label, sc in scenarios)
        if not results:
            results = _balance_spark(args, checked, scenarios)
    except NullKeyError as err:  # only a PATH's column holds nulls
        raise _null_keys_refused(args.path, args.key) from err
    if args.plot:
        _plot(results, args.plot)
    if args.json:
        payload = {
            "partitions": args.partitions,
            "sample_rate": args.sample_rate,
            "datasets": [r.to_dict() for r in results],
        }
        json.dump(payload, out, indent=2)
        out.write("\n")
    else:
        _format_table(results, args.partitions, out)
        if args.plot:
            out.write(f"plot written to {args.plot}\n")
    return 0


def add_advise_parser(sub: Any) -> None:
    """The ``advise`` subcommand's arguments."""
    adv = sub.add_parser(
        "advise",
        help="bottleneck and rescale advice from saved StreamingQueryProgress events",
        description=(
            "Read StreamingQueryProgress events (JSON, one per line, as query.lastProgress or "
            "a listener's event.progress.json gives them) and report the query's flow "
            "network: each node's true rate, capacity and utilisation, the bottleneck cut, "
            "DS2's parallelism and what to change."),
    )
    adv.add_argument("--progress", required=True, type=Path,
                     help="JSON-lines file of progress events ('-' for standard input)")
    adv.add_argument("--lambda", dest="lambda_", type=float, default=0.85,
                     help="Eq. 10 threshold of FAR-Flink, 0.85 to 1 (default 0.85)")
    adv.add_argument("--window", type=int, default=5, help="batches summed (default 5)")
    adv.add_argument("--warmup", type=int, default=2, help="first batches ignored (default 2)")
    adv.add_argument("--slots", type=int, default=None, help="tasks that run at once")
    adv.add_argument("--json", action="store_true", help="print the report as JSON")


def run_advise(args: argparse.Namespace, out: TextIO) -> int:
    """``trilink-spark advise``: the report of the saved progress events.

    Parameters
    ----------
    args : argparse.Namespace
        From :func:`add_advise_parser`'s arguments.
    out : TextIO
        Where the report goes.

    Returns
    -------
    int
        0.

    Raises
    ------
    InvalidArgumentError
        A file that cannot be read (missing, a directory), holds no event, a line that is
        not UTF-8, longer than :data:`~trilink_spark.measurement.progress.MAX_PROGRESS_BYTES`
        or not a progress event, or a figure out of range: ``durationMs`` entries in
        ``[0, MAX_DURATION_MS]`` (a year), ``numInputRows`` in ``[0, 2**63)``, rates finite
        and >= 0 (see :func:`~trilink_spark.measurement.parse_progress`). The message names
        the line and the field. ``main`` prints it and exits 2.

    Notes
    -----
    O(size of the input); one line is held at a time. Standard input (``-``) is read, never
    closed. Advised task counts are at most
    :data:`~trilink_spark.advice.bottleneck.MAX_ADVISED_TASKS`.
    """
    from ..advice.bottleneck import BottleneckAdvisor

    from ..measurement.progress import MAX_PROGRESS_BYTES

    advisor = BottleneckAdvisor(args.lambda_, args.window, args.warmup, slots=args.slots)
    stdin = str(args.progress) == "-"
    try:
        # bytes, line by line: a line is decoded (and refused) on its own, a file without
        # newlines is never read whole, and standard input is never closed
        handle: BinaryIO = (getattr(sys.stdin, "buffer", None) or io.BytesIO(
            sys.stdin.read().encode("utf-8"))) if stdin else args.progress.open("rb")
    except OSError as err:
        raise InvalidArgumentError(f"cannot read {args.progress} ({err.strerror or err})") \
            from None
    events = 0
    try:
        number = 0
        while True:
            try:
                raw = handle.readline(MAX_PROGRESS_BYTES + 2)
            except OSError as err:
                raise InvalidArgumentError(
                    f"cannot read {args.progress} ({err.strerror or err})") from None
            if not raw:
                break
            number += 1
            if len(raw) > MAX_PROGRESS_BYTES + 1:
                raise InvalidArgumentError(
                    f"{args.progress}, line {number}: longer than {MAX_PROGRESS_BYTES} bytes; "
                    "a progress event is one JSON object per line")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InvalidArgumentError(
                    f"{args.progress}, line {number}: not UTF-8 text (byte {err.start}); "
                    "expected one JSON progress event per line") from None
            if not line.strip():
                continue
            try:
                advisor.observe_progress(line)
            except TrilinkError as err:
                raise InvalidArgumentError(f"{args.progress}, line {number}: {err}") from None
            events += 1
    finally:
        if not stdin:
            handle.close()
    if not events:
        raise InvalidArgumentError(f"{args.progress} holds no progress event")
    report = advisor.report()
    if args.json:
        json.dump({"events": events, **report.to_dict()}, out, indent=2)
        out.write("\n")
    else:
        out.write(f"{events} progress events\n{report}\n")
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the ``trilink-spark`` command; returns the exit status."""
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["ysb"]:  # the benchmark application left the library
        sys.stderr.write("trilink-spark: error: the ysb command moved out of the package: run "
                         "`python -m benches.ysb` (same flags) from a checkout of the "
                         "repository\n")
        return 2
    args = parser.parse_args(given)
    stream = out if out is not None else sys.stdout
    try:
        if args.command == "balance":
            return _balance(args, stream)
        if args.command == "config":
            return run_config(args, stream)
        if args.command == "advise":
            return run_advise(args, stream)
        if args.command == "state":
            return run_state(args, stream)
        if args.command == "report":
            return run_report(args, stream)
    except TrilinkError as exc:
        sys.stderr.write(f"trilink-spark: error: {exc}\n")
        return 2
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
