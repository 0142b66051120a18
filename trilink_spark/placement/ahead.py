"""Ahead KeyBy, writing side: place keys on Kafka partitions when producing (Trilink paper, §4.3 (3)).

If producers already put every key on one Kafka partition, by a strategy that balances them,
the job that reads the topic (one Spark partition per Kafka partition) needs no keyed shuffle.
This module computes that placement: as the integer ``partition`` column Spark's Kafka sink
honours (:func:`ahead_key_by`), or inside producers outside Spark (:class:`KafkaPythonPartitioner`
for ``kafka-python``, :func:`confluent_partition` for ``confluent-kafka``), from the same
strategy objects.

A table strategy (LeastKey, LeastCount, random Weight) must give a key the same partition in
every run: :func:`ahead_key_by` loads its assignment from ``assignment_path`` before placing and
stores it back afterwards, so a key never changes Kafka partition between runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..columns import PARTITION_COL, check_user_columns
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, PartitionCountError
from .._internal.validation import refuse_streaming
from .._internal.io.files import resolve_filesystem
from ..kafka.source import register_kafka_source
from ..partitioners import Partitioner
from ..partitioners.core.persistence import read_strategy, write_strategy
from .key_by import resolve_strategy, with_partition_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "ahead_key_by",
    "load_assignment",
    "save_assignment",
    "KafkaPythonPartitioner",
    "confluent_partition",
]

logger = logging.getLogger(__name__)

#: The column Spark's Kafka sink reads the target partition from.
KAFKA_PARTITION_COL = "partition"


def load_assignment(path: str, filesystem: Any = None) -> Partitioner | None:
    """The strategy stored at ``path`` (local path or URI), or None when there is none."""
    filesystem, inner = resolve_filesystem(path, filesystem)
    return read_strategy(filesystem, inner)


def save_assignment(strategy: Partitioner, path: str, filesystem: Any = None) -> None:
    """Store ``strategy`` (table included) at ``path``, replacing it atomically."""
    filesystem, inner = resolve_filesystem(path, filesystem)
    parent = inner.rsplit("/", 1)[0] if "/" in inner else "."
    filesystem.create_dir(parent, recursive=True)
    write_strategy(filesystem, inner, strategy)


def ahead_key_by(
    df: DataFrame,
    key: str,
    strategy: str | Partitioner = "hash",
    num_partitions: int | None = None,
    *,
    assignment_path: str | None = None,
    filesystem: Any = None,
    overwrite: bool = False,
    null_policy: str | None = None,
) -> DataFrame:
    """Add the Kafka ``partition`` column: where the strategy puts each row's key.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        Rows to write with ``df.write.format("kafka")`` (they keep their order; no shuffle).
    key : str
        Key column (the value the strategy places, not the serialised Kafka key).
    strategy : str or Partitioner
        As in :func:`~trilink_spark.key_by`; ``num_partitions`` must be the topic's partition
        count.
    assignment_path : str, optional
        Where a table strategy's assignment lives between runs (local path or URI). Loaded
        first when present; keys it does not know are placed and the result stored back.
        Required for a table strategy given by name.
    overwrite : bool
        Replace an existing ``partition`` column (otherwise refused).
    null_policy : {"group", "error", "partition0"}, optional
        As in :func:`~trilink_spark.key_by`: by default a null key goes to Kafka partition
        ``pmod(42, n)``, where Spark's hash puts it.

    Returns
    -------
    pyspark.sql.DataFrame
        ``df`` plus the int column ``partition``.

    Notes
    -----
    Cost: no shuffle. The id is computed in the JVM (a broadcast join for table strategies);
    a table strategy also counts the keys of ``df`` once (``fit="full"``). On a streaming
    ``df`` nothing is counted: a table strategy must come learnt (a fitted object, or the
    assignment stored at ``assignment_path`` by a batch run), and keys it does not know get
    Spark's hash placement. Registers the
    ``trilink-kafka`` source with the session, so the result can be written without Spark's
    JVM Kafka connector (:func:`~trilink_spark.kafka.write_kafka`).

    Examples
    --------
    >>> from trilink_spark.placement import ahead_key_by
    >>> out = ahead_key_by(events, "user", "least_count", 8,
    ...                       assignment_path="/data/user-assignment.json")  # doctest: +SKIP
    >>> out.selectExpr("CAST(user AS STRING) AS key", "payload AS value", "partition") \\
    ...    .write.format("kafka").option("topic", "events").save()  # doctest: +SKIP
    """
    if KAFKA_PARTITION_COL in df.columns and not overwrite:
        raise InvalidArgumentError(
            "df already has a 'partition' column; pass overwrite=True to replace it"
        )
    stored = load_assignment(assignment_path, filesystem) if assignment_path else None
    if stored is not None:
        logger.info("ahead_key_by: using the %s assignment stored at %s",
                    stored.strategy_name, assignment_path)
        if num_partitions is not None and num_partitions != stored.num_partitions:
            raise InvalidArgumentError(
                f"the assignment at {assignment_path} places keys on {stored.num_partitions} "
                f"partitions; num_partitions={num_partitions} would move keys"
            )
        strategy = stored
    check_user_columns(df)
    if df.isStreaming:
        resolved = _streaming_strategy(df, key, strategy, num_partitions, null_policy)
    else:
        resolved = resolve_strategy(df, key, strategy, num_partitions,
                                    null_policy=null_policy).partitioner
    if resolved.is_stateful and not df.isStreaming:
        if assignment_path is not None:
            save_assignment(resolved, assignment_path, filesystem)
        elif not isinstance(strategy, Partitioner):
            raise InvalidArgumentError(
                f"{resolved.strategy_name} remembers where it put each key; give "
                "assignment_path=... so keys keep their Kafka partition between runs"
            )
    register_kafka_source(df.sparkSession)  # so .write.format("trilink-kafka") works next
    placed = with_partition_id(df.drop(KAFKA_PARTITION_COL) if overwrite else df, key, resolved)
    result: DataFrame = placed.withColumnRenamed(PARTITION_COL, KAFKA_PARTITION_COL)
    return result


def _streaming_strategy(df: DataFrame, key: str, strategy: str | Partitioner,
                        num_partitions: int | None, null_policy: str | None) -> Partitioner:
    """A stream cannot be counted first: tables must come learnt (an object or a stored
    assignment); keys they do not know get Spark's hash placement, the same in every batch."""
    if isinstance(strategy, str) and strategy.lower() == "auto":
        refuse_streaming(df, "ahead_key_by(strategy='auto')", "'auto' samples the data first",
                         "Name a strategy or pass a fitted one")
    resolved = resolve_strategy(df, key, strategy, num_partitions, fit="none",
                                null_policy=null_policy).partitioner
    if resolved.is_stateful and len(resolved) == 0:  # type: ignore[arg-type]
        refuse_streaming(df, f"ahead_key_by(strategy={resolved.strategy_name!r}) with no "
                         "table learnt", "a table strategy learns its table by counting the "
                         "keys, which a stream cannot do when the call is made", "Run "
                         "ahead_key_by once on a batch of the data with assignment_path=..., "
                         "or pass a fitted strategy")
    return resolved


