"""The agent's own HTTP: its /metrics (every node series' latest value, its self-metrics) and /healthz.
Apart from the agent's loop (node_agent.py), which it reads through :class:`MetricSource` at scrape
time only: what a scrape serves and what the loop does share nothing but those reads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from perfd.core.model import Sample, label_set
from perfd.exporters import httpd
from perfd.exporters.prometheus import build_info_families, series_families


class MetricSource(Protocol):
    """What a scrape reads of the agent."""

    def node_rows(self) -> list[tuple[Mapping[str, str], str, float]]: ...

    def self_metric_rows(self) -> list[tuple[Mapping[str, str], str, float]]: ...

    def collect_duration_family(self) -> Metric: ...


class LatestSeries:
    """Latest value of every node series the agent produced, for its own /metrics.

    A collector's collect that emits a metric gives all of that metric's series from that collector:
    its earlier series of the metric that it did not emit again are gone (a rank whose state went
    from running to sleeping, an info series labelled with the state, is no longer both; a GPU
    process that left is no longer listed). A metric a collect did not emit at all keeps its series
    (collectors emit some metrics only at some collects)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (collector, metric) -> label set -> value
        self._latest: dict[tuple[str, str], dict[tuple[tuple[str, str], ...], float]] = {}

    def update(self, collector: str, samples: list[Sample]) -> None:
        fresh: dict[tuple[str, str], dict[tuple[tuple[str, str], ...], float]] = {}
        for s in samples:
            fresh.setdefault((collector, s.name), {})[label_set(s.labels)] = s.value
        with self._lock:
            self._latest.update(fresh)

    def rows(self) -> list[tuple[Mapping[str, str], str, float]]:
        with self._lock:
            return [(dict(lbl), name, v) for (_, name), series in self._latest.items()
                    for lbl, v in series.items()]


class AgentMetrics:
    """Scrape-time view: node series + the agent's self-metrics (catalog names)."""

    def __init__(self, agent: MetricSource) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        a = self.agent
        yield from series_families(a.node_rows())
        yield from series_families(a.self_metric_rows())
        yield a.collect_duration_family()
        yield from build_info_families()


class MetricsHandler(httpd.BufferedHandler):
    """The agent's HTTP: /metrics and /healthz; anything else is 404."""

    app: CollectorRegistry

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/metrics":
            body, headers = httpd.metrics_response(self.app, self.headers.get("Accept"),
                                                   self.headers.get("Accept-Encoding"))
        elif path == "/healthz":
            body, headers = b"ok\n", [("Content-Type", "text/plain")]
        else:
            body, headers = b"only /metrics and /healthz here\n", [("Content-Type", "text/plain")]
        self.send_response(200 if path in httpd.PROBE_PATHS else 404)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
