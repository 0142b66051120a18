"""``python -m benches.ysb``: run the Yahoo Streaming Benchmark (see :mod:`benches.ysb.cli`)."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
