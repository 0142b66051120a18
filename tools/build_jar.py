"""Build ``trilink_spark/_internal/spark/jars/trilink-spark-jvm.jar`` from ``jvm/src``.

The jar holds the package's only JVM code (``trilinkspark.PreferredRDD``, the keyed stage's
preferred locations), compiled with ``javac --release 17`` against the installed PySpark's jars. It also records the SHA-256 of every source file
(``trilinkspark/SOURCES.sha256``), so that ``tests/test_jvm_jar.py`` can tell a jar that is
out of date with its source. The jar is written reproducibly (fixed times, sorted entries):
the same classes give the same bytes.

Usage: ``make jar`` (``.venv/bin/python tools/build_jar.py``). Needs a JDK 17 or later.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "jvm" / "src"
JAR = ROOT / "trilink_spark" / "_internal" / "spark" / "jars" / "trilink-spark-jvm.jar"
DIGESTS = "trilinkspark/SOURCES.sha256"
STAMP = (2026, 1, 1, 0, 0, 0)


def source_digests() -> str:
    """One line per source file, ``<sha256>  <path under jvm/src>``, sorted by path."""
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(SOURCES).as_posix()}"
             for p in sorted(SOURCES.rglob("*.java"))]
    return "\n".join(lines) + "\n"


def spark_classpath() -> str:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    wanted = [j for j in sorted(jars.glob("*.jar"))
              if j.is_file() and j.name.startswith(("spark-", "scala-"))]
    if not any(j.name.startswith("spark-core_") for j in wanted):
        raise SystemExit(f"build_jar: no spark-core jar in {jars}")
    return ":".join(str(j) for j in wanted)


def build(out: Path = JAR) -> Path:
    javac = shutil.which("javac")
    if javac is None:
        raise SystemExit("build_jar: javac not found (install a JDK 17, e.g. Debian's "
                         "openjdk-17-jdk-headless)")
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp)
        subprocess.run([javac, "--release", "17", "-Xlint:all,-path", "-Werror", "-cp",
                        spark_classpath(), "-d", str(classes),
                        *[str(p) for p in sorted(SOURCES.rglob("*.java"))]], check=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        entries = {"META-INF/MANIFEST.MF": b"Manifest-Version: 1.0\r\n"
                                           b"Created-By: trilink-spark tools/build_jar.py\r\n\r\n",
                   DIGESTS: source_digests().encode()}
        for cls in sorted(classes.rglob("*.class")):
            entries[cls.relative_to(classes).as_posix()] = cls.read_bytes()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as jar:
            for name in ["META-INF/MANIFEST.MF", *sorted(n for n in entries
                                                       if n != "META-INF/MANIFEST.MF")]:
                info = zipfile.ZipInfo(name, STAMP)
                info.compress_type = zipfile.ZIP_DEFLATED
                jar.writestr(info, entries[name])
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else JAR
    print(build(target))
