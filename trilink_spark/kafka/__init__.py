"""The ``trilink-kafka`` connector: Kafka read and written by PySpark without the JVM connector.

One Spark partition per Kafka partition on reads; the ``partition`` column honoured on writes.
The data source classes need PySpark and are imported when the source is registered.
"""

from .admission import TRIGGER_CAP_OPTION, read_trigger_cap, write_trigger_cap
from .client import SOURCE_NAME
from .source import read_kafka, register_kafka_source, write_kafka

__all__ = ["SOURCE_NAME", "TRIGGER_CAP_OPTION", "read_kafka", "read_trigger_cap",
           "register_kafka_source", "write_kafka", "write_trigger_cap"]
