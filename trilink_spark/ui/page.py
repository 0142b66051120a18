"""The dashboard page, built from Bokeh models: the live page the server sends and the
self-contained HTML report.

Both draw the same layout (:func:`build_layout`) over the column data of
:data:`~trilink_spark.ui.model.SOURCE_COLUMNS`: rows and task time per partition per batch
as heat maps, the latest batch's rows per partition, the balance degree, keyed bound and
extra compute time over batches, the candidate strategies on the latest sample, the hottest
keys, the timeline of swap requests, swaps and rebalances, late rows by key and by partition
watermark, the latest advice, and the query progress.

- :func:`live_page_html`: one poller (:data:`_POLL_JS`, run at Bokeh's ``document_ready``)
  asks the server's ``/data.json`` every ``refresh_ms`` (GET) and replaces the data of the
  sources that changed, so the page follows the runs without reloading and an idle page
  costs one tiny request per refresh, no redraw; BokehJS itself is loaded from the server's ``/static/`` route (the
  installed bokeh package's files, never a CDN).
- :func:`report_html` / :func:`write_report`: one HTML file with BokehJS inlined and the data
  frozen in ``ColumnDataSource`` s: it opens with no network and no server; each run gets a
  tab.

Every figure and table has a stable ``name`` (:data:`MODEL_NAMES`), so a script can find it
with ``Bokeh.documents[0].get_model_by_name(name)``; in a report, the runs after the first
add ``":<run>"`` to each name.

Examples
--------
>>> from trilink_spark.ui.model import DashboardModel
>>> html = report_html(DashboardModel(), title="empty")
>>> '<script type="text/javascript" src=' in html, "<title>empty</title>" in html
(False, True)
"""

from __future__ import annotations

import html
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from .._internal.install import install_hint
from .._internal.validation import count
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, MissingDependencyError

try:
    import bokeh  # noqa: F401 - the dashboard's one optional dependency
except ImportError:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        "the dashboard page needs Bokeh 3.4 or later: " + install_hint("ui", "bokeh>=3.4,<4")
    ) from None

from bokeh.document import Document
from bokeh.embed import file_html
from bokeh.models import (ColumnDataSource, CustomJS, DataRange1d, FixedTicker, GridBox,
                          HoverTool, LinearAxis, LinearColorMapper, Range1d, TabPanel, Tabs)
from bokeh.models.annotations import ColorBar, Title
from bokeh.models.widgets import (DataTable, DateFormatter, Div, NumberFormatter,
                                  StringFormatter, TableColumn)
from bokeh.models.layouts import LayoutDOM
from bokeh.palettes import Category10, Viridis256
from bokeh.plotting import figure
from bokeh.resources import Resources
from bokeh.settings import settings as bokeh_settings
from bokeh.transform import factor_cmap, factor_mark

from .model import SOURCE_COLUMNS, TIMELINE_LANES, DashboardModel

logger = logging.getLogger(__name__)

__all__ = ["MODEL_NAMES", "static_root", "build_layout", "live_page_html",
           "report_html", "write_report"]

#: The names of the page's figures and tables.
MODEL_NAMES = ("title", "headline", "partition_rows", "partition_task_ms", "latest_rows",
               "balance", "latest", "candidates", "hot_keys", "timeline", "timeline_table",
               "late", "advice", "progress")
