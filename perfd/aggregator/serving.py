"""The aggregator's serving view: per-job SGLang records and scrapes, and their latest analysis.

The SGLang collector sends plain records (``perfd.core.serving_records.ServingData`` in ``serving_data``
events); here they feed one ``ServingWindow`` per job, and
``perfd.analytics.serving.serving_analysis.analyze_window`` plus
``perfd.report.serving_report.build_serving_report`` turn the window into the job's serving gauges (catalog
names, label ``job_name``) and its four-part report: the same functions ``perfd analyze sglang`` runs
offline. The analysis is recomputed at most every ``min_recompute_s`` and only when data arrived.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics.serving.serving_analysis import ServingWindow, analyze_window
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.core.record_json import JsonWritten
from perfd.core.serving_model import ServingModelSpec
from perfd.core.serving_records import ServingData
from perfd.report.serving_report import build_serving_report
from perfd.report.training_report import Report

log = logging.getLogger(__name__)

SOURCE = "collectors/sglang (scheduler log lines and /metrics), per job"
Row = tuple[Mapping[str, str], str, float]


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def window_from_config(cfg: Mapping[str, Any]) -> ServingWindow:
    """The window for the analysis settings a collector sent (ValueError/TypeError if malformed)."""
    spec = ServingModelSpec.from_mapping(cfg.get("model"))
    return ServingWindow(float(cfg.get("window_s", 60.0)), spec=spec,
                         gpu_name=str(cfg["gpu"]) if cfg.get("gpu") is not None else None,
                         peak_tflops=_opt_float(cfg.get("peak_tflops")),
                         peak_bandwidth=_opt_float(cfg.get("peak_bandwidth")))


@dataclass
class _Job:
    window: ServingWindow
    config: dict[str, Any]
    dirty: bool = True
    computed_at: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    report: Report | None = None


@dataclass(frozen=True)
class ServingView(JsonWritten):
    """A serving job's gauges (catalog name -> value) and its latest report (None: no data to report
    on yet), with the report's age; JSON where it is served (perfd/aggregator/http.py)."""

    metrics: dict[str, float]
    report: Report | None
    report_age_s: float | None
    source: str = SOURCE


class ServingStore:
    """Per-job serving records and the latest analysis. Thread-safe: ingest runs on the gRPC side,
    views on the HTTP side."""

    def __init__(self, min_recompute_s: float = 1.0, clock: Clock = REAL_CLOCK) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self.min_recompute_s = min_recompute_s
        self.clock = clock
        self.records = 0
        self.errors: dict[str, int] = {}  # reason -> count of refused payloads or failed analyses

    def _error(self, reason: str, detail: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1
        log.warning("serving: %s (%s)", reason, detail)

    def ingest(self, payload: Any, now: float | None = None) -> str | None:
        """Add one ServingData payload; the job's name, or None when the payload is refused
        (counted in ``errors`` and logged)."""
        try:
            data = ServingData.from_json(payload)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            self._error("bad-payload", f"{type(exc).__name__}: {exc}")
            return None
        t = self.clock.time() if now is None else now
        with self._lock:
            js = self._jobs.get(data.job)
            if js is None or js.config != data.config:
                try:
                    window = window_from_config(data.config)
                except (ValueError, TypeError) as exc:
                    self._error("bad-config", f"job {data.job}: {exc}")
                    return None
                if js is not None:  # settings changed: keep what was received, in the new window
                    window.set_server(js.window.server)
                    window.add_records(js.window.records(), t)
                    prev, cur = js.window.scrape_pair()
                    for snap in (prev, cur):
                        if snap is not None:
                            window.add_scrape(snap)
                js = self._jobs[data.job] = _Job(window, dict(data.config))
            js.window.set_server(data.server)
            if data.records:
                js.window.add_records(data.records, t)
            if data.scrape is not None:
                js.window.add_scrape(data.scrape)
            js.dirty = True
            self.records += len(data.records)
        return data.job

    def job_names(self) -> list[str]:
        with self._lock:
            return sorted(self._jobs)

    def forget(self, job: str) -> None:
        with self._lock:
            self._jobs.pop(job, None)

    def _analyse(self, job: str, js: _Job) -> None:
        """Recompute the job's gauges and report if data arrived and the last one is old enough.
        Called with the lock held."""
        now = self.clock.time()
        if not js.dirty or (js.computed_at is not None and now - js.computed_at < self.min_recompute_s):
            return
        w = js.window
        try:
            analysis = analyze_window(job, w)
            js.metrics = analysis.summary.job_metrics()
            has_data = bool(w.records()) or w.scrape_pair()[1] is not None
            js.report = build_serving_report(analysis) if has_data else None
        except Exception as exc:  # one bad job must not break the summary or the scrape
            log.exception("serving analysis of job %s failed", job)
            self.errors["analysis"] = self.errors.get("analysis", 0) + 1
            js.metrics, js.report = {}, None
            log.debug("serving analysis error: %s", exc)
        js.computed_at, js.dirty = now, False

    def view(self, job: str) -> ServingView | None:
        """A serving job's gauges and report; None if perfd has no serving data of it."""
        with self._lock:
            js = self._jobs.get(job)
            if js is None:
                return None
            self._analyse(job, js)
            metrics, report, at = dict(js.metrics), js.report, js.computed_at
        if not metrics and report is None:
            return None
        age = round(self.clock.time() - at, 3) if report is not None and at is not None else None
        return ServingView(metrics, report, age)

    def rows(self) -> list[Row]:
        """/metrics rows: every serving job's gauges, label job_name."""
        out: list[Row] = []
        with self._lock:
            for job, js in sorted(self._jobs.items()):
                self._analyse(job, js)
                out.extend(({"job_name": job}, name, v) for name, v in sorted(js.metrics.items())
                           if math.isfinite(v))
        return out
