"""The study report as one self-contained HTML file (``tune report``)."""

from prefill_tuner.output.html.page import render_report, write_report

__all__ = ["render_report", "write_report"]
