"""The package's JVM helper: the jar in the package is built from ``jvm/src`` as it stands
(``make jar``), and its class is what the locality helper loads."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trilink_spark._internal.spark.locality import JAR

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_jar  # noqa: E402


def test_the_packaged_jar_is_built_from_the_sources_as_they_stand() -> None:
    assert JAR.is_file(), f"{JAR} is missing: run make jar"
    with zipfile.ZipFile(JAR) as jar:
        names = set(jar.namelist())
        recorded = jar.read(build_jar.DIGESTS).decode()
    assert "trilinkspark/PreferredRDD.class" in names
    assert recorded == build_jar.source_digests(), (
        "jvm/src changed since the jar was built: run make jar and commit the jar")


@pytest.mark.spark  # javac is a JVM: the Spark tier
@pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK (javac)")
def test_the_sources_compile_to_the_same_classes(tmp_path: Path) -> None:
    out = build_jar.build(tmp_path / "again.jar")
    with zipfile.ZipFile(out) as fresh, zipfile.ZipFile(JAR) as packaged:
        assert sorted(fresh.namelist()) == sorted(packaged.namelist())
        assert fresh.read(build_jar.DIGESTS) == packaged.read(build_jar.DIGESTS)


def test_class_file_targets_java_17() -> None:
    with zipfile.ZipFile(JAR) as jar:
        head = jar.read("trilinkspark/PreferredRDD.class")[:8]
    assert head[:4] == b"\xca\xfe\xba\xbe"
    assert int.from_bytes(head[6:8], "big") == 61  # class file version 61: Java 17