class KafkaPythonPartitioner:
    """A ``kafka-python`` partitioner: ``KafkaProducer(partitioner=KafkaPythonPartitioner(p))``.

    Parameters
    ----------
    strategy : Partitioner
        The same strategy (and table) the Spark side uses; its partition count must equal the
        topic's.
    key_decoder : callable, optional
        Kafka key bytes to the value the strategy places, e.g. ``lambda b: int(b)`` when Spark
        placed a long column written as its decimal string. Default: UTF-8 text. A key passed
        to ``send`` as a non-bytes value (with a ``key_serializer``) is placed as it is.

    Notes
    -----
    Works with kafka-python 3 (``partition(topic, key, serialized_key, value,
    serialized_value, cluster)``; registered as a ``kafka.partitioner.Partitioner``) and 2
    (called as ``partitioner(key_bytes, all_partitions, available)``). A topic whose partition
    count differs from the strategy's is refused
    (:class:`~trilink_spark.errors.PartitionCountError`): the keys would not land where the
    reading job expects them. Keyless records go to partition 0.

    Examples
    --------
    >>> import trilink_spark as tl
    >>> p = tl.LeastKeyPartitioner(4).fit(["a", "b", "c", "d"])
    >>> KafkaPythonPartitioner(p)(b"c", [0, 1, 2, 3], [0, 1, 2, 3])
    2
    """

    def __init__(self, strategy: Partitioner,
                 key_decoder: Callable[[bytes], Any] | None = None) -> None:
        if not isinstance(strategy, Partitioner):
            raise InvalidArgumentTypeError(
                f"strategy must be a Partitioner, got {type(strategy).__name__}")
        self.strategy = strategy.unwrap()
        self.key_decoder = key_decoder or (lambda raw: raw.decode("utf-8"))
        _register_with_kafka_python()

    def _place(self, key: Any, partitions: Sequence[int]) -> int:
        ordered = sorted(partitions)
        if len(ordered) != self.strategy.num_partitions:
            raise PartitionCountError(
                f"the topic has {len(ordered)} partitions but the strategy places keys on "
                f"{self.strategy.num_partitions}; create the topic with as many partitions"
            )
        if key is None:
            return ordered[0]
        value = self.key_decoder(bytes(key)) if isinstance(key, (bytes, bytearray)) else key
        return ordered[self.strategy.partition(value)]

    def partition(self, topic: str, key: Any, serialized_key: bytes | None = None,
                  value: Any = None, serialized_value: bytes | None = None,
                  cluster: Any = None) -> int:
        """kafka-python 3's partitioner method (the cluster gives the topic's partitions)."""
        if cluster is None:  # kafka-python 2's legacy signature: (topic, key_bytes, cluster)
            cluster, key = serialized_key, key
        partitions = cluster.partitions_for_topic(topic)
        if not partitions:
            raise InvalidArgumentError(f"topic {topic!r} is not in the producer's metadata")
        return self._place(key if key is not None else serialized_key, partitions)

    def __call__(self, key: bytes | None, all_partitions: Sequence[int],
                 available: Sequence[int] | None = None) -> int:
        return self._place(key, all_partitions)


def _register_with_kafka_python() -> None:
    """Make kafka-python 3 accept the class as one of its partitioners (no-op without it)."""
    try:
        from kafka.partitioner import Partitioner as KafkaPartitioner
    except ImportError:  # pragma: no cover - kafka-python absent or 2.x
        return
    KafkaPartitioner.register(KafkaPythonPartitioner)


def confluent_partition(strategy: Partitioner, key: Any, num_partitions: int | None = None) -> int:
    """The partition for ``key`` (the value, not its bytes), for ``confluent_kafka``:
    ``producer.produce(topic, value, key=str(k), partition=confluent_partition(p, k))``.

    ``num_partitions`` (the topic's, from ``list_topics``) is checked against the strategy's.
    """
    p = strategy.unwrap()
    if num_partitions is not None and num_partitions != p.num_partitions:
        raise PartitionCountError(
            f"the topic has {num_partitions} partitions but the strategy places keys on "
            f"{p.num_partitions}"
        )
    return p.partition(key)
