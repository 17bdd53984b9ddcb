"""The agent-side SGLang collector: tails the server log, scrapes ``/metrics``, and emits the job's
serving gauges (catalog names, label ``job_name``) computed over a sliding window."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from collectors.megatron.tail import LogTail
from collectors.sglang.metrics import scrape
from collectors.sglang.parser import SglangLogParser
from perfd.analytics.serving import ServingWindow
from perfd.analytics.serving_spec import ServingModelSpec
from perfd.collector import Capabilities, Collected, Collector
from perfd.events import SERVING_REPORT
from perfd.model import Sample

CONFIG_KEYS = frozenset({"log_path", "metrics_url", "interval_s", "job", "window_s", "from_start",
                         "scrape_interval_s", "scrape_timeout_s", "model", "gpu", "peak_tflops",
                         "peak_bandwidth", "max_bytes_per_collect", "report_interval_s"})


class SglangCollector(Collector):
    """Config (see sample.yaml): ``log_path`` and/or ``metrics_url`` (at least one), ``job``,
    ``interval_s`` (default 2), ``window_s`` (default 60), ``scrape_interval_s`` (default 5),
    ``from_start`` (default true: the start-up lines hold max_running_requests and the weight and KV
    pool sizes; while the tail is still catching up on an existing log nothing is emitted, so old
    lines never pass for current numbers), ``model`` (ServingModelSpec keys, for MBU/MFU), ``gpu``
    (NVML name, for the peaks), ``peak_tflops``, ``peak_bandwidth`` (bytes/s)."""

    name = "sglang"
    default_interval_s = 2.0

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            raise ValueError(f"sglang: unknown config key(s) {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(CONFIG_KEYS))}")
        self.log_path = str(config["log_path"]) if config.get("log_path") else None
        self.metrics_url = str(config["metrics_url"]) if config.get("metrics_url") else None
        if self.log_path is None and self.metrics_url is None:
            raise ValueError("sglang: set log_path (the server log) and/or metrics_url (its /metrics)")
        self.job = str(config.get("job") or "default")
        self.default_interval_s = float(config.get("interval_s", 2.0))
        self.scrape_interval_s = float(config.get("scrape_interval_s", 5.0))
        self.scrape_timeout_s = float(config.get("scrape_timeout_s", 2.0))
        self.from_start = bool(config.get("from_start", True))
        # The four-part serving report, built here (where the records are) and sent as an event
        # every report_interval_s: the aggregator shows the latest one in the job summary.
        self.report_interval_s = float(config.get("report_interval_s", 30.0))
        self._last_report = -math.inf
        self.max_bytes_per_collect = int(config.get("max_bytes_per_collect", 4 << 20))
        if self.default_interval_s <= 0 or self.scrape_interval_s <= 0:
            raise ValueError("sglang: interval_s and scrape_interval_s must be > 0")
        spec = ServingModelSpec.from_mapping(config.get("model"))
        self.window = ServingWindow(float(config.get("window_s", 60.0)), spec=spec,
                                    gpu_name=config.get("gpu"), peak_tflops=config.get("peak_tflops"),
                                    peak_bandwidth=config.get("peak_bandwidth"))
        self.parser = SglangLogParser(Path(self.log_path).name if self.log_path else "sglang.log")
        self.tail: LogTail | None = None
        self._last_scrape = -float("inf")
        self._tail_errors_seen: dict[str, int] = {}
        self.last_metrics: dict[str, float] = {}
        self.counts: dict[str, int] = {}  # catching_up: collects skipped while reading an old log

    def probe(self) -> Capabilities:
        features = {"log": self.log_path is not None, "metrics": self.metrics_url is not None}
        reason = ""
        if self.log_path is not None and not Path(self.log_path).exists():
            reason = f"{self.log_path} does not exist yet; waiting"
        return Capabilities(True, reason, features)

    def start(self) -> None:
        if self.log_path is not None:
            self.tail = LogTail(self.log_path, from_start=self.from_start)

    def collect(self, now: float) -> Collected:
        out = Collected()
        behind = False
        if self.tail is not None:
            behind = self._read_log(now)
        mono = time.monotonic()
        if self.metrics_url is not None and mono - self._last_scrape >= self.scrape_interval_s:
            self._last_scrape = mono
            snap, err = scrape(self.metrics_url, now, self.scrape_timeout_s)
            if snap is None:
                self.count_error(f"scrape:{err}", self.metrics_url)
            else:
                for issue in snap.issues:
                    self.count_error("scrape:exposition-issue", issue)
                self.window.add_scrape(snap)
        if behind:  # more of the log is waiting: the window does not describe "now" yet
            self.counts["catching_up"] = self.counts.get("catching_up", 0) + 1
            return out
        self.last_metrics = self.window.metrics()
        if mono - self._last_report >= self.report_interval_s and (
                self.window.records() or self.window.scrape_pair()[1] is not None):
            self._last_report = mono
            out.events.append(self._report_event(now))
        labels = {"job_name": self.job}
        out.samples.extend(Sample(name, value, now, dict(labels))
                           for name, value in sorted(self.last_metrics.items()))
        return out

    def _report_event(self, now: float) -> dict[str, Any]:
        from perfd.analytics.serving import ServingAnalysis
        from perfd.analytics.serving_findings import derive_serving_findings
        from perfd.report.serving import build_serving_report

        summary = self.window.summary()
        findings, recs = derive_serving_findings(summary, self.window.server)
        report = build_serving_report(ServingAnalysis(self.job, summary, findings, recs, self.window.server))
        return {"kind": SERVING_REPORT.name, "severity": "info", "time": now, "job": self.job,
                "text": f"serving report of {self.job}: {report.summary.headline}",
                "labels": {"job": self.job}, "payload": report.to_json()}

    def _read_log(self, now: float) -> bool:
        """Feed new lines to the window; True when the read hit its byte budget (more is waiting)."""
        assert self.tail is not None
        before = self.tail.counts.get("bytes", 0)
        lines = self.tail.read_lines(max_bytes=self.max_bytes_per_collect)
        behind = self.tail.counts.get("bytes", 0) - before >= self.max_bytes_per_collect
        for reason, n in self.tail.errors.items():
            for _ in range(n - self._tail_errors_seen.get(reason, 0)):
                self.count_error(f"tail:{reason}", self.log_path or "")
            self._tail_errors_seen[reason] = n
        recs = []
        for line in lines:
            recs.extend(self.parser.feed(line))
        if self.parser.server_changed:
            self.window.set_server(self.parser.server)
            self.parser.server_changed = False
        if recs:
            self.window.add_records(recs, now)
        for issue in self.parser.issues:
            self.count_error(f"parse:{issue.reason.split(':', 1)[0]}",
                             f"line {issue.line_no}: {issue.text[:80]}")
        self.parser.issues.clear()
        return behind

    def stop(self) -> None:
        if self.tail is not None:
            self.tail.close()
