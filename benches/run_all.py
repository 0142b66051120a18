"""Run every benchmark under benches/ (each writes its JSON under benches/results/).

Benchmarks are discovered, not listed: every ``bench_*.py`` in a subfolder of benches/ (the
folders mirror the package's subpackages) runs, in path order. Give words to run only the
benchmarks whose path contains one of them::

    python benches/run_all.py              # everything
    python benches/run_all.py merge keyed  # benches/merge/* and benches/keyed/*
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def discover(words: list[str] | None = None) -> list[Path]:
    """Every benchmark script, in path order; only those matching ``words`` when given."""
    found = sorted(p for p in HERE.glob("*/bench_*.py") if p.is_file())
    if words:
        found = [p for p in found if any(w in str(p.relative_to(HERE)) for w in words)]
    return found


def main(argv: list[str]) -> int:
    scripts = discover(argv)
    if not scripts:
        print(f"no benchmark matches {argv}")
        return 1
    for script in scripts:
        print(f"== {script.relative_to(HERE)}", flush=True)
        saved = sys.argv
        sys.argv = [str(script)]
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            sys.argv = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
