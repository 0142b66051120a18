"""Fixtures of the keyed tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def local_root(spark: Any, tmp_path: Path) -> Iterator[Path]:
    """The executors' local directory for one test (``spark.trilink.state.localDir``)."""
    root = tmp_path / "local"
    spark.conf.set("spark.trilink.state.localDir", str(root))
    try:
        yield root
    finally:
        spark.conf.unset("spark.trilink.state.localDir")
