"""The dashboard on a running query, in a real browser: a skewed stream on hash placement,
``tl.dashboard`` fed by Spark's listener and the run's history, Debian's Chromium driven by
Playwright. The page shows the partitions and the balance degree, follows the next batch, and
puts a ``request_swap`` and the swap it causes on its timeline.

``capture`` is also what makes the README's screenshot (``tools/readme_screenshot.py``)."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
pytest.importorskip("bokeh", reason="the [ui] extra (Bokeh) is not installed")

import trilink_spark as tl  # noqa: E402
from trilink_spark.advice import BottleneckAdvisor  # noqa: E402
from trilink_spark.ui.browser import PAGE_READY_JS, default_executable  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
TIMEOUT_MS = 60_000
if default_executable() is None:
    pytest.skip("no Chromium installed (Debian: apt-get install chromium)",
                allow_module_level=True)


def example() -> Any:
    """``examples/skew_dashboard.py``: the stream the page watches."""
    spec = importlib.util.spec_from_file_location("skew_dashboard",
                                                  ROOT / "examples" / "skew_dashboard.py")
    if spec is None or spec.loader is None:  # pragma: no cover - the file is in the repo
        raise FileNotFoundError("examples/skew_dashboard.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["skew_dashboard"] = module  # its processor pickles by value from here
    spec.loader.exec_module(module)
    return module


#: A named Bokeh model's source columns as the page holds them, as JSON (a table's source,
#: or a figure's first glyph's; "late#2": the figure "late"'s third glyph's).
COLUMNS_JS = """named => {
  const [name, glyph] = named.split("#");
  const model = Bokeh.documents[0].get_model_by_name(name);
  const data = (model.source ?? model.renderers[Number(glyph ?? 0)].data_source).data;
  const entries = data instanceof Map ? [...data.entries()] : Object.entries(data);
  return JSON.stringify(Object.fromEntries(entries.map(([k, v]) => [k, Array.from(v)])));
}"""


def shown(page: Any, name: str) -> dict[str, list[Any]]:
    return dict(json.loads(page.evaluate(COLUMNS_JS, name)))


def wait_for(page: Any, name: str, test: str) -> None:
    """Wait until ``test`` (a JS expression over ``d``, the model's columns) holds."""
    page.wait_for_function(
        f"() => {{ const d = JSON.parse(({COLUMNS_JS})({json.dumps(name)})); return {test}; }}",
        timeout=TIMEOUT_MS)


def cells(page: Any) -> list[str]:
    """The text of every table cell drawn on the page (Bokeh's shadow DOM pierced)."""
    return [t.strip() for t in page.locator(".slick-cell").all_inner_texts()]


def wait_for_cells(page: Any, *pairs: tuple[str, str]) -> list[str]:
    """Wait until each ``(label, value)`` is drawn as two neighbouring cells (the "latest
    batch" table's rows): what a person reads, not only what the page's data holds."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while True:
        drawn = cells(page)
        if all(any(a == label and b == value for a, b in zip(drawn, drawn[1:]))
               for label, value in pairs):
            return drawn
        if time.monotonic() > deadline:
            raise AssertionError(f"{pairs} not drawn; the tables show {drawn[:60]}")
        page.wait_for_timeout(100)


def capture(spark: Any, work: Path, png: Path) -> dict[str, Any]:
    """Run the example's stream under a dashboard, check the page in Chromium as it goes and
    save its screenshot to ``png``; returns what the page showed at each step."""
    stream = example().SkewedStream(spark, work)
    url = tl.dashboard(spark, runs={"clicks": stream.run}, refresh="300 milliseconds",
                       advisors=[BottleneckAdvisor(warmup_batches=1)],
                       title="clicks: one user sends 40 % of the rows")
    seen: dict[str, Any] = {"url": str(url)}
    try:
        for _ in range(3):
            stream.push()
        with sync_api.sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=default_executable(),
                                             headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto(url)
            page.wait_for_function(PAGE_READY_JS, timeout=TIMEOUT_MS)
            wait_for(page, "headline", "d.batch[0] === 2")
            for name, test in (("balance", "d.batch.at(-1) === 2"),
                               ("partition_rows", "d.batch.includes(2)"),
                               ("late", "d.batch.at(-1) === 2"),
                               ("late#2", "d.batch.at(-1) === 2"),
                               ("hot_keys", "d.key.length > 0"),
                               ("candidates", "d.strategy.length > 0")):
                wait_for(page, name, test)
            seen["first"] = {n: shown(page, n) for n in
                             ("headline", "latest_rows", "balance", "latest", "candidates",
                              "hot_keys", "late", "late#2", "partition_rows")}
            seen["visible"] = {  # drawn on the page (Bokeh's shadow DOM included)
                text: page.get_by_text(text).first.is_visible()
                for text in ("balance degree", "keyed bound", "least_count", "u0000")}
            stream.push()  # the next batch: the page follows without a reload
            wait_for(page, "headline", "d.batch[0] === 3")
            wait_for(page, "balance", "d.batch.at(-1) === 3")  # each source polls on its own
            seen["next"] = shown(page, "balance")
            seen["next_drawn"] = wait_for_cells(page, ("batch", "3"), ("strategy", "hash"))
            stream.run.request_swap("least_count", refit="none")
            wait_for(page, "timeline", "d.kind.includes('request')")
            seen["requested"] = shown(page, "timeline")
            stream.push()  # the swap batch
            wait_for(page, "timeline", "d.kind.includes('swap')")
            wait_for(page, "headline", "d.batch[0] === 4")
            for _ in range(2):
                stream.push()
            wait_for(page, "headline", "d.batch[0] === 6")
            wait_for(page, "balance", "d.batch.at(-1) === 6")
            wait_for(page, "advice", "d.source.includes('bottleneck') && d.source.includes('ds2')")
            seen["advice"] = shown(page, "advice")
            wait_for(page, "timeline_table", "d.kind.includes('swap')")
            seen["swapped"] = {n: shown(page, n) for n in ("timeline", "headline", "balance")}
            seen["swapped_drawn"] = wait_for_cells(page, ("batch", "6"),
                                                   ("strategy", "least_count"))
            page.wait_for_timeout(1000)  # three refreshes: every table shows batch 6
            page.screenshot(path=str(png), full_page=True)
            seen["errors"] = errors
            browser.close()
    finally:
        stream.stop()
        url.stop()
    seen["swaps"] = [r.moved_keys for r in stream.run.swaps]
    return seen


def test_the_page_follows_a_skewed_stream_and_its_swap(spark: Any, tmp_path: Path) -> None:
    png = tmp_path / "dashboard.png"
    seen = capture(spark, tmp_path / "work", png)
    first = seen["first"]
    assert seen["errors"] == []
    # the partitions: 4 bars of the latest batch's rows, the heat map's cells of 3 batches
    assert first["latest_rows"]["partition"] == [0, 1, 2, 3]
    assert sum(first["latest_rows"]["rows"]) == 4000
    assert sorted(set(first["partition_rows"]["partition"])) == [0, 1, 2, 3]
    assert sorted(set(first["partition_rows"]["batch"])) == [0, 1, 2]
    # the balance degree, as the page's table and series show it, equals min/max of the bars
    rows = first["latest_rows"]["rows"]
    degree = first["headline"]["balance_degree"][0]
    assert degree == pytest.approx(min(rows) / max(rows))
    assert first["balance"]["balance_degree"][-1] == pytest.approx(degree)
    assert degree < 0.35  # hash placement of a 40 % key
    assert all(seen["visible"].values()), seen["visible"]
    assert f"{degree:.3f}" in first["latest"]["value"]
    # the hottest user and where it lives; candidates scored on the batch's sample
    assert first["hot_keys"]["key"][0] == "u0000" and first["hot_keys"]["rows"][0] > 1400
    in_force = dict(zip(first["candidates"]["strategy"], first["candidates"]["in_force"]))
    assert in_force["hash"] and {"least_key", "least_count"} <= set(in_force)
    # late rows: the key watermark drops fewer than a partition watermark would
    assert 0 < sum(first["late"]["rows"]) < sum(first["late#2"]["rows"])
    # the next batch arrived without a reload
    assert seen["next"]["batch"][-1] == 3
    # the request, then the swap it caused, on the timeline
    requested = seen["requested"]
    assert "request" in requested["kind"] and "pending" in " ".join(requested["what"])
    timeline = seen["swapped"]["timeline"]
    swap = timeline["kind"].index("swap")
    assert timeline["batch"][swap] == 4 and timeline["moved_keys"][swap] == seen["swaps"][0] > 0
    assert timeline["moved_bytes"][swap] > 0 and timeline["pause_s"][swap] > 0
    assert seen["swapped"]["headline"]["strategy"] == ["least_count"]
    drawn = seen["swapped_drawn"]  # the tables were redrawn, not only their data replaced
    assert "swap" in drawn and str(seen["swaps"][0]) in drawn
    # least_count puts the heavy user alone: the balance degree rises after the swap
    after = seen["swapped"]["balance"]["balance_degree"][-1]
    assert after > degree + 0.1
    # the advisor, fed by the dashboard: its conclusion and DS2's parallelism, with reasons
    advice = seen["advice"]
    assert {"bottleneck", "ds2"} <= set(advice["source"])
    assert all(reason for reason in advice["reason"])
    assert png.stat().st_size > 50_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
