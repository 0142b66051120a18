"""The snapshot writer runs at the lowest CPU priority, in its session's group too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trilink_spark.keyed.durable.snapshot_writer import background_priority


def test_a_writer_has_the_lowest_priority_in_its_own_session_group() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            start_new_session=True, preexec_fn=background_priority)
    try:
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 19
        assert os.getsid(proc.pid) != os.getsid(0)  # a session of its own, as the writer's
        group = Path(f"/proc/{proc.pid}/autogroup")
        if group.exists():  # a kernel with autogroups: the group's nice counts, not the own
            assert group.read_text().split()[-1] == "19", group.read_text()
            assert Path("/proc/self/autogroup").read_text() != group.read_text()
    finally:
        proc.kill()
        proc.wait()