_HEIGHT = 210
#: The live page's one poller (Bokeh's ``document_ready``): every ``refresh`` ms it asks
#: ``/data.json?since=<version>``; the server answers the version alone while nothing
#: changed, else every source, and a source is replaced only when its data differ (so an
#: idle page neither transfers nor redraws anything). ``window.trilinkDataVersion`` is the
#: version shown (what :data:`~trilink_spark.ui.browser.PAGE_READY_JS` waits for).
_POLL_JS = """
window.trilinkLive = true;
const shown = new Map();
let version = start;  // the version the page was rendered at (-1: rendered empty)
if (start >= 0) window.trilinkDataVersion = start;  // its data is drawn: no poll needed
async function tick() {
  try {
    const sep = url.includes("?") && !url.endsWith("?") ? "&" : "";
    const sent = headers instanceof Map ? Object.fromEntries(headers) : headers;
    const reply = await fetch(url + sep + "since=" + version,
                              {headers: sent, cache: "no-store"});
    if (reply.ok) {
      const doc = await reply.json();
      if (doc.sources !== undefined) {
        names.forEach((name, i) => {
          const data = doc.sources[name];
          if (data === undefined) return;
          const text = JSON.stringify(data);
          if (shown.get(name) !== text) {
            shown.set(name, text);
            sources[i].data = data;
          }
        });
      }
      version = doc.version;
      window.trilinkDataVersion = version;
    }
  } catch (err) {
    console.warn("trilink dashboard: " + err);
  }
  setTimeout(tick, refresh);
}
tick();
"""
_TABLE_HEIGHT = 210
_GRID: dict[str, Any] = {"cols": "1fr", "spacing": (8, 12)}  # 12 equal columns
_TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
_KINDS = ["request", "swap", "refused", "rebalance"]
_KIND_COLOURS = [Category10[10][0], Category10[10][2], Category10[10][3], Category10[10][1]]
_KIND_MARKERS = ["triangle", "diamond", "x", "circle"]


def static_root() -> Path:
    """The installed bokeh package's static folder (``.../bokeh/server/static``), whose
    ``js/`` the live page loads. O(1).

    Examples
    --------
    >>> (static_root() / "js" / "bokeh.min.js").is_file()
    True
    """
    return Path(bokeh_settings.bokehjs_path()).resolve()


def _figure(title: str, x_label: str, y_label: str, name: str, **kwargs: Any) -> Any:
    plot = figure(title=Title(text=title, text_font_size="12pt"), name=name, height=_HEIGHT,
                  sizing_mode="stretch_width",
                  tools=_TOOLS, toolbar_location="above", **kwargs)
    plot.xaxis.axis_label = x_label
    plot.yaxis.axis_label = y_label
    return plot


def _table(source: ColumnDataSource, name: str, columns: list[TableColumn],
           height: int = _TABLE_HEIGHT) -> DataTable:
    table = DataTable(source=source, columns=columns, name=name, height=height, row_height=22,
                      sizing_mode="stretch_width", index_position=None, sortable=True,
                      reorderable=False)
    # BokehJS redraws a table when its rows' count changes, not when new data keeps the
    # count (the latest batch's figures, the top keys): redraw on every new data
    source.js_on_change("data", CustomJS(args={"table": table}, code="table.change.emit()"))
    return table


def _num(field: str, title: str, fmt: str = "0,0", width: int = 80) -> TableColumn:
    return TableColumn(field=field, title=title, width=width,
                       formatter=NumberFormatter(format=fmt, null_format="-", nan_format="-"))


def _text(field: str, title: str, width: int = 120) -> TableColumn:
    return TableColumn(field=field, title=title, formatter=StringFormatter(), width=width)


def _time(field: str, title: str = "time (UTC)") -> TableColumn:
    return TableColumn(field=field, title=title, width=150,
                       formatter=DateFormatter(format="%Y-%m-%d %H:%M:%S", nan_format="-",
                                               null_format="-"))


def _legend_outside(fig: Any, *, hide: bool = False) -> None:
    """Move ``fig``'s legend out of the plotted area, into one row under the x axis, so it
    never covers a line (``hide``: a click on an entry hides its line)."""
    legend = fig.legend[0]
    fig.center = [r for r in fig.center if r is not legend]
    legend.orientation = "horizontal"
    legend.location = "center"
    legend.label_text_font_size = "8pt"
    legend.border_line_alpha = 0
    legend.padding = 2
    if hide:
        legend.click_policy = "hide"
    fig.add_layout(legend, "below")


