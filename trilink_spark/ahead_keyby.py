"""Ahead KeyBy, writing side: place keys on Kafka partitions when producing (seed 002 §4.3 (3)).

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

import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgumentError, InvalidArgumentTypeError
from .keyed_state import resolve_filesystem
from .partitioners import Partitioner
from .placement import PARTITION_COL, resolve_strategy, with_partition_id

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
    from pyarrow import fs as pafs

    filesystem, inner = resolve_filesystem(path, filesystem)
    if filesystem.get_file_info(inner).type != pafs.FileType.File:
        return None
    with filesystem.open_input_stream(inner) as f:
        return Partitioner.from_dict(json.loads(f.read().decode("utf-8")))


def save_assignment(strategy: Partitioner, path: str, filesystem: Any = None) -> None:
    """Store ``strategy`` (table included) at ``path``, replacing it atomically."""
    import uuid

    filesystem, inner = resolve_filesystem(path, filesystem)
    parent = inner.rsplit("/", 1)[0] if "/" in inner else "."
    filesystem.create_dir(parent, recursive=True)
    temporary = f"{inner}.tmp-{uuid.uuid4().hex}"
    with filesystem.open_output_stream(temporary) as f:
        f.write(strategy.to_json().encode("utf-8"))
    filesystem.move(temporary, inner)


def ahead_key_by(
    df: DataFrame,
    key: str,
    strategy: str | Partitioner = "hash",
    num_partitions: int | None = None,
    *,
    assignment_path: str | None = None,
    filesystem: Any = None,
    overwrite: bool = False,
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

    Returns
    -------
    pyspark.sql.DataFrame
        ``df`` plus the int column ``partition``.

    Notes
    -----
    Cost: no shuffle. The id is computed in the JVM (a broadcast join for table strategies);
    a table strategy also counts the keys of ``df`` once (``fit="full"``).

    Examples
    --------
    >>> out = tl.ahead_key_by(events, "user", "least_count", 8,
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
    resolved = resolve_strategy(df, key, strategy, num_partitions).partitioner
    if resolved.is_stateful:
        if assignment_path is not None:
            save_assignment(resolved, assignment_path, filesystem)
        elif not isinstance(strategy, Partitioner):
            raise InvalidArgumentError(
                f"{resolved.strategy_name} remembers where it put each key; give "
                "assignment_path=... so keys keep their Kafka partition between runs"
            )
    placed = with_partition_id(df.drop(KAFKA_PARTITION_COL) if overwrite else df, key, resolved)
    result: DataFrame = placed.withColumnRenamed(PARTITION_COL, KAFKA_PARTITION_COL)
    return result


class KafkaPythonPartitioner:
    """A ``kafka-python`` partitioner: ``KafkaProducer(partitioner=KafkaPythonPartitioner(p))``.

    Parameters
    ----------
    strategy : Partitioner
        The same strategy (and table) the Spark side uses; its partition count must equal the
        topic's.
    key_decoder : callable, optional
        Serialised Kafka key (bytes) to the value the strategy places, e.g.
        ``lambda b: int(b)`` when Spark placed a long column written as its decimal string.
        Default: UTF-8 text.

    Notes
    -----
    kafka-python calls it as ``partitioner(key_bytes, all_partitions, available)``. A topic
    whose partition count differs from the strategy's is refused (``InvalidArgumentError``):
    the keys would not land where the reading job expects them. Keyless records go to
    partition 0.
    """

    def __init__(self, strategy: Partitioner,
                 key_decoder: Callable[[bytes], Any] | None = None) -> None:
        if not isinstance(strategy, Partitioner):
            raise InvalidArgumentTypeError(
                f"strategy must be a Partitioner, got {type(strategy).__name__}")
        self.strategy = strategy.unwrap()
        self.key_decoder = key_decoder or (lambda raw: raw.decode("utf-8"))

    def __call__(self, key: bytes | None, all_partitions: Sequence[int],
                 available: Sequence[int] | None = None) -> int:
        partitions = sorted(all_partitions)
        if len(partitions) != self.strategy.num_partitions:
            raise InvalidArgumentError(
                f"the topic has {len(partitions)} partitions but the strategy places keys on "
                f"{self.strategy.num_partitions}; create the topic with as many partitions"
            )
        if key is None:
            return partitions[0]
        return partitions[self.strategy.partition(self.key_decoder(key))]


def confluent_partition(strategy: Partitioner, key: Any, num_partitions: int | None = None) -> int:
    """The partition for ``key`` (the value, not its bytes), for ``confluent_kafka``:
    ``producer.produce(topic, value, key=str(k), partition=confluent_partition(p, k))``.

    ``num_partitions`` (the topic's, from ``list_topics``) is checked against the strategy's.
    """
    p = strategy.unwrap()
    if num_partitions is not None and num_partitions != p.num_partitions:
        raise InvalidArgumentError(
            f"the topic has {num_partitions} partitions but the strategy places keys on "
            f"{p.num_partitions}"
        )
    return p.partition(key)
