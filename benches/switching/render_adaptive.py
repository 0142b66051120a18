"""Print the RESULTS.md tables of bench_adaptive.py from benches/results/adaptive.json."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def main() -> None:
    data = json.loads((HERE / "results" / "adaptive.json").read_text())
    t9 = data["table9"]
    speeds = t9["speeds_per_min"]
    print("| configuration | " + " | ".join(f"v = {v}/min" for v in speeds) + " |")
    print("| --- |" + " --- |" * len(speeds))
    for name, row in t9["configs"].items():
        cells = [f"{row[str(v)]['efficiency']:.3f} / {row[str(v)]['switches']}" for v in speeds]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    print("| paper, 10^4 records/s | " + " | ".join(f"v = {v}/min" for v in speeds) + " |")
    print("| --- |" + " --- |" * len(speeds))
    for name, row in t9["paper"].items():
        print(f"| {name} | " + " | ".join(str(x) for x in row) + " |")
    print()
    quality = data["decision_quality"]
    print("| scenario | chosen (5 seeds) | chosen balance | best balance | worst chosen/best |")
    print("| --- | --- | --- | --- | --- |")
    by: dict[str, list[dict]] = {}
    for r in quality["rows"]:
        by.setdefault(r["scenario"], []).append(r)
    for name, rows in by.items():
        chosen = ", ".join(sorted({r["chosen"] for r in rows}))
        cb = " / ".join(f"{r['chosen_balance']:.3f}" for r in rows)
        bb = " / ".join(f"{r['best_balance']:.3f}" for r in rows)
        worst = min(r["ratio"] for r in rows)
        print(f"| {name} | {chosen} | {cb} | {bb} | {worst:.4f} |")
    print()
    o = data["sampling_overhead"]
    print(f"sampling: off {o['median_s']['off']:.2f} s, sync {o['median_s']['sync']:.2f} s "
          f"({o['sync_ratio']:.3f}x), async {o['median_s']['async']:.2f} s "
          f"({o['async_ratio']:.3f}x); observe_df alone {o['observe_df_s']:.2f} s")


if __name__ == "__main__":
    main()
