"""ModelView report: every sweep as plots first (the seed's "maximum throughput by model and setting" chart, scaling,
speed-up, roofline, compile cost, latency, GPU telemetry), then failures and the environment, in one offline HTML file.
"""

from .build import Report, build_report, render_html, write_report
from .data import CellRow, Database, RunInfo, StoreNotFound

__all__ = ["CellRow", "Database", "Report", "RunInfo", "StoreNotFound", "build_report", "render_html", "write_report"]
