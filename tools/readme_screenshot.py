"""Make the README's dashboard screenshot (docs/dashboard.png) with the browser test's code.

Runs ``tests/ui/test_dashboard_stream.py``'s ``capture``: the example's skewed stream on
local Spark under ``tl.dashboard``, a swap to ``least_count`` half way, the page in Debian's
Chromium, then the PNG. Run: ``python tools/readme_screenshot.py [out.png]``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "ui"))
sys.path.insert(0, str(ROOT))

import trilink_spark as tl  # noqa: E402
from test_dashboard_stream import capture  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "dashboard.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    spark = tl.get_session("local[2]", shuffle_partitions=4)
    with tempfile.TemporaryDirectory(prefix="trilink-screenshot-") as work:
        seen = capture(spark, Path(work), out)
    print(f"wrote {out}: swap moved {seen['swaps']} keys; page errors {seen['errors']}")


if __name__ == "__main__":
    main()
