"""The study report as one self-contained HTML file (``tune report``)."""

from prefill_tuner.output.html.page import ReportFiles, image_path, render_report, write_report

__all__ = ["ReportFiles", "image_path", "render_report", "write_report"]
