"""The driver killed with SIGKILL mid-stream, then restarted from its checkpoint: every
batch's output and every key's count are exact (the local store, swaps included)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trilink_spark.keyed.run.streaming import read_state_values
from trilink_spark.state import KeyedStateStore

pytestmark = pytest.mark.spark  # each test runs two Spark drivers in subprocesses

DRIVER = Path(__file__).with_name("crash_driver.py")
BATCHES = 6


def inputs(work: Path, seed: int) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    (work / "in").mkdir(parents=True)
    frames = []
    for b in range(BATCHES):
        keys = rng.integers(0, 30, 50)
        frame = pd.DataFrame({"k": [f"k{k:02d}" for k in keys],
                              "t": np.arange(50, dtype=float) + 50 * b})
        path = work / "in" / f"part-{b:03d}.parquet"
        frame.to_parquet(path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source's order
        frames.append(frame)
    return frames


def drive(work: Path, step: str, at: int, swap_at: int, partitions: int = 3) -> int:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, str(DRIVER), str(work), step, str(at), str(swap_at),
                           str(partitions)], env=env, capture_output=True, timeout=600)
    return done.returncode


# The kills at a plain batch's sink and commit (output written / state committed, Spark's
# commit not) are the same two points as at a swap batch below, which the SIGKILL runs cover
# (each case starts two Spark drivers); an in-process replay of a plain batch is tested in
# test_keyed_stream.py.
@pytest.mark.parametrize("step,at,swap_at,restart", [
    ("sink", 2, 1, 3),      # killed in the middle of a swap batch (3 -> 5 partitions)
    ("commit", 2, 1, 3),    # killed after the swap committed
    ("sink", 2, -1, 5),     # the killed batch replayed as a swap: a restart with 5 partitions
])
def test_sigkill_then_restart_gives_exact_outputs_and_counts(tmp_path: Path, step: str,
                                                             at: int, swap_at: int,
                                                             restart: int) -> None:
    frames = inputs(tmp_path, seed=at * 10 + swap_at + 2)
    assert drive(tmp_path, step, at, swap_at) == -9  # killed
    assert drive(tmp_path, "none", -1, -1, restart) == 0  # restarted
    running: dict[str, int] = {}
    for b, frame in enumerate(frames):
        counts = frame["k"].value_counts()
        for key, n in counts.items():
            running[key] = running.get(key, 0) + int(n)
        out = pd.read_parquet(tmp_path / "out" / f"b{b}.parquet")
        assert dict(zip(out["k"], out["n"])) == {k: running[k] for k in counts.index}, b
    store = KeyedStateStore.open_existing(str(tmp_path / "state"))
    assert {k: v["n"] for k, v in read_state_values(store).items()} == running
    if swap_at >= 0 or restart != 3:
        assert store.committed_layout()[1] == 5  # the rescale survived the kill and restart
