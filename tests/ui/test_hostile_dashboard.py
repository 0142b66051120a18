"""Hostile probes of the live dashboard: overflowing figures, the server's guards over raw
sockets, the token kept out of logs and reprs, ports bound again after stop, ``tl.dashboard``'s
argument errors, the feed on damaged and deleted state paths, bounded memory, and markup in
every text the page shows, checked in a real Chromium."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

pytest.importorskip("bokeh", reason="the [ui] extra (Bokeh) is not installed")

import trilink_spark as tl  # noqa: E402
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError  # noqa: E402
from trilink_spark.keyed.records.history import history_batches, record_batch  # noqa: E402
from trilink_spark.state import KeyedStateStore  # noqa: E402
from trilink_spark.ui.model import DashboardModel  # noqa: E402
from trilink_spark.ui.page import write_report  # noqa: E402
from trilink_spark.ui.server import DashboardServer  # noqa: E402

TOKEN = "hostile-token-0123456789"
CHROMIUM = Path("/usr/bin/chromium")
MARKUP = '<img src=x onerror="window.__pwned=1">'
CLOSER = "</script><script>window.__pwned=2</script>"


def record(batch: int, run: str = "run", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"v": 1, "run": run, "batch": batch,
                            "time": 1795000000.0 + batch, "seconds": 0.1, "strategy": "hash",
                            "partitions": 2, "rows": [30, 10]}
    body.update(fields)
    return body


def raw_request(port: int, data: bytes, timeout: float = 5.0) -> tuple[int, bytes]:
    """Send ``data`` as it is; the reply's status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(data)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def get(port: int, target: str, host: str | None = None, extra: str = "",
        method: str = "GET") -> tuple[int, bytes]:
    host_line = "" if host is None else f"Host: {host}\r\n"
    return raw_request(port, f"{method} {target} HTTP/1.1\r\n{host_line}{extra}\r\n".encode())


# ---------------------------------------------------------------------------- the data

def test_overflowing_figures_are_sent_as_null_not_a_failed_page() -> None:
    model = DashboardModel()
    huge = [1e308, 1e308]
    assert model.add_record(record(0, rows=huge, task_ms=huge, late=huge, late_partition=huge,
                                   sample={"keys": ["a", "b"], "weights": huge}))
    assert model.add_event({"kind": "advice", "time": 1.7e308, "batch": None, "source": "ds2",
                            "advice": "x", "reason": "y"})
    with DashboardServer(model) as server:
        assert server.port is not None
        for name in ("balance", "late_key", "advice", "bound", "cells"):
            status, body = get(server.port, f"/data/{name}.json", f"127.0.0.1:{server.port}")
            assert status == 200, name
            json.loads(body)  # strict JSON: no NaN, no Infinity
        _, body = get(server.port, "/data/late_key.json", f"127.0.0.1:{server.port}")
        assert json.loads(body) == {"batch": [0], "rows": [None]}  # the sum overflowed
        _, body = get(server.port, "/data/advice.json", f"127.0.0.1:{server.port}")
        assert json.loads(body)["time_ms"] == [None]


def test_the_model_stays_bounded_whatever_it_is_fed() -> None:
    model = DashboardModel(history=50, max_runs=4)
    for i in range(100_000):
        if i % 10:  # three steady runs, and a new run every 1,000 records
            run = f"r{i % 3}" if i % 1000 != 1 else f"new{i}"
            model.add_record(record(i, run=run, partitions=1, rows=[i]))
        else:
            model.add_event({"kind": "progress", "time": float(i), "batch": i, "query": "q",
                             "input_rows": 1, "duration_ms": 1})
    assert len(model.runs) == 4 and {"r0", "r1", "r2"} <= set(model.runs)
    assert all(len(model.batches(f"r{k}")) == 50 for k in range(3))
    assert model.events()["progress"] == 50
    size = sum(len(v) for v in model.snapshot_json().values())
    assert size < 20_000


