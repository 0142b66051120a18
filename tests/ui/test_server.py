"""The dashboard server over real HTTP, and the self-contained report."""

from __future__ import annotations

import http.client
import json
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from trilink_spark.errors import InvalidArgumentError, TrilinkError
from trilink_spark.ui.model import SOURCE_COLUMNS, DashboardModel
from trilink_spark.ui.page import static_root, write_report
from trilink_spark.ui.server import DashboardServer

TOKEN = "s3cret-token_0123456789"


def record(batch: int, run: str = "run") -> dict[str, object]:
    return {"v": 1, "run": run, "batch": batch, "time": 1795000000.0 + batch, "seconds": 0.5,
            "strategy": "least_count", "partitions": 3, "rows": [300, 100, 50 + batch],
            "hot_keys": [["hotkey-zz", 280, 0]],
            "sample": {"keys": ["hotkey-zz", "b", "c"], "weights": [280, 100, 60]}}


@pytest.fixture
def model() -> DashboardModel:
    model = DashboardModel()
    for batch in range(3):
        assert model.add_record(record(batch))
    return model


@pytest.fixture
def server(model: DashboardModel) -> Iterator[DashboardServer]:
    with DashboardServer(model, refresh_ms=200) as running:
        yield running


def fetch(url: str, method: str = "GET",
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def raw(port: int, path: str, host: str | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A request sent as written: no normalisation of the path or the Host header."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host if host is not None else f"127.0.0.1:{port}")
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def test_the_page_loads_bokeh_from_the_server_only(server):
    status, headers, body = fetch(server.url)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    page = body.decode()
    assert "http://" not in page and "https://" not in page
    scripts = re.findall(r'<script[^>]* src="([^"]+)"', page)
    assert scripts and all(src.startswith("/static/js/bokeh") for src in scripts)
    assert '"/data.json?"' in page and '"refresh",200' in page.replace(" ", "")
    for src in scripts:  # every script the page names is served
        status, headers, js = fetch(f"http://127.0.0.1:{server.port}{src}")
        assert status == 200 and "javascript" in headers["Content-Type"]
        assert js == (static_root() / src[len("/static/"):]).read_bytes()


def test_a_static_asset_is_bokeh_js(server):
    status, headers, body = fetch(server.url + "static/js/bokeh.min.js")
    assert status == 200
    assert body == (static_root() / "js" / "bokeh.min.js").read_bytes()
    assert int(headers["Content-Length"]) == len(body) > 100_000
    status, headers, body = fetch(server.url + "static/js/bokeh.min.js", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 100_000


def test_the_page_poll_sends_everything_once_then_only_the_version(server, model):
    status, headers, body = fetch(server.url + "data.json")
    doc = json.loads(body)
    assert status == 200 and headers["Cache-Control"] == "no-store"
    assert set(doc["sources"]) == set(SOURCE_COLUMNS) and doc["version"] == model.version
    assert doc["sources"]["headline"]["batch"] == [2]
    status, _, body = fetch(server.url + f"data.json?since={doc['version']}")
    assert status == 200 and json.loads(body) == {"version": doc["version"]}  # no change
    model.add_record(record(9))
    status, _, body = fetch(server.url + f"data.json?since={doc['version']}")
    changed = json.loads(body)
    assert changed["version"] > doc["version"] and changed["sources"]["headline"]["batch"] == [9]
    for junk in ("-1", "x", "9" * 40, ""):  # any other since: everything
        assert "sources" in json.loads(fetch(server.url + f"data.json?since={junk}")[2])


def test_the_data_follows_the_model(server, model):
    status, headers, body = fetch(server.url + "data/headline.json")
    assert status == 200 and headers["Cache-Control"] == "no-store"
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body)["batch"] == [2]
    assert model.add_record(record(3))
    assert model.add_event({"kind": "request", "time": 1795000009.0, "request_id": "r9",
                            "strategy": "least_key", "num_partitions": None, "mode": "sync"})
    assert json.loads(fetch(server.url + "data/headline.json")[2])["batch"] == [3]
    timeline = json.loads(fetch(server.url + "data/timeline.json")[2])
    assert timeline["kind"] == ["request"] and "r9" in timeline["what"][0]
    latest = json.loads(fetch(server.url + "data/latest_rows.json")[2])
    assert latest == {"partition": [0, 1, 2], "rows": [300.0, 100.0, 53.0]}
    for name, columns in SOURCE_COLUMNS.items():
        status, _, body = fetch(server.url + f"data/{name}.json")
        assert status == 200 and tuple(json.loads(body)) == columns
    assert fetch(server.url + "data/nothing.json")[0] == 404
    assert fetch(server.url + "nothing")[0] == 404


def test_a_run_is_chosen_by_the_query(server, model):
    assert model.add_record({**record(7, run="other"), "rows": [1, 1, 1]})
    other = json.loads(fetch(server.url + "data/balance.json?run=other")[2])
    first = json.loads(fetch(server.url + "data/balance.json")[2])
    assert other["batch"] == [7] and other["balance_degree"] == [1.0]
    assert first["batch"] == [0, 1, 2]
    page = fetch(server.url + "?run=other")[2].decode()
    assert '"/data.json?run=other"' in page
    doc = json.loads(fetch(server.url + "data.json?run=other")[2])
    assert doc["sources"]["balance"]["batch"] == [7]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_only_reads_are_allowed(server, model, method):
    version = model.version
    status, headers, _ = fetch(server.url + "data/headline.json", method=method)
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert model.version == version


def test_off_loopback_needs_a_token():
    model = DashboardModel()
    with pytest.raises(InvalidArgumentError, match="needs a token; pass token="):
        DashboardServer(model, host="0.0.0.0")
    with pytest.raises(InvalidArgumentError, match="16 to 256 characters"):
        DashboardServer(model, host="0.0.0.0", token="short")
    assert model.add_record(record(0))
    with DashboardServer(model, host="0.0.0.0", token=TOKEN) as server:
        assert server.url == f"http://127.0.0.1:{server.port}/?token={TOKEN}"
        base = f"http://127.0.0.1:{server.port}/"
        for path in ("", "data/headline.json", "static/js/bokeh.min.js"):
            assert fetch(base + path)[0] == 403
            assert fetch(base + path + "?token=wrong-token-0123456789")[0] == 403
            assert fetch(base + path, headers={"Authorization": "Bearer nope"})[0] == 403
            assert fetch(base + path + f"?token={TOKEN}")[0] == 200
        status, _, body = fetch(base + "data/headline.json",
                                headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and json.loads(body)["batch"] == [0]
        status, _, page = fetch(server.url)
        assert status == 200
        text = page.decode()
        assert f'["Authorization","Bearer {TOKEN}"]' in text
        assert f'src="/static/js/bokeh.min.js?token={TOKEN}"' in text


def test_a_token_on_loopback_is_required_too(model):
    with DashboardServer(model, token=TOKEN) as server:
        assert server.url.endswith(f"/?token={TOKEN}")
        assert fetch(server.url.split("?")[0])[0] == 403
        assert fetch(server.url)[0] == 200


def test_a_foreign_host_header_is_refused_on_loopback(server):
    port = server.port
    assert raw(port, "/data/headline.json")[0] == 200
    assert raw(port, "/data/headline.json", host=f"localhost:{port}")[0] == 200
    for host in (f"evil.example:{port}", "evil.example", "127.0.0.1", f"127.0.0.1:{port + 1}",
                 ""):
        status, body = raw(port, "/data/headline.json", host=host)
        assert status == 403, host
        assert b"Host" in body


@pytest.mark.parametrize("path", [
    "/static/../../__init__.py",
    "/static/%2e%2e/%2e%2e/__init__.py",
    "/static/js/%2e%2e/%2e%2e/%2e%2e/__init__.py",
    "/static/js/..%2f..%2f..%2f__init__.py",
    "/static/%2fetc%2fpasswd",
    "/static//etc/passwd",
    "/static/js/%252e%252e/%252e%252e/__init__.py",
    "/static/js/..\\..\\..\\__init__.py",
    "/static/js/",
])
def test_the_static_route_stays_in_bokehs_folder(server, path):
    outside = (static_root().parent.parent / "__init__.py").read_bytes()
    status, body = raw(server.port, path)
    assert status == 404
    assert body != outside and b"import" not in body


def test_stop_closes_the_port(model, capfd):
    server = DashboardServer(model)
    url = server.start()
    assert server.start() == url
    port = server.port
    assert fetch(url + "data/headline.json")[0] == 200
    server.stop()
    server.stop()
    assert server.url is None and server.port is None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert capfd.readouterr().err == ""  # requests are logged at debug level, not printed


def test_arguments_are_checked(model):
    with pytest.raises(TypeError):
        DashboardServer({"not": "a model"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="port must be in"):
        DashboardServer(model, port=70000)
    with pytest.raises(ValueError, match="refresh_ms must be >= 100"):
        DashboardServer(model, refresh_ms=10)
    with pytest.raises(TrilinkError):
        DashboardServer(model, host="example.com")


def test_the_report_is_one_self_contained_file(tmp_path: Path):
    records = [record(b) for b in range(4)] + [record(0, run="second"), {"v": 1}]
    out = write_report(records, tmp_path / "report.html", title="nightly")
    text = out.read_text(encoding="utf-8")
    assert "<title>nightly</title>" in text
    assert "/* BEGIN bokeh.min.js */" in text and "/* BEGIN bokeh-tables.min.js */" in text
    assert re.search(r"<script[^>]+src=", text) is None
    assert re.search(r"<link[^>]+href=", text) is None
    docs = re.search(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>', text,
                     re.S)
    assert docs is not None
    document = docs.group(1)
    assert "http://" not in document and "https://" not in document
    assert "AjaxDataSource" not in document and "data_url" not in document
    assert "hotkey-zz" in document and "least_count" in document
    assert '"name":"headline"' in document and '"name":"headline:second"' in document
    assert '"title":"second"' in document  # a tab per run
    frozen = json.loads(document)
    assert len(frozen) == 1


def test_a_query_of_too_many_fields_is_a_bad_request(server):
    fields = "&".join(f"f{i}=1" for i in range(20))
    assert fetch(server.url + f"data/headline.json?{fields}")[0] == 400