def _heat_map(cells: ColumnDataSource, field: str, title: str, unit: str,
              name: str) -> Any:
    mapper = LinearColorMapper(palette=Viridis256, low=0, low_color="#d9d9d9")
    plot = _figure(title, "batch", "partition", name)
    plot.rect(x="batch", y="partition", width=1, height=1, source=cells, line_color=None,
              fill_color={"field": field, "transform": mapper})
    plot.add_tools(HoverTool(tooltips=[("batch", "@batch"), ("partition", "@partition"),
                                       ("rows", "@rows{0,0}"), ("task ms", "@task_ms{0.0}"),
                                       ("executor", "@executor"), ("local copy", "@sync")]))
    plot.add_layout(ColorBar(color_mapper=mapper, title=unit, width=10), "right")
    plot.xgrid.visible = plot.ygrid.visible = False
    return plot


def build_layout(sources: Mapping[str, ColumnDataSource], *, title_html: str,
                 suffix: str = "") -> LayoutDOM:
    """The page's layout over its sources (one per :data:`SOURCE_COLUMNS` entry).

    Parameters
    ----------
    sources : mapping of str to ColumnDataSource
        The data sources by name (empty ones the live page's poller fills).
    title_html : str
        The (already escaped) HTML of the title line.
    suffix : str
        Added to every model name (a report's second and later runs).

    Returns
    -------
    bokeh.models.layouts.LayoutDOM
        A grid of 12 equal columns stretching to the page's width, about 1,050 pixels high
        (it fits a 1400 x 1000 window with a short scroll).

    Notes
    -----
    Cost: builds about 60 Bokeh models; no data is read.

    Examples
    --------
    >>> from trilink_spark.ui.model import SOURCE_COLUMNS
    >>> srcs = {n: ColumnDataSource({c: [] for c in cols}) for n, cols in SOURCE_COLUMNS.items()}
    >>> build_layout(srcs, title_html="<b>x</b>").select_one({"name": "balance"}) is not None
    True
    """
    missing = sorted(set(SOURCE_COLUMNS) - set(sources))
    if missing:
        raise InvalidArgumentError(f"build_layout needs a source for each of "
                                   f"{sorted(SOURCE_COLUMNS)}; missing {missing}")

    def named(name: str) -> str:
        return name + suffix

    title = Div(text=title_html, name=named("title"), sizing_mode="stretch_width")
    headline = _table(sources["headline"], named("headline"), [
        _text("run", "run"), _num("batch", "latest batch"), _num("partitions", "partitions"),
        _text("strategy", "strategy in force"),
        _num("balance_degree", "balance degree", "0.000"), _num("batches", "batches held"),
        _text("shown", "on this page")], height=64)

    rows_map = _heat_map(sources["cells"], "rows", "Rows per partition per batch", "rows",
                         named("partition_rows"))
    task_map = _heat_map(sources["cells"], "task_ms", "Task time per partition per batch",
                         "ms", named("partition_task_ms"))
    latest_rows = _figure("Latest batch: rows per partition", "partition", "rows",
                          named("latest_rows"))
    latest_rows.vbar(x="partition", top="rows", width=0.8, source=sources["latest_rows"],
                     color=Category10[10][0])
    latest_rows.add_tools(HoverTool(tooltips=[("partition", "@partition"),
                                              ("rows", "@rows{0,0}")]))
    latest_rows.y_range.start = 0

    balance = _figure("Balance over batches", "batch", "balance degree / keyed bound",
                      named("balance"), y_range=Range1d(start=0, end=1.05))
    balance.line("batch", "balance_degree", source=sources["balance"], line_width=2,
                 color=Category10[10][0], legend_label="balance degree")
    balance.scatter("batch", "balance_degree", source=sources["balance"], size=4,
                    color=Category10[10][0])
    balance.line("batch", "keyed_bound", source=sources["bound"], line_width=2,
                 line_dash="dashed", color=Category10[10][2], legend_label="keyed bound")
    extra = balance.line("batch", "extra_compute_time", source=sources["balance"],
                         line_width=1.5, color=Category10[10][3],
                         legend_label="extra compute time (right)", y_range_name="extra")
    balance.extra_y_ranges = {"extra": DataRange1d(renderers=[extra], start=0)}
    balance.add_layout(LinearAxis(y_range_name="extra", axis_label="extra compute time"),
                       "right")
    _legend_outside(balance, hide=True)
    balance.add_tools(HoverTool(tooltips=[("batch", "@batch"), ("value", "$y{0.000}")]))

    late = _figure("Late rows per batch", "batch", "late rows", named("late"))
    for name, label, colour in (("late_key", "by key watermark", Category10[10][0]),
                                ("late_partition", "by partition watermark",
                                 Category10[10][1])):
        late.line("batch", "rows", source=sources[name], line_width=2, color=colour,
                  legend_label=label)
        late.scatter("batch", "rows", source=sources[name], size=4, color=colour)
    _legend_outside(late)
    late.add_tools(HoverTool(tooltips=[("batch", "@batch"), ("late rows", "@rows{0,0}")]))

    latest = _table(sources["latest"], named("latest"), [
        _text("figure", "latest batch", 140), _text("value", "value")])
    candidates = _table(sources["candidates"], named("candidates"), [
        _text("strategy", "candidate (latest sample)", 160),
        _num("balance_degree", "balance degree", "0.000"),
        _num("extra_compute_time", "extra compute", "0.000"),
        _num("keyed_bound", "keyed bound", "0.000"), _text("in_force", "in force")])
    hot_keys = _table(sources["hot_keys"], named("hot_keys"), [
        _num("rank", "#", width=30), _text("key", "hottest key (latest batch)", 200),
        _num("rows", "rows"),
        _num("partition", "partition")])

    timeline = _figure("Swaps and rebalances", "time (UTC)", "", named("timeline"),
                       x_axis_type="datetime", y_range=Range1d(start=-0.5, end=2.5))
    timeline.scatter("time_ms", "lane", source=sources["timeline"], size=12,
                     marker=factor_mark("kind", _KIND_MARKERS, _KINDS),
                     color=factor_cmap("kind", _KIND_COLOURS, _KINDS))
    # each kind has its lane, named on the axis: no legend over the markers
    timeline.yaxis.ticker = FixedTicker(ticks=sorted(set(TIMELINE_LANES.values())))
    timeline.yaxis.major_label_overrides = {0: "rebalance", 1: "swap", 2: "request"}
    timeline.add_tools(HoverTool(tooltips=[("kind", "@kind"), ("batch", "@batch"),
                                           ("what", "@what"), ("moved keys", "@moved_keys"),
                                           ("pause s", "@pause_s{0.000}")]))
    timeline_table = _table(sources["timeline"], named("timeline_table"), [
        _time("time_ms"), _text("kind", "kind", 70), _num("batch", "batch"),
        _text("what", "what", 300), _num("moved_keys", "moved keys"),
        _num("moved_bytes", "moved bytes"), _num("pause_s", "pause s", "0.000"),
        _text("refused", "refused")])

    advice = _table(sources["advice"], named("advice"), [
        _time("time_ms"), _text("source", "source", 80), _num("batch", "batch"),
        _text("advice", "advice", 300), _text("reason", "reason", 500), _text("run", "run")],
        height=110)
    progress = _figure("Query progress", "batch", "input rows", named("progress"))
    progress.scatter("batch", "input_rows", source=sources["progress"], size=6,
                     color=Category10[10][0], legend_label="input rows")
    duration = progress.scatter("batch", "duration_ms", source=sources["progress"], size=6,
                                marker="square", color=Category10[10][1],
                                legend_label="duration ms (right)", y_range_name="ms")
    progress.extra_y_ranges = {"ms": DataRange1d(renderers=[duration], start=0)}
    progress.add_layout(LinearAxis(y_range_name="ms", axis_label="duration ms"), "right")
    _legend_outside(progress)
    progress.add_tools(HoverTool(tooltips=[("query", "@query"), ("batch", "@batch"),
                                           ("input rows", "@input_rows{0,0}"),
                                           ("duration ms", "@duration_ms{0,0}")]))
    return GridBox(children=[
        (title, 0, 0, 1, 12), (headline, 1, 0, 1, 12),
        (rows_map, 2, 0, 1, 4), (task_map, 2, 4, 1, 4), (latest_rows, 2, 8, 1, 4),
        (balance, 3, 0, 1, 4), (late, 3, 4, 1, 4), (latest, 3, 8, 1, 4),
        (candidates, 4, 0, 1, 4), (hot_keys, 4, 4, 1, 4), (progress, 4, 8, 1, 4),
        (timeline, 5, 0, 1, 5), (timeline_table, 5, 5, 1, 7),
        (advice, 6, 0, 1, 12)], sizing_mode="stretch_width", **_GRID)