def test_a_snapshot_of_200_batches_of_64_partitions_is_quick() -> None:
    model = DashboardModel(history=200)
    for b in range(200):
        model.add_record(record(b, partitions=64, rows=list(range(64)), task_ms=[1.5] * 64))
    started = time.perf_counter()
    encoded = model.snapshot_json()
    elapsed = time.perf_counter() - started
    assert len(json.loads(encoded["cells"])["rows"]) == 200 * 64
    assert elapsed < 0.5
    model.add_record(record(200, partitions=64, rows=[1] * 64))  # a new version: rebuilt
    assert json.loads(model.snapshot_json()["headline"])["batch"] == [200]


# ---------------------------------------------------------------------------- the server

def test_the_host_guard_and_methods_over_raw_requests() -> None:
    with DashboardServer(DashboardModel()) as server:
        port = server.port
        assert port is not None
        assert get(port, "/data/cells.json", f"127.0.0.1:{port}")[0] == 200
        assert get(port, "/data/cells.json", f"[::1]:{port}")[0] == 200
        assert get(port, "/data/cells.json", f"LOCALHOST:{port}")[0] == 200
        assert get(port, "/data/cells.json", None)[0] == 403  # no Host
        assert get(port, "/data/cells.json", "evil.example")[0] == 403
        assert get(port, "/data/cells.json", f"evil.example:{port}")[0] == 403
        assert get(port, "/data/cells.json", "127.0.0.1:1")[0] == 403
        # an absolute-form target is judged by the Host header, not by the URL's host
        assert get(port, "http://evil.example/data/cells.json", "evil.example")[0] == 403
        status, body = get(port, "/data/cells.json", f"127.0.0.1:{port}", method="HEAD")
        assert status == 200 and body == b""
        for method in ("POST", "PUT", "DELETE", "OPTIONS", "TRACE"):
            status, _ = get(port, "/", f"127.0.0.1:{port}", "Content-Length: 5\r\n\r\nhello"
                            if method == "POST" else "", method=method)
            assert status == 405, method
        assert get(port, "/" + "a" * 70_000, f"127.0.0.1:{port}")[0] == 414
        many = "".join(f"X-{i}: y\r\n" for i in range(200))
        assert get(port, "/", f"127.0.0.1:{port}", many)[0] == 431


@pytest.mark.parametrize("target", [
    "/static/../page.py", "/static/%2e%2e/page.py", "/static/%252e%252e/page.py",
    "/static/js/../js/bokeh.min.js", "/static//etc/passwd", "/static/%2Fetc%2Fpasswd",
    "/static/js%2F..%2F..%2F..%2Fui%2Fpage.py", "/static/js/bokeh.min.js%00.png",
    "/static/", "/static/js"])
def test_static_paths_never_leave_bokehs_folder(target: str) -> None:
    with DashboardServer(DashboardModel()) as server:
        assert server.port is not None
        assert get(server.port, target, f"127.0.0.1:{server.port}")[0] == 404
        assert get(server.port, "/static/js/bokeh.min.js",
                   f"127.0.0.1:{server.port}")[0] == 200


def test_the_token_is_required_and_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="trilink_spark.ui")
    with DashboardServer(DashboardModel(), token=TOKEN) as server:
        port = server.port
        assert port is not None
        host = f"127.0.0.1:{port}"
        assert get(port, "/data/cells.json", host)[0] == 403
        assert get(port, f"/data/cells.json?token={TOKEN[:-1]}X", host)[0] == 403
        assert get(port, "/data/cells.json?token=%ff%fe", host)[0] == 403
        assert get(port, f"/data/cells.json?token={TOKEN}", host)[0] == 200
        assert get(port, "/data/cells.json", host, f"Authorization: Bearer {TOKEN}\r\n")[0] == 200
        status, page = get(port, f"/?token={TOKEN}", host)
        assert status == 200 and b"http://" not in page  # every URL a path of this server
    requests = [r.getMessage() for r in caplog.records if "GET /" in r.getMessage()]
    assert len(requests) == 6 and all("token=***" in m or "token" not in m for m in requests)
    assert TOKEN not in caplog.text and TOKEN[:-1] not in caplog.text  # near misses too


