"""The ``trilink-kafka`` connector: Kafka read and written by PySpark without the JVM connector.

One Spark partition per Kafka partition on reads; the ``partition`` column honoured on writes.
The data source classes need PySpark and are imported when the source is registered.
"""

from .client import SOURCE_NAME
from .source import read_kafka, register_kafka_source, write_kafka

__all__ = ["SOURCE_NAME", "read_kafka", "register_kafka_source", "write_kafka"]
