"""Reports over an analysed run: build_report, Report, render_text, render_rich."""

from perfd.report.render import render_rich, render_text
from perfd.report.training_report import Report, ReportMetric, ReportSummary, analysis_json, build_report

__all__ = ["Report", "ReportMetric", "ReportSummary", "analysis_json", "build_report", "render_rich",
           "render_text"]
