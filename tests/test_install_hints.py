"""The install lines the README and the errors give work for this installation."""

from __future__ import annotations

import re
from pathlib import Path

import trilink_spark
from trilink_spark._internal.install import extra_requirements, install_hint

ROOT = Path(__file__).resolve().parents[1]


def test_every_extra_of_setup_cfg_is_named_in_the_readme_install_table() -> None:
    cfg = (ROOT / "setup.cfg").read_text()
    block = cfg.split("[options.extras_require]", 1)[1].split("\n[", 1)[0]
    extras = re.findall(r"^([a-z]+) =", block, re.M)
    readme = (ROOT / "README.md").read_text()
    table = readme.split("### Install", 1)[1].split("\n## ", 1)[0]
    assert extras and all(f"| `{e}` |" in table for e in extras), extras
    # the wheel the README installs is the one `python -m build` makes of this version
    assert f"dist/trilink_spark-{trilink_spark.__version__}-py3-none-any.whl" in table


def test_a_hint_names_the_extra_s_own_requirements_and_the_clone() -> None:
    assert extra_requirements("plot") == ["matplotlib>=3.7"]
    hint = install_hint("plot")
    assert hint.startswith("pip install 'matplotlib>=3.7'") and "[plot]" in hint
    assert f"pip install -e '{ROOT}[plot]'" in hint  # this checkout is a path install
    assert set(extra_requirements("kafka")) == {"kafka-python<4,>=2.0.2", "crc32c>=2.3"}
    assert extra_requirements("no-such-extra") == []
    assert install_hint("no-such-extra", "x>=1").startswith("pip install 'x>=1'")
    assert "trilink-spark[" not in install_hint("ui")  # the index form does not work yet