def test_one_slow_client_does_not_block_the_others_nor_stop() -> None:
    server = DashboardServer(DashboardModel())
    server.start()
    port = server.port
    assert port is not None
    slow = socket.create_connection(("127.0.0.1", port))
    try:
        slow.sendall(b"GET /data/cells.json HTTP/1.1\r\n")  # and then nothing
        started = time.perf_counter()
        for _ in range(20):
            assert get(port, "/data/cells.json", f"127.0.0.1:{port}")[0] == 200
        assert time.perf_counter() - started < 5
        started = time.perf_counter()
        server.stop()
        assert time.perf_counter() - started < 2
        server.stop()  # twice: nothing
        assert server.url is None and server.port is None
        again = DashboardServer(DashboardModel(), port=port)  # bound again at once
        again.start()
        assert again.port == port
        again.stop()
    finally:
        slow.close()


def test_two_servers_at_once_and_a_busy_port_is_a_typed_error() -> None:
    with DashboardServer(DashboardModel()) as first, DashboardServer(DashboardModel()) as second:
        assert first.port != second.port
        busy = DashboardServer(DashboardModel(), port=first.port or 0)
        with pytest.raises(InvalidArgumentError, match=f"{first.port}.*port=0"):
            busy.start()
        assert busy.url is None
    with pytest.raises(InvalidArgumentError, match="not one of this machine's"):
        DashboardServer(DashboardModel(), host="192.0.2.1", token=TOKEN).start()


# ---------------------------------------------------------------------------- tl.dashboard

def history_path(tmp_path: Path, batches: int, keep: int = 1000) -> KeyedStateStore:
    """A state path holding ``batches`` history records (no task timings: figures -1)."""
    store = KeyedStateStore(str(tmp_path / "state"))
    for b in range(batches):
        assert record_batch(store, b, 2, "hash", seconds=0.1, keep=keep,
                            clock=1795000000.0 + b) is not None
    return store


def test_dashboard_arguments_are_refused_by_name(tmp_path: Path) -> None:
    store = history_path(tmp_path, 1)
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"history": 0}, InvalidArgumentError, "history must be >= 1"),
        ({"history": "10"}, InvalidArgumentTypeError, "history must be an int"),
        ({"refresh": "soon"}, InvalidArgumentError, "refresh"),
        ({"refresh": 0.001}, InvalidArgumentError, "between 50 ms and 1 hour"),
        ({"host": "0.0.0.0"}, InvalidArgumentError, "needs a token"),
        ({"token": "short"}, InvalidArgumentError, "16 to 256 characters"),
        ({"port": 70_000}, InvalidArgumentError, r"\[0, 65535\]"),
        ({"runs": [store, store.path]}, InvalidArgumentError, "share a name"),
        ({"runs": [42]}, InvalidArgumentTypeError, "KeyedStateStores or state paths"),
        ({"runs": b"/tmp/x"}, InvalidArgumentTypeError, "got bytes"),
        ({"partitioners": [tl.HashPartitioner(2)]}, InvalidArgumentTypeError,
         "AdaptivePartitioners"),
        ({"advisors": "ds2"}, InvalidArgumentTypeError, "BottleneckAdvisors"),
        ({"title": 5}, InvalidArgumentTypeError, "title must be a str"),
        ({"spark": "session", "runs": [store]}, InvalidArgumentTypeError, "SparkSession"),
    ]
    for kwargs, error, words in cases:
        with pytest.raises(error, match=words):
            tl.dashboard(**kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]  # nothing made on the way


def test_one_run_or_path_alone_is_one_run_and_the_repr_hides_the_token(tmp_path: Path) -> None:
    store = history_path(tmp_path, 3)
    with tl.dashboard(runs=store.path, token=TOKEN) as url:  # a str, not its characters
        assert url.model.runs == ["state"] and url.model.batches() == [0, 1, 2]
        assert TOKEN in url and TOKEN not in repr(url) and "token=***" in repr(url)
    with tl.dashboard(runs=store) as url:  # type: ignore[arg-type]  # one store alone
        assert url.model.runs == ["state"]
    assert not (Path.cwd() / "t").exists()