def _title_html(title: str, subtitle: str) -> str:
    return (f'<div style="font-family: sans-serif"><span style="font-size: 16pt; '
            f'font-weight: bold">{html.escape(title)}</span>&nbsp;&nbsp;'
            f'<span style="color: #555">{html.escape(subtitle)}</span></div>')


def live_page_html(*, title: str = "trilink-spark dashboard", run: str | None = None,
                   token: str | None = None, refresh_ms: int = 1000,
                   snapshot: Mapping[str, Mapping[str, list[Any]]] | None = None,
                   version: int | None = None) -> str:
    """The live page's HTML: the data of ``snapshot`` drawn at once, then one poller asks
    ``/data.json`` on the server that sends it for what changed since ``version``
    (:data:`_POLL_JS`); BokehJS comes from that server's ``/static/`` route.

    Parameters
    ----------
    title : str
        The page title.
    run : str, optional
        The run the page shows (default: the server's first run).
    token : str, optional
        Sent as ``Authorization: Bearer <token>`` on every data request, and as ``?token=``
        on the script URLs.
    refresh_ms : int
        How often the page asks for new data, in milliseconds (>= 100).
    snapshot : mapping, optional
        The model's column data (:meth:`~trilink_spark.ui.model.DashboardModel.snapshot`)
        to draw before any poll, so a plain fetch, a reader that never polls and a screenshot
        taken at load show data; default: empty sources, filled by the first poll.
    version : int, optional
        The model version ``snapshot`` is at (read before it): the first poll asks for what
        changed since then. Needs ``snapshot``.

    Returns
    -------
    str
        The HTML page; it names no host (every URL is a path on the same server).

    Notes
    -----
    Cost: builds and serialises the Bokeh document (tens of milliseconds); the server
    caches the result.

    Examples
    --------
    >>> page = live_page_html(refresh_ms=500)
    >>> '"/static/js/bokeh.min.js' in page, "http://" in page
    (True, False)
    """
    refresh = count(refresh_ms, "refresh_ms", 100)
    if not isinstance(title, str):
        raise InvalidArgumentTypeError(f"title must be a str, got {type(title).__name__}")
    if run is not None and not isinstance(run, str):
        raise InvalidArgumentTypeError(f"run must be a str or None, got {type(run).__name__}")
    if (snapshot is None) != (version is None):
        raise InvalidArgumentError("snapshot and version go together: pass both (the model's "
                                   "version, read before its snapshot) or neither")
    start = -1 if version is None else count(version, "version", 0)
    query: dict[str, str] = {} if run is None else {"run": run}
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    sources = _frozen_sources(snapshot if snapshot is not None else {
        name: {c: [] for c in cols} for name, cols in SOURCE_COLUMNS.items()}, "")
    poll = CustomJS(args={"sources": list(sources.values()), "names": list(sources),
                          "url": "/data.json?" + urlencode(query), "headers": headers,
                          "refresh": refresh, "start": start}, code=_POLL_JS)
    shown = "first run" if run is None else f"run {run}"
    layout = build_layout(sources, title_html=_title_html(
        title, f"live, {shown}, refreshed every {refresh / 1000:g} s"))
    document = Document()
    document.add_root(layout)
    document.js_on_event("document_ready", poll)
    token_query = "" if token is None else f"?token={quote(token, safe='')}"
    resources = Resources(mode="server", root_url="/",
                          path_versioner=lambda path: path + token_query)
    return str(file_html(document, resources=resources, title=title))


