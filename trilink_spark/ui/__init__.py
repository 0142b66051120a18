"""The live view: a page of a running query's skew, and reports of a run's history.

- :func:`dashboard` starts a small web server in the driver and returns its URL: per-partition
  rows and task time per batch, the balance degree beside the keyed bound and the extra
  compute time, the strategy in force and what every candidate would give, the hottest keys,
  swaps and rebalances on a timeline, late rows by key against partition watermark, and the
  bottleneck, DS2 and elasticity advice, updated after each micro-batch;
- :func:`write_state_report` (``trilink-spark report PATH --html out.html``) writes the
  history a run's state path keeps as one self-contained HTML file.

Built on Bokeh (the ``[ui]`` extra); every asset is served from the installed package, so the
page works offline. The page is read-only and binds 127.0.0.1 unless told otherwise (any
other address needs a token).

Examples
--------
>>> import trilink_spark as tl
>>> url = tl.dashboard(spark, runs=[run])  # doctest: +SKIP
>>> url.stop()  # doctest: +SKIP
"""

from .dashboard import Dashboard, dashboard
from .report import require_ui, write_state_report

__all__ = ["Dashboard", "dashboard", "write_state_report", "require_ui"]