def test_the_feed_passes_a_damaged_record_once_and_outlives_a_deleted_path(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = history_path(tmp_path, 1)
    with tl.dashboard(runs={"r": store.path}, refresh=3600) as url:
        assert url.model.batches() == [0]
        record_batch(store, 1, 2, "hash", seconds=0.1, keep=1000)
        damaged = Path(store.record_path("history-000000000001"))
        damaged.write_bytes(damaged.read_bytes().replace(b'"batch": 1', b'"batch": 9'))
        caplog.set_level(logging.WARNING)
        for _ in range(3):  # the newest record is the damaged one: not read again
            url.refresh()
        record_batch(store, 2, 2, "hash", seconds=0.1, keep=1000)
        url.refresh()
        assert url.model.batches() == [0, 2]  # the next one shown
        warned = [r for r in caplog.records if "history-000000000001" in r.getMessage()]
        assert len(warned) == 1
        shutil.rmtree(store.path)  # the state path deleted mid-run
        url.refresh()
        assert url.model.batches() == [0, 2]
        record_batch(store, 3, 2, "hash", seconds=0.1, keep=1000)  # and written again
        url.refresh()
        assert url.model.batches() == [0, 2, 3]


def test_a_feed_started_late_reads_only_the_newest_history(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = history_path(tmp_path, 1000)
    old = Path(store.record_path("history-000000000005"))
    old.write_bytes(b"{not json")  # read, it would be warned about
    caplog.set_level(logging.WARNING)
    started = time.perf_counter()
    with tl.dashboard(runs=[store], history=10) as url:
        assert url.model.batches() == list(range(990, 1000))
    assert time.perf_counter() - started < 5
    assert "history-000000000005" not in caplog.text
    assert len(history_batches(store)) == 1000


# ---------------------------------------------------------------------------- markup

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with sync_api.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield launched
        launched.close()


def hostile_model() -> DashboardModel:
    model = DashboardModel()
    run = "r" + MARKUP
    for b in range(2):
        assert model.add_record(record(
            b, run=run, strategy="hash" + MARKUP,
            hot_keys=[[MARKUP, 3, 0], [CLOSER, 2, 1], ["\"'&", 1, 0]],
            sample={"keys": [MARKUP, CLOSER], "weights": [3, 2]},
            swap={"mode": "full" + MARKUP, "refused": MARKUP + CLOSER},
            request={"request_id": "id" + MARKUP, "strategy": "s" + MARKUP},
            rebalance={"reason": MARKUP, "moves": 1}))
    assert model.add_event({"kind": "advice", "time": 1795000000.0, "batch": 1,
                            "source": "ds2", "advice": MARKUP, "reason": CLOSER, "run": run})
    assert model.add_event({"kind": "progress", "time": 1795000000.0, "batch": 1,
                            "query": MARKUP, "input_rows": 5, "duration_ms": 3})
    assert model.add_event({"kind": "request", "time": 1795000000.0, "request_id": "q" + MARKUP,
                            "strategy": CLOSER, "run": run})
    return model


#: Elements the page holds of a tag, Bokeh's shadow roots pierced.
COUNT_JS = """tag => { let n = 0; const walk = root => {
  n += root.querySelectorAll(tag).length;
  root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) walk(e.shadowRoot); }); };
  walk(document); return n; }"""


def test_markup_in_every_text_is_shown_as_text(browser: Any, tmp_path: Path) -> None:
    model = hostile_model()
    report = write_report(model, tmp_path / "report.html", title=MARKUP + CLOSER)
    with DashboardServer(model, title=MARKUP + CLOSER) as server:
        assert server.url is not None
        urls = [server.url, server.url + "?run=" + quote("r" + MARKUP), report.as_uri()]
        for url in urls:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            dialogs: list[str] = []
            errors: list[str] = []

            def seen(dialog: Any, dialogs: list[str] = dialogs) -> None:
                dialogs.append(dialog.message)
                dialog.dismiss()

            page.on("dialog", seen)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            deadline = time.monotonic() + 20
            drawn: list[str] = []
            while MARKUP not in drawn and time.monotonic() < deadline:  # the first data
                page.wait_for_timeout(200)
                drawn = [c.strip() for c in page.locator(".slick-cell").all_inner_texts()]
            assert page.evaluate("() => window.__pwned") is None, url
            assert page.evaluate(COUNT_JS, "img") == 0 and dialogs == [] and errors == []
            assert page.title() == MARKUP + CLOSER
            assert MARKUP in drawn and CLOSER in drawn  # the hot keys, as written
            assert ("r" + MARKUP) in drawn and (MARKUP + CLOSER) in drawn  # run, refusal
            page.close()
