"""The agent-side SGLang collector: tails the server log, scrapes ``/metrics``, and sends what it read
as plain records (``perfd.core.serving_records.ServingData`` in ``serving_data`` events). The aggregator
analyses them (perfd/aggregator/serving.py), as it does Megatron's step records: the job's serving gauges and
report are computed there, by the same functions ``perfd analyze sglang`` uses offline."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path

from perfd.collectors.collector import Capabilities, Collected, Collector
from perfd.collectors.config_values import as_float, as_int
from perfd.collectors.megatron.gaps import TailGaps
from perfd.collectors.megatron.tail import LogTail
from perfd.collectors.sglang.metrics import scrape
from perfd.collectors.sglang.parser import SglangLogParser
from perfd.core.events import SERVING_DATA
from perfd.core.serving_model import ServingModelSpec
from perfd.core.serving_records import MetricsSnapshot, ServerInfo, ServingData, ServingRecord

CONFIG_KEYS = frozenset({"log_path", "metrics_url", "interval_s", "job", "window_s", "from_start",
                         "scrape_interval_s", "scrape_timeout_s", "model", "gpu", "peak_tflops",
                         "peak_bandwidth", "max_bytes_per_collect", "report_interval_s"})


class SglangCollector(Collector):
    """Config (see sample.yaml): ``log_path`` and/or ``metrics_url`` (at least one), ``job``,
    ``interval_s`` (default 2), ``window_s`` (default 60), ``scrape_interval_s`` (default 5),
    ``from_start`` (default true: the start-up lines hold max_running_requests and the weight and KV
    pool sizes; while the tail is still catching up on an existing log nothing is sent, so old
    lines never pass for current numbers), ``model`` (ServingModelSpec keys, for MBU/MFU), ``gpu``
    (NVML name, for the peaks), ``peak_tflops``, ``peak_bandwidth`` (bytes/s), ``report_interval_s``
    (default 30: how often the server's start-up facts are sent again). ``window_s``, ``model``,
    ``gpu`` and the peaks travel with the data: the aggregator's analysis uses them."""

    name = "sglang"
    default_interval_s = 2.0
    MAX_RECORDS_PER_EVENT = 2000  # ~1 MB of JSON: well under the transport's message size

    def __init__(self, config: Mapping[str, object]) -> None:
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
        self.default_interval_s = as_float(config.get("interval_s", 2.0))
        self.scrape_interval_s = as_float(config.get("scrape_interval_s", 5.0))
        self.scrape_timeout_s = as_float(config.get("scrape_timeout_s", 2.0))
        self.from_start = bool(config.get("from_start", True))
        # The server's start-up facts are resent every report_interval_s (not only when they change),
        # so an aggregator that restarted gets them back.
        self.report_interval_s = as_float(config.get("report_interval_s", 30.0))
        self._last_server_sent = -math.inf
        self.max_bytes_per_collect = as_int(config.get("max_bytes_per_collect", 4 << 20))
        if self.default_interval_s <= 0 or self.scrape_interval_s <= 0:
            raise ValueError("sglang: interval_s and scrape_interval_s must be > 0")
        self.window_s = as_float(config.get("window_s", 60.0))
        if self.window_s <= 0:
            raise ValueError("sglang: window_s must be > 0")
        # Checked here so a bad model spec fails at start-up, where a person reads the error; the
        # aggregator reads the same mapping (the analysis settings travel with the data).
        model = config.get("model")
        if model and not isinstance(model, Mapping):
            raise ValueError(f"sglang: model must be a mapping of the model's fields, not {model!r}")
        self.spec = ServingModelSpec.from_mapping(model if isinstance(model, Mapping) else None)
        self.analysis_config: dict[str, object] = {
            k: v for k, v in (("window_s", self.window_s), ("model", config.get("model")),
                              ("gpu", config.get("gpu")), ("peak_tflops", config.get("peak_tflops")),
                              ("peak_bandwidth", config.get("peak_bandwidth"))) if v is not None}
        self.server: ServerInfo | None = None
        self._server_changed = False
        # Records not sent yet, as (time on the log's clock or None, record). Only the last window_s
        # of them are kept (this matters while the tail catches up on an old log): older ones would
        # leave the aggregator's window at once.
        self._pending: deque[tuple[float | None, ServingRecord]] = deque()
        self._latest_log_time = -math.inf
        self._scrape: MetricsSnapshot | None = None
        self.parser = SglangLogParser(Path(self.log_path).name if self.log_path else "sglang.log")
        self.tail: LogTail | None = None
        self.gaps: TailGaps | None = None
        self._last_scrape = -float("inf")
        self._tail_errors_seen: dict[str, int] = {}
        # catching_up: collects that sent nothing while reading an old log; records_pruned: records
        # older than the window dropped while catching up; records_sent, events_sent
        self.counts: dict[str, int] = {}
    def probe(self) -> Capabilities:
        features = {"log": self.log_path is not None, "metrics": self.metrics_url is not None}
        reason = ""
        if self.log_path is not None and not Path(self.log_path).exists():
            reason = f"{self.log_path} does not exist yet; waiting"
        return Capabilities(True, reason, features)

    def start(self) -> None:
        if self.log_path is not None:
            self.tail = LogTail(self.log_path, from_start=self.from_start)
            self.gaps = TailGaps(self.name, self.log_path, self.job, self.count_error)

    def collect(self, now: float) -> Collected:
        out = Collected()
        behind = False
        if self.tail is not None:
            behind = self._read_log(now)
            if self.gaps is not None:
                out.events.extend(self.gaps.events(self.tail))
        mono = time.monotonic()
        if self.metrics_url is not None and mono - self._last_scrape >= self.scrape_interval_s:
            self._last_scrape = mono
            snap, err = scrape(self.metrics_url, now, self.scrape_timeout_s)
            if snap is None:
                self.count_error(f"scrape:{err}", self.metrics_url)
            else:
                for issue in snap.issues:
                    self.count_error("scrape:exposition-issue", issue)
                self._scrape = snap
        self._prune_pending()
        if behind:  # more of the log is waiting: what was read does not describe "now" yet
            self.counts["catching_up"] = self.counts.get("catching_up", 0) + 1
            return out
        out.events.extend(self._data_events(now, mono))
        return out

    def _prune_pending(self) -> None:
        cut = self._latest_log_time - self.window_s
        while self._pending and self._pending[0][0] is not None and self._pending[0][0] < cut:
            self._pending.popleft()
            self.counts["records_pruned"] = self.counts.get("records_pruned", 0) + 1

    def _data_events(self, now: float, mono: float) -> list[dict[str, object]]:
        """The ServingData events of this collect: pending records (in chunks, so one event stays
        small), the server facts when changed or due, the scrape taken since the last send."""
        send_server = self.server is not None and (
            self._server_changed or mono - self._last_server_sent >= self.report_interval_s)
        if not self._pending and self._scrape is None and not send_server:
            return []
        recs = [r for _, r in self._pending]
        self._pending.clear()
        chunks = [recs[i:i + self.MAX_RECORDS_PER_EVENT]
                  for i in range(0, len(recs), self.MAX_RECORDS_PER_EVENT)] or [[]]
        events = []
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            data = ServingData(self.job, chunk, self.server if send_server and i == 0 else None,
                               self._scrape if last else None, self.analysis_config)
            events.append({"kind": SERVING_DATA.name, "severity": "info", "time": now, "job": self.job,
                           "text": f"{len(chunk)} serving record(s) of {self.job}",
                           "labels": {"job": self.job}, "payload": data.to_json()})
        if send_server:
            self._server_changed, self._last_server_sent = False, mono
        self._scrape = None
        self.counts["records_sent"] = self.counts.get("records_sent", 0) + len(recs)
        self.counts["events_sent"] = self.counts.get("events_sent", 0) + len(events)
        return events

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
            if self.parser.server is not None:
                self.server, self._server_changed = self.parser.server, True
            self.parser.server_changed = False
        for r in recs:
            t = r.timeline()
            if t is not None:
                self._latest_log_time = max(self._latest_log_time, t)
            self._pending.append((t, r))
        for issue in self.parser.issues:
            self.count_error(f"parse:{issue.reason.split(':', 1)[0]}",
                             f"line {issue.line_no}: {issue.text[:80]}")
        self.parser.issues.clear()
        return behind

    def stop(self) -> None:
        if self.tail is not None:
            self.tail.close()
