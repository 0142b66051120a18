"""The live page in a real headless Chromium: it draws the model's data and follows it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.is_file():
    pytest.skip(f"no Chromium at {CHROMIUM}", allow_module_level=True)

from trilink_spark.ui.browser import PAGE_READY_JS, screenshot  # noqa: E402
from trilink_spark.ui.model import DashboardModel  # noqa: E402
from trilink_spark.ui.page import write_report  # noqa: E402
from trilink_spark.ui.server import DashboardServer  # noqa: E402

TIMEOUT_MS = 10_000
TOKEN = "browser-token-0123456789"


def skewed(batch: int) -> dict[str, object]:
    """Partition 0 carries about 4 times each other partition's rows."""
    rows = [4000 + 10 * batch, 1000, 1100, 900]
    return {"v": 1, "run": "demo", "batch": batch, "time": 1795000000.0 + 5 * batch,
            "seconds": 0.8, "strategy": "hash", "partitions": 4, "rows": rows,
            "task_ms": [r / 25 for r in rows], "late": [0, 2, 0, 1],
            "late_partition": [5, 9, 3, 4],
            "hot_keys": [["u1", 3000, 0], [17, 120, 2]],
            "sample": {"keys": ["u1", "u2", "u3", "u4"], "weights": [3000, 1000, 1100, 900]}}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    opened = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    opened.on("pageerror", lambda err: errors.append(str(err)))
    yield opened
    opened.close()
    assert errors == []


#: The columns of a named model's source (a Map until the first poll, then a plain object).
COLUMNS_JS = """name => {
  const model = Bokeh.documents[0].get_model_by_name(name);
  const data = (model.source ?? model.renderers[0].data_source).data;
  const entries = data instanceof Map ? [...data.entries()] : Object.entries(data);
  return Object.fromEntries(entries.map(([k, v]) => [k, Array.from(v)]));
}"""


def source_data(page: Any, name: str) -> dict[str, list[Any]]:
    """A Bokeh model's data source columns, as the page holds them."""
    return dict(json.loads(page.evaluate(f"name => JSON.stringify(({COLUMNS_JS})(name))",
                                         name)))


def test_the_live_page_shows_the_runs_and_follows_them(page, browser, tmp_path):
    model = DashboardModel()
    for batch in range(1, 4):
        assert model.add_record(skewed(batch))
    with DashboardServer(model, refresh_ms=200, title="skew demo") as server:
        page.goto(server.url)
        page.wait_for_function(PAGE_READY_JS, timeout=TIMEOUT_MS)
        headline = source_data(page, "headline")
        assert headline["run"] == ["demo"] and headline["partitions"] == [4]
        assert headline["batch"] == [3]
        assert headline["balance_degree"] == [pytest.approx(900 / 4030)]
        cells = source_data(page, "partition_rows")
        assert sorted(set(cells["partition"])) == [0, 1, 2, 3]
        assert sorted(set(cells["batch"])) == [1, 2, 3]
        # the table cells as drawn (Playwright's CSS selectors pierce Bokeh's shadow DOM)
        texts = page.locator(".slick-cell").all_inner_texts()
        assert "demo" in texts and "0.223" in texts and "hash" in texts
        assert "u1" in texts  # the hottest key

        assert model.add_record(skewed(4))
        assert model.add_event({"kind": "request", "time": 1795000030.0,
                                "request_id": "req-42", "strategy": "least_count",
                                "num_partitions": None, "mode": "sync"})
        page.wait_for_function(
            f"""() => {{
              const columns = {COLUMNS_JS};
              return columns("headline").batch.includes(4)
                  && columns("timeline_table").kind.includes("request");
            }}""", timeout=TIMEOUT_MS)
        timeline = source_data(page, "timeline")
        assert timeline["kind"] == ["request"] and "req-42" in timeline["what"][0]
        page.get_by_text("request req-42", exact=False).first.wait_for(timeout=TIMEOUT_MS)
        assert source_data(page, "balance")["batch"] == [1, 2, 3, 4]

        shot = screenshot(server.url, tmp_path / "live.png", browser=browser)
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_the_page_sends_its_token_on_every_data_request(page):
    model = DashboardModel()
    assert model.add_record(skewed(1))
    with DashboardServer(model, refresh_ms=200, token=TOKEN) as server:
        page.goto(server.url)
        page.wait_for_function(PAGE_READY_JS, timeout=TIMEOUT_MS)
        assert source_data(page, "headline")["batch"] == [1]


def test_the_report_opens_without_any_network(page, tmp_path):
    out = write_report([skewed(b) for b in range(1, 4)], tmp_path / "report.html")
    asked: list[str] = []
    page.route("**/*", lambda route: (asked.append(route.request.url), route.continue_()))
    page.goto(out.as_uri())
    page.wait_for_function(PAGE_READY_JS, timeout=TIMEOUT_MS)
    assert [url for url in asked if not url.startswith("file://")] == []
    assert source_data(page, "headline")["batch"] == [3]
    assert source_data(page, "candidates")["strategy"] == ["hash", "least_key", "least_count"]


def test_the_first_response_shows_the_data_with_no_poll(page, tmp_path):
    # the page as a plain fetch gets it, and drawn with every poll refused: the data is in it
    from urllib.request import urlopen

    model = DashboardModel()
    for batch in range(1, 4):
        assert model.add_record(skewed(batch))
    with DashboardServer(model, refresh_ms=60_000) as server:
        with urlopen(server.url) as reply:
            html = reply.read().decode()
        assert '"demo"' in html and "4030" in html  # the run and partition 0's rows
        polls: list[str] = []

        def refuse(route: Any) -> None:
            polls.append(route.request.url)
            route.abort()

        page.route("**/data.json*", refuse)
        page.goto(server.url, wait_until="load")
        page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length"
                               " > 0 && Bokeh.documents[0].is_idle", timeout=TIMEOUT_MS)
        headline = source_data(page, "headline")
        assert headline["batch"] == [3] and headline["partitions"] == [4]
        assert source_data(page, "balance")["batch"] == [1, 2, 3]
        png = page.screenshot(path=str(tmp_path / "first.png"), full_page=True)
    # the balance line's colour (Category10's first, #1f77b4) is drawn: the plots hold data
    import io as _io

    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(_io.BytesIO(png)).convert("RGB")).astype(int)
    blue = int((np.abs(pixels - [0x1f, 0x77, 0xb4]).max(axis=2) < 12).sum())
    assert blue > 500, blue
    assert all("since=" in url for url in polls)  # any poll was refused, none was needed


def test_legends_sit_outside_the_plotted_area(page):
    model = DashboardModel()
    assert model.add_record(skewed(1))
    with DashboardServer(model) as server:
        page.goto(server.url)
        page.wait_for_function(PAGE_READY_JS, timeout=TIMEOUT_MS)
        places = page.evaluate("""() => ["balance", "late", "progress"].map(name => {
          const fig = Bokeh.documents[0].get_model_by_name(name);
          const kind = m => m.type ?? m.constructor.__name__;
          return {center: fig.center.filter(m => kind(m) === "Legend").length,
                  below: fig.below.filter(m => kind(m) === "Legend").length};
        })""")
    assert places == [{"center": 0, "below": 1}] * 3
