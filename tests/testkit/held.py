"""Another process that holds a local copy open (:mod:`trilink_spark.state.held`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

HOLDER = textwrap.dedent("""
    import math, sys, time
    from trilink_spark.state.local import LocalState, head
    local = LocalState.open(sys.argv[1], "s", 0)
    for v in map(int, sys.argv[2].split(",")):
        key = b"\\x00\\x00\\x00\\x02\\x03" + str(v).encode()
        local.apply(v, f"child{v}", {}, [(key, head(math.inf, 1) + key)], [], {})
    if not local.release(keep=True):
        raise SystemExit("not held")
    print("held", flush=True)
    time.sleep(120)
""")


@contextmanager
def holding(root: Path, versions: Sequence[int]) -> Iterator[subprocess.Popen[str]]:
    """A child process that applies ``versions`` (one new key each) to partition 0's copy of
    store ``"s"`` under ``root``, then holds it open; killed on exit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(root),
                              ",".join(map(str, versions))], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        yield child
    finally:
        child.kill()
        child.wait()
