"""What users of ``tl.ship`` and the executors' check meet off the happy path, and the
README's packed-environment commands. The real cluster's share is in ``test_standalone.py``."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


README = Path(__file__).resolve().parent.parent.parent / "README.md"


def readme_cluster_commands() -> list[str]:
    section = README.read_text().split("## Running on a cluster", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert blocks, "the section has a bash block"
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_packs_the_environment_it_names():
    """``venv-pack`` packs ``$VIRTUAL_ENV`` unless ``-p`` names the environment: outside an
    activated environment it fails ('Current environment is not a virtual environment')."""
    calls = [c for line in readme_cluster_commands() for c in line.split("&&")
             if "venv-pack" in c and " -o " in c]
    assert calls
    for call in calls:
        words = shlex.split(call)
        assert "-p" in words or "--prefix" in words, call


def test_the_readme_spark_submit_starts_its_driver_in_client_mode(tmp_path):
    """With ``PYSPARK_PYTHON=./environment/bin/python`` alone, spark-submit in client mode
    runs the driver with that path too, where no archive is unpacked: 'Cannot run program
    "./environment/bin/python"'. The README's line must start the driver."""
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    if not ((java_home and Path(java_home, "bin", "java").is_file()) or shutil.which("java")):
        pytest.skip("spark-submit needs Java")
    line = next(ln for ln in readme_cluster_commands() if "spark-submit" in ln)
    words = shlex.split(line)
    at = words.index("spark-submit")
    assignments = dict(w.split("=", 1) for w in words[:at])
    assert assignments.get("PYSPARK_PYTHON") == "./environment/bin/python"
    (tmp_path / "env" / "bin").mkdir(parents=True)  # the environment the README packed
    os.symlink(sys.executable, tmp_path / "env" / "bin" / "python")
    (tmp_path / "job.py").write_text("import sys\nprint('driver ran', sys.executable)\n")
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**{k: v for k, v in os.environ.items()
              if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS")},
           **assignments}
    done = subprocess.run([str(submit), "--master", "local[1]", *words[at + 1:]], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "driver ran" in done.stdout, done.stderr[-1500:]
