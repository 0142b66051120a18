"""``tl.get_session`` keeps a local session on the loopback address."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, os
import trilink_spark as tl
spark = tl.get_session("local[1]", extra_conf={"spark.app.name": "bind-check"})
conf = spark.sparkContext.getConf()
print(json.dumps({"host": conf.get("spark.driver.host"),
                  "bind": conf.get("spark.driver.bindAddress"),
                  "env": os.environ.get("SPARK_LOCAL_IP")}))
spark.stop()
"""


@pytest.mark.spark
def test_a_local_session_binds_the_loopback_address() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_LOCAL_IP", "SPARK_REMOTE")}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"host": "127.0.0.1", "bind": "127.0.0.1", "env": "127.0.0.1"}
    # Spark's warning that it picked a non-loopback interface's address is gone
    assert "instead (on interface" not in done.stderr