def _frozen_sources(snapshot: Mapping[str, Mapping[str, list[Any]]],
                    suffix: str) -> dict[str, ColumnDataSource]:
    return {name: ColumnDataSource(data={c: list(snapshot[name][c]) for c in cols},
                                   name=f"source_{name}{suffix}")
            for name, cols in SOURCE_COLUMNS.items()}


def report_html(model: DashboardModel, *, title: str = "trilink-spark report") -> str:
    """A self-contained HTML report of what the model holds: BokehJS inlined, the data
    frozen in the page; one tab per run (none held: one empty view).

    Notes
    -----
    Cost: one :meth:`~trilink_spark.ui.model.DashboardModel.snapshot` per run plus the
    page's serialisation; the file is about 2 MB of BokehJS plus the data.

    Examples
    --------
    >>> m = DashboardModel()
    >>> m.add_record({"v": 1, "batch": 5, "time": 0, "seconds": 0, "strategy": "hash",
    ...               "partitions": 1, "rows": [7]})
    True
    >>> "BEGIN bokeh.min.js" in report_html(m)
    True
    """
    if not isinstance(title, str):
        raise InvalidArgumentTypeError(f"title must be a str, got {type(title).__name__}")
    runs: list[str | None] = [*model.runs] or [None]
    panels: list[tuple[str | None, LayoutDOM]] = []
    for i, run in enumerate(runs):
        suffix = "" if i == 0 else f":{run}"
        layout = build_layout(_frozen_sources(model.snapshot(run), suffix),
                              title_html=_title_html(title, "report" if run is None
                                                     else f"report of run '{run}'"),
                              suffix=suffix)
        panels.append((run, layout))
    root: LayoutDOM = (panels[0][1] if len(panels) == 1 else
                       Tabs(tabs=[TabPanel(child=layout, title=str(run))
                                  for run, layout in panels], sizing_mode="stretch_width"))
    resources = Resources(mode="inline")
    return str(file_html(root, resources=resources, title=title))


