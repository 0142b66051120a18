"""A finished (or running) run's history as one self-contained HTML file."""

from __future__ import annotations

import logging
import os
from typing import Any

from .._internal.install import install_hint
from .._internal.validation import count
from ..errors import InvalidArgumentError, StateCorruptError
from ..keyed.records.history import history_batches
from ..state import KeyedStateStore
from .feed import RunSource, pending_request
from .records import BatchRecord, read_batch_record

__all__ = ["write_state_report", "require_ui"]

logger = logging.getLogger(__name__)


def require_ui() -> None:
    """Check that the ``[ui]`` extra is installed.

    Raises
    ------
    MissingDependencyError
        ``bokeh`` cannot be imported: the message says what to install.
    """
    from ..errors import MissingDependencyError

    try:
        import bokeh  # noqa: F401
    except ImportError:
        raise MissingDependencyError(
            "the dashboard and HTML reports need Bokeh: " + install_hint("ui", "bokeh>=3.4,<4")
        ) from None


def write_state_report(path: str, html: str, *, last: int | None = None,
                       title: str | None = None) -> dict[str, Any]:
    """Write the history a state path holds as one self-contained HTML page.

    Parameters
    ----------
    path : str
        A ``keyed_foreach_batch`` run's state path (local or a ``pyarrow.fs`` URI).
    html : str
        The file to write (its directory must exist); replaced if it exists.
    last : int, optional
        Only the newest ``last`` batches (default: all the path keeps).
    title : str, optional
        The page's title (default: "trilink-spark report: <path>").

    Returns
    -------
    dict
        ``{"path", "html", "batches", "first", "last", "bytes"}``.

    Raises
    ------
    InvalidArgumentError
        The path holds no history record, or ``html``'s directory does not exist.
    MissingDependencyError
        Bokeh is not installed.

    Notes
    -----
    Reads the kept records (one listing, one small read each; a damaged one is logged and
    left out) and the pending swap request; no Spark. The page inlines every asset and its
    data: it opens offline, anywhere.

    Examples
    --------
    >>> write_state_report("/tmp/state", "report.html")  # doctest: +SKIP
    {'path': '/tmp/state', 'html': 'report.html', 'batches': 120, 'first': 0, ...}
    """
    require_ui()
    from .model import DashboardModel
    from .page import write_report

    folder = os.path.dirname(os.path.abspath(html))
    if not os.path.isdir(folder):
        raise InvalidArgumentError(f"cannot write {html}: {folder} is not a directory")
    store = KeyedStateStore(path)
    source = RunSource.of(store)
    batches = history_batches(store)
    if last is not None:
        batches = batches[-count(last, "last"):] if last else []
    records: list[BatchRecord] = []
    for batch in batches:  # each record checked once, as it is read
        try:
            record = read_batch_record(store, batch, source.name)
        except StateCorruptError as err:
            logger.warning("%s; left out", err)
            continue
        if record is not None:  # None: dropped since the listing
            records.append(record)
    if not records:
        raise InvalidArgumentError(
            f"{path} holds no history record: it is not the state path of a "
            "keyed_foreach_batch run, or the run committed no batch yet")
    model = DashboardModel(history=len(records))
    model.add_records(records)
    pending = pending_request(source, records[-1].time)
    if pending is not None:
        model.add_event(pending)
    write_report(model, html, title=title or f"trilink-spark report: {path}")
    summary = {"path": path, "html": html, "batches": len(records),
               "first": records[0].batch, "last": records[-1].batch,
               "bytes": os.path.getsize(html)}
    logger.info("report of %s: %d batches in %s", path, len(records), html)
    return summary
