"""Reports over an analysed run: build_report, Report, render_text, render_rich.

The names below are loaded when first asked for (PEP 562), not with the package: the aggregator reads
the report's word modules (perfd.report.incident_text, collective_text, ...), and importing any of them
loaded the text renderer and rich with this package (0.14 s of CPU at every aggregator start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perfd.report.render import render_rich, render_text
    from perfd.report.training_report import Report, ReportMetric, ReportSummary, analysis_json, build_report

# name -> the module that defines it
_WHERE = {"render_rich": "perfd.report.render", "render_text": "perfd.report.render",
          **{n: "perfd.report.training_report"
             for n in ("Report", "ReportMetric", "ReportSummary", "analysis_json", "build_report")}}

__all__ = ["Report", "ReportMetric", "ReportSummary", "analysis_json", "build_report", "render_rich",
           "render_text"]


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # asked once
    return value