def write_report(model_or_records: DashboardModel | Iterable[Mapping[str, Any]],
                 path: str | Path, *, title: str = "trilink-spark report",
                 history: int = 200) -> Path:
    """Write one self-contained HTML report (no network needed to open it).

    Parameters
    ----------
    model_or_records : DashboardModel or iterable of mapping
        A model, or history records (malformed ones are left out with a warning).
    path : str or pathlib.Path
        The file to write (replaced if it exists).
    title : str
        The page title.
    history : int
        Batches per run kept when records are given.

    Returns
    -------
    pathlib.Path
        The file written.

    Notes
    -----
    Cost: :func:`report_html` plus one file write of about 2 MB.

    Examples
    --------
    >>> import tempfile, os
    >>> out = write_report([], os.path.join(tempfile.mkdtemp(), "r.html"))
    >>> out.stat().st_size > 1_000_000
    True
    """
    if isinstance(model_or_records, DashboardModel):
        model = model_or_records
    else:
        if isinstance(model_or_records, (str, bytes, Mapping)):
            raise InvalidArgumentTypeError(
                "model_or_records must be a DashboardModel or an iterable of history "
                f"records, got {type(model_or_records).__name__}")
        model = DashboardModel(history=history)
        model.add_records(model_or_records)
    if not isinstance(path, (str, Path)):
        raise InvalidArgumentTypeError(f"path must be a str or pathlib.Path, got "
                                       f"{type(path).__name__}")
    out = Path(path)
    out.write_text(report_html(model, title=title), encoding="utf-8")
    logger.debug("dashboard report written to %s", out)
    return out
