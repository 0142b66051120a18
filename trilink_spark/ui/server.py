"""A small read-only HTTP server for the live dashboard, in a daemon thread of the driver.

Routes (GET and HEAD only; any other method is answered 405):

- ``/`` (``?run=<name>`` picks a run): the live page (:func:`~trilink_spark.ui.page.
  live_page_html`), rendered once per run and cached;
- ``/data.json`` (``?run=<name>&since=<version>``): what the page polls: the model's version
  alone while it is still ``since``, else every source's column data (cached, encoded once
  per version: :meth:`~trilink_spark.ui.model.DashboardModel.document_json`);
- ``/data/<source>.json`` (``?run=<name>``): one source's column data, the model's cached
  JSON (:meth:`~trilink_spark.ui.model.DashboardModel.snapshot_json`, encoded once per model
  version), sent with ``Cache-Control: no-store``;
- ``/static/<path>``: BokehJS, files of the installed bokeh package's static folder only.

Safety: the server binds ``127.0.0.1`` by default. Binding any other address needs a
``token``; with a token every request must carry it, as ``Authorization: Bearer <token>``
or ``?token=<token>`` (compared in constant time), else 403. On a loopback address a request
whose ``Host`` header is not that address (or ``localhost``) with the server's port is
refused (403): a web page that rebinds its own DNS name to 127.0.0.1 cannot read the
dashboard. Static paths are resolved and must stay inside bokeh's static folder. Requests are
logged at debug level (the token masked), never printed; a client silent for 30 s
mid-request is dropped.

Examples
--------
>>> from urllib.request import urlopen
>>> from trilink_spark.ui.model import DashboardModel
>>> with DashboardServer(DashboardModel()) as server:
...     with urlopen(server.url + "data/late_key.json") as reply:
...         reply.read()
b'{"batch":[],"rows":[]}'
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import mimetypes
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from .._internal.validation import count
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .model import SOURCE_COLUMNS, DashboardModel
from .page import live_page_html, static_root

logger = logging.getLogger(__name__)

__all__ = ["DashboardServer", "TOKEN_PATTERN"]

#: What a token may hold: 16 to 256 URL-safe characters (``secrets.token_urlsafe()`` gives
#: one).
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_\-.~]{16,256}")
_ALLOWED = "GET, HEAD"
_PAGE_CACHE = 64  # pages cached, one per run asked for
_TOKEN_IN_URL = re.compile(r"([?&]token=)[^&\s\"]*")  # masked in logged request lines
_CLIENT_TIMEOUT_S = 30.0  # seconds a connection may stay silent mid-request


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # the port can be bound again right after stop(), while the last replies' connections
    # linger in TIME_WAIT (on Linux this never lets two servers listen on one port)
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Log a failed request (a client gone mid-reply, most often) instead of printing
        its traceback to stderr."""
        logger.debug("dashboard request from %s failed", client_address, exc_info=True)


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    """One request: the method, the Host guard, the token, then the route."""

    server_version = "trilink-dashboard"
    sys_version = ""
    timeout = _CLIENT_TIMEOUT_S  # a client that stalls mid-request frees its thread
    dashboard: DashboardServer  # set on the per-server subclass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Log at debug level, any ``token=`` of a request line masked (a wrong one may be
        the token mistyped)."""
        text = _TOKEN_IN_URL.sub(r"\1***", format % args)
        logger.debug("dashboard %s: %s", self.address_string(), text)

    def _refuse_method(self) -> None:
        self.close_connection = True
        self._send(405, b"method not allowed: the dashboard is read-only (GET, HEAD)\n",
                   "text/plain; charset=utf-8", {"Allow": _ALLOWED})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = (
        _refuse_method)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _send(self, status: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None, *, head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, text: str, head: bool) -> None:
        self._send(status, text.encode() + b"\n", "text/plain; charset=utf-8",
                   {"Cache-Control": "no-store"}, head=head)

    def _answer(self, *, head: bool) -> None:
        board = self.dashboard
        if not board.host_allowed(self.headers.get("Host")):
            self._error(403, "forbidden: unexpected Host header", head)
            return
        parts = urlsplit(self.path)
        try:
            query = parse_qs(parts.query, max_num_fields=8)
        except ValueError:
            self._error(400, "bad request: at most 8 query fields", head)
            return
        if not board.authorised(self.headers.get("Authorization"), query.get("token")):
            self._error(403, "forbidden: a valid token is required (?token=...)", head)
            return
        run = query.get("run", [None])[0]
        path = parts.path
        if path in ("/", "/index.html"):
            self._send(200, board.page(run), "text/html; charset=utf-8",
                       {"Cache-Control": "no-store"}, head=head)
        elif path == "/data.json":  # the page's one poll: everything, or "no change"
            raw = query.get("since", [""])[0]
            since = int(raw) if raw.isdigit() and len(raw) < 19 else None
            self._send(200, board.model.document_json(run, since), "application/json",
                       {"Cache-Control": "no-store"}, head=head)
        elif path.startswith("/data/") and path.endswith(".json"):
            name = path[len("/data/"):-len(".json")]
            body = board.model.snapshot_json(run).get(name) if name in SOURCE_COLUMNS else None
            if body is None:
                self._error(404, f"no data source {name!r}", head)
                return
            self._send(200, body, "application/json", {"Cache-Control": "no-store"},
                       head=head)
        elif path.startswith("/static/"):
            found = board.static_file(path[len("/static/"):])
            if found is None:
                self._error(404, "no such static file", head)
                return
            kind = mimetypes.guess_type(found.name)[0] or "application/octet-stream"
            if kind in ("text/javascript", "application/javascript", "text/css"):
                kind += "; charset=utf-8"
            self._send(200, found.read_bytes(), kind, {"Cache-Control": "max-age=3600"},
                       head=head)
        else:
            self._error(404, "not found", head)


class DashboardServer:
    """The live dashboard's HTTP server, in a daemon thread of this process.

    Parameters
    ----------
    model : DashboardModel
        What the page shows (the feed adds to it while the server runs).
    host : str
        The address to bind; default ``"127.0.0.1"``. Any non-loopback address (``"0.0.0.0"``
        included) needs a ``token``.
    port : int
        The port; 0 (default) picks a free one.
    token : str, optional
        Required on every request when given (16 to 256 URL-safe characters:
        ``secrets.token_urlsafe()``); :meth:`start` returns the URL with ``?token=``.
    refresh_ms : int
        How often the page polls its data, in milliseconds (>= 100). Default 1000.
    title : str
        The page title.

    Raises
    ------
    InvalidArgumentError
        A non-loopback ``host`` without a token, a malformed token, a port outside
        [0, 65535], ``refresh_ms`` below 100.

    Notes
    -----
    Cost: each data request sends the model's cached JSON (encoded once per model version);
    the page is rendered once per run asked for; static files are read from the bokeh
    package.

    Examples
    --------
    >>> server = DashboardServer(DashboardModel())
    >>> url = server.start()
    >>> url.startswith("http://127.0.0.1:")
    True
    >>> server.stop()
    >>> DashboardServer(DashboardModel(), host="0.0.0.0")
    Traceback (most recent call last):
    ...
    trilink_spark.errors.InvalidArgumentError: host '0.0.0.0' is not a loopback address: ...
    """

    def __init__(self, model: DashboardModel, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, refresh_ms: int = 1000,
                 title: str = "trilink-spark dashboard") -> None:
        if not isinstance(model, DashboardModel):
            raise InvalidArgumentTypeError(
                f"model must be a DashboardModel, got {type(model).__name__}")
        if not isinstance(host, str) or not host:
            raise InvalidArgumentTypeError(f"host must be a non-empty str, got {host!r}")
        self._port_asked = count(port, "port", 0)
        if self._port_asked > 65535:
            raise InvalidArgumentError(f"port must be in [0, 65535], got {port}")
        if token is not None:
            if not isinstance(token, str):
                raise InvalidArgumentTypeError(
                    f"token must be a str, got {type(token).__name__}")
            if TOKEN_PATTERN.fullmatch(token) is None:
                raise InvalidArgumentError(
                    "token must be 16 to 256 characters of A-Z, a-z, 0-9, '-', '_', '.', '~' "
                    "(secrets.token_urlsafe() makes one)")
        self._loopback = _is_loopback(host)
        if not self._loopback and token is None:
            raise InvalidArgumentError(
                f"host {host!r} is not a loopback address: serving the dashboard to other "
                "machines needs a token; pass token=secrets.token_urlsafe() (every request "
                "must then carry it: open the URL start() returns), or bind host='127.0.0.1'")
        if not isinstance(title, str):
            raise InvalidArgumentTypeError(f"title must be a str, got {type(title).__name__}")
        self.model = model
        self._host = host
        self._token = token
        self._refresh_ms = count(refresh_ms, "refresh_ms", 100)
        self._title = title
        self._static = static_root()
        self._pages: dict[tuple[str | None, int], bytes] = {}
        self._lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._url: str | None = None

    @property
    def url(self) -> str | None:
        """The page's URL (with ``?token=`` when there is one) while running, else None."""
        return self._url

    @property
    def port(self) -> int | None:
        """The bound port while running, else None."""
        return None if self._httpd is None else int(self._httpd.server_address[1])

    def start(self) -> str:
        """Bind and serve in a daemon thread; returns the page's URL. A second call returns
        the same URL. O(1) (the socket is bound before it returns).

        Raises
        ------
        InvalidArgumentError
            The address cannot be bound: the port is taken (another dashboard, another
            program) or the host is not an address of this machine."""
        with self._lock:
            if self._httpd is not None and self._url is not None:
                return self._url
            handler = type("DashboardHandler", (_Handler,), {"dashboard": self})
            server_class = _HTTPServer6 if ":" in self._host else _HTTPServer
            try:
                httpd = server_class((self._host, self._port_asked), handler)
            except OSError as err:
                raise InvalidArgumentError(
                    f"cannot serve the dashboard on {self._host}:{self._port_asked} "
                    f"({err.strerror or err}): the port is taken or the address is not one "
                    "of this machine's; pass port=0 for a free port") from err
            port = int(httpd.server_address[1])
            shown = self._host
            if shown in ("0.0.0.0", ""):
                shown = "127.0.0.1"
            elif shown == "::":
                shown = "::1"
            if ":" in shown:
                shown = f"[{shown}]"
            query = "" if self._token is None else f"?token={quote(self._token, safe='')}"
            self._url = f"http://{shown}:{port}/{query}"
            self._allowed_hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}",
                                   f"{shown}:{port}"}
            self._httpd = httpd
            self._thread = threading.Thread(target=httpd.serve_forever,
                                            kwargs={"poll_interval": 0.2},
                                            name=f"trilink-dashboard-{port}", daemon=True)
            self._thread.start()
            logger.info("dashboard serving on %s:%d", self._host, port)
            return self._url

    def stop(self) -> None:
        """Stop serving and close the socket; a second call does nothing. Waits for the
        serving thread (at most a poll interval, 0.2 s)."""
        with self._lock:
            httpd, thread = self._httpd, self._thread
            self._httpd = self._thread = None
            self._url = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)
        logger.info("dashboard stopped")

    def __enter__(self) -> DashboardServer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request's ``Host`` header may be served: any on a non-loopback bind
        (the token guards it), else only the loopback address or ``localhost`` with the
        bound port. O(1)."""
        if not self._loopback:
            return True
        return host is not None and host.strip().lower() in self._allowed_hosts

    def authorised(self, header: str | None, query: list[str] | None) -> bool:
        """Whether a request carries the token (always, without one). O(len(token))."""
        if self._token is None:
            return True
        expected = self._token.encode()
        offered: list[str] = list(query or [])
        if header and header.startswith("Bearer "):
            offered.append(header[len("Bearer "):].strip())
        return any(hmac.compare_digest(o.encode("utf-8", "replace"), expected)
                   for o in offered[:4])

    def page(self, run: str | None) -> bytes:
        """The live page for ``run`` (None: the first run) with the model's latest data drawn
        in it, rendered once per model version and cached. About tens of milliseconds plus
        the snapshot's size when the model changed since the last page, O(1) after."""
        version = self.model.version  # before the snapshot: a poll brings anything newer
        with self._lock:
            cached = self._pages.get((run, version))
        if cached is not None:
            return cached
        body = live_page_html(title=self._title, run=run, token=self._token,
                              refresh_ms=self._refresh_ms, snapshot=self.model.snapshot(run),
                              version=version).encode("utf-8")
        with self._lock:
            if len(self._pages) >= _PAGE_CACHE:
                self._pages.clear()
            self._pages[(run, version)] = body
        return body

    def static_file(self, relative: str) -> Path | None:
        """The file of bokeh's static folder at ``relative`` (URL-encoded), or None when it
        is not a file inside that folder (``..``, absolute paths, links leading out). O(depth).
        """
        name = unquote(relative)
        if not name or "\0" in name or "\\" in name or name.startswith("/"):
            return None
        if any(part in ("", ".", "..") for part in name.split("/")):
            return None
        try:
            found = (self._static / name).resolve()
        except (OSError, RuntimeError):
            return None
        if not found.is_relative_to(self._static) or not found.is_file():
            return None
        return found
