"""A screenshot of the dashboard (the live page or a report) in a headless Chromium.

:func:`screenshot` opens a URL, waits until Bokeh has drawn the page and every live source
has its first data, and saves a PNG. Playwright is imported only when it is called; without
it, or without a browser to launch, it raises
:class:`~trilink_spark.errors.MissingDependencyError` saying what to install.

Examples
--------
>>> from trilink_spark.ui.browser import default_executable
>>> default_executable() is None or default_executable().endswith("chromium")
True
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from .._internal.validation import count, positive
from ..errors import InvalidArgumentTypeError, MissingDependencyError

logger = logging.getLogger(__name__)

__all__ = ["PAGE_READY_JS", "default_executable", "screenshot"]

#: A JavaScript predicate that is true once Bokeh has drawn the page's document and, on the
#: live page, its poller has loaded the data at least once.
PAGE_READY_JS = """() => {
  const bokeh = window.Bokeh;
  if (bokeh === undefined || bokeh.documents.length === 0) return false;
  if (!bokeh.documents[0].is_idle) return false;
  return window.trilinkLive !== true || window.trilinkDataVersion !== undefined;
}"""
_TWO_FRAMES_JS = ("() => new Promise(done => requestAnimationFrame(() => "
                  "requestAnimationFrame(() => done(true))))")
_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def default_executable() -> str | None:
    """The system's Chromium (``/usr/bin/chromium`` and the like, or ``chromium`` on the
    ``PATH``), or None: Playwright's own browser is used then. O(1).
    """
    for candidate in _CANDIDATES:
        if Path(candidate).is_file():
            return candidate
    return shutil.which("chromium")


def screenshot(url: str, path: str | Path, *, executable: str | Path | None = None,
               width: int = 1400, height: int = 1000, full_page: bool = True,
               timeout_s: float = 30.0, browser: Any = None) -> Path:
    """Save a PNG of the dashboard page at ``url``, once it is drawn with its data.

    Parameters
    ----------
    url : str
        The page: a live dashboard URL (with its ``?token=``) or a report's ``file://`` URL.
    path : str or pathlib.Path
        The PNG to write.
    executable : str or pathlib.Path, optional
        The Chromium to launch; default :func:`default_executable` (else Playwright's own).
    width, height : int
        The viewport, in CSS pixels (default 1400 x 1000).
    full_page : bool
        The whole page, not only the viewport (default).
    timeout_s : float
        How long to wait for the page to load and draw.
    browser : playwright.sync_api.Browser, optional
        A browser already launched (it stays open); by default one is launched and closed.

    Returns
    -------
    pathlib.Path
        The PNG written.

    Raises
    ------
    MissingDependencyError
        Playwright is not installed, or the browser cannot be launched (the message says
        what to install).
    InvalidArgumentTypeError
        ``url`` is not a str.

    Notes
    -----
    Cost: a browser launch (about a second, unless ``browser`` is given), the page's load
    and first data, and one screenshot.

    Examples
    --------
    >>> screenshot("http://127.0.0.1:8050/", "board.png")  # doctest: +SKIP
    PosixPath('board.png')
    """
    if not isinstance(url, str):
        raise InvalidArgumentTypeError(f"url must be a str, got {type(url).__name__}")
    if not isinstance(path, (str, Path)):
        raise InvalidArgumentTypeError(
            f"path must be a str or pathlib.Path, got {type(path).__name__}")
    view = {"width": count(width, "width", 100), "height": count(height, "height", 100)}
    timeout_ms = positive(timeout_s, "timeout_s") * 1000
    out = Path(path)
    if browser is not None:
        _shoot(browser, url, out, view, full_page, timeout_ms)
        return out
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise MissingDependencyError(
            "screenshot needs Playwright: pip install playwright (then either "
            "'playwright install chromium', or pass executable= a Chromium such as "
            "/usr/bin/chromium)") from None
    exe = str(executable) if executable is not None else default_executable()
    with sync_playwright() as driver:
        try:
            launched = driver.chromium.launch(executable_path=exe, headless=True)
        except PlaywrightError as err:
            which = exe or "Playwright's own"
            raise MissingDependencyError(
                f"screenshot could not launch Chromium ({which}): "
                f"{str(err).splitlines()[0]}; install one ('playwright install chromium' or "
                "the system's chromium package) or pass executable=") from None
        try:
            _shoot(launched, url, out, view, full_page, timeout_ms)
        finally:
            launched.close()
    return out


def _shoot(browser: Any, url: str, out: Path, view: dict[str, int], full_page: bool,
           timeout_ms: float) -> None:
    page = browser.new_page(viewport=view)
    try:
        page.goto(url, wait_until="load", timeout=timeout_ms)
        page.wait_for_function(PAGE_READY_JS, timeout=timeout_ms)
        page.evaluate(_TWO_FRAMES_JS)  # the data's repaint
        page.screenshot(path=str(out), full_page=full_page, timeout=timeout_ms)
        logger.debug("dashboard screenshot of %s written to %s", url.split("?")[0], out)
    finally:
        page.close()
