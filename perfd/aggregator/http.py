"""The aggregator's HTTP side: Prometheus /metrics and a small JSON API.

Runs in its own thread (stdlib ThreadingHTTPServer): scrapes and API calls never block the gRPC
event loop that ingests, and the loop never blocks a scrape.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from perfd.aggregator.state import AggregatorState
from perfd.analytics.attribution import foreign_processes, gpu_hints, place_ranks
from perfd.exporters.prometheus import job_families, series_families

log = logging.getLogger(__name__)


class _StateCollector:
    """prometheus_client custom collector reading the aggregator state at scrape time."""

    def __init__(self, state: AggregatorState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        latest: dict[str, dict[str, Any]] = {}
        for job in self.state.job_names():
            try:
                analysis = self.state.analysis(job)
            except Exception:  # counted in stats; one bad job must not break the scrape
                log.exception("analysis of job %s failed", job)
                continue
            if analysis is not None and analysis.iterations:
                latest[job] = analysis.iterations[-1].to_json()
        yield from job_families(latest)
        rank_rows = []
        for job in latest:
            procs, _values, _thr = self.state.gpu_view(job)
            for r, pl in place_ranks(procs).items():
                rank_rows.append(({"job_name": job, "rank": str(r), "node": pl.node, "gpu": pl.gpu},
                                  "perfd_job_rank_info", 1.0))
        yield from series_families(rank_rows)
        rows = []
        for agent, s in self.state.node_series():
            labels = dict(s.labels)
            agent_job = self.state.agent_job.get(agent)
            if agent_job:
                labels["job_name"] = agent_job
            rows.append((labels, s.name, s.value))
        yield from series_families(rows)
        t = self.state.transport_stats or {}
        own = {
            "perfd_aggregator_samples_total": self.state.stats.samples,
            "perfd_aggregator_step_records_total": self.state.stats.steps,
            "perfd_aggregator_batches_total": t.get("batches"),
            "perfd_aggregator_duplicate_batches_total": t.get("duplicates"),
            "perfd_aggregator_decode_errors_total": t.get("decode_errors"),
            "perfd_aggregator_agents_connected": t.get("agents_connected"),
            "perfd_aggregator_agent_dropped_samples_total": t.get("agent_dropped_samples"),
        }
        yield from series_families([({}, k, float(v)) for k, v in own.items() if v is not None])


def rank_view(state: AggregatorState, job: str, world_size: int | None,
              candidates: list[int]) -> dict[str, Any]:
    """Where each rank runs (from the process lists the agents report) and, for the candidate
    slow ranks, what their GPUs show."""
    procs, values, throttles = state.gpu_view(job)
    placements = place_ranks(procs, world_size)
    ranks = []
    for r, pl in sorted(placements.items()):
        key = (pl.node, pl.gpu)
        ranks.append({"rank": r, "node": pl.node, "gpu": pl.gpu, "pid": pl.pid,
                      "local_rank": pl.local_rank, "gpu_values": values.get(key, {}),
                      "throttle_reasons": throttles.get(key, []),
                      "other_processes": [dict(p) for p in foreign_processes(
                          pl, procs.get(key, []), [q.pid for q in placements.values()])]})
    hints = gpu_hints(candidates, placements, values, throttles, procs) if candidates else []
    return {"ranks": ranks, "gpu_hints": [h.to_json() for h in hints],
            "source": "collectors/nvml process lists (RANK from each process's environment) "
                      "joined with the latest NVML values of its GPU"}


def _candidates(full: dict[str, Any]) -> list[int]:
    """Slow-rank candidates: persistent stragglers, else the latest iteration's flagged ranks."""
    summary = full.get("summary") or {}
    ranks = list(summary.get("straggler_persistent_ranks") or [])
    if not ranks and full.get("iterations"):
        ranks = list(full["iterations"][-1].get("straggler_candidate_ranks") or [])
    return [int(r) for r in ranks]


def job_summary(state: AggregatorState, job: str) -> dict[str, Any] | None:
    overview = state.job_overview(job)
    if overview is None:
        return None
    analysis = state.analysis(job, force=True)
    if analysis is None or not analysis.iterations:
        return {"overview": overview, "latest": None, "summary": None, "report": None,
                **rank_view(state, job, None, [])}
    full = analysis.to_json()
    world = (full.get("job") or {}).get("layout", {}).get("world_size")
    return {
        "overview": overview,
        "job": full["job"],
        "latest": full["iterations"][-1],
        "summary": full["summary"],
        "report": full["report"],
        **rank_view(state, job, world, _candidates(full)),
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args)

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj, indent=2, allow_nan=False, default=str).encode(),
                   "application/json")

    def do_GET(self) -> None:
        state = self.server.state
        path = urlparse(self.path).path.rstrip("/") or "/"
        try:
            if path == "/metrics":
                self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            elif path == "/api/stats":
                self._json(200, state.stats_json())
            elif path == "/api/jobs":
                self._json(200, {"jobs": [state.job_overview(j) for j in state.job_names()]})
            elif path.startswith("/api/jobs/") and path.endswith("/summary"):
                job = unquote(path[len("/api/jobs/"):-len("/summary")])
                summary = job_summary(state, job)
                if summary is None:
                    self._json(404, {"error": f"no job named {job!r}", "jobs": state.job_names()})
                else:
                    self._json(200, summary)
            else:
                self._json(404, {"error": f"no such path {path}", "paths": [
                    "/metrics", "/healthz", "/api/stats", "/api/jobs", "/api/jobs/<job>/summary"]})
        except BrokenPipeError:
            pass
        except Exception as exc:  # a bug must answer 500, not kill the server thread
            log.exception("HTTP %s failed", path)
            self._json(500, {"error": repr(exc)})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: AggregatorState
    registry: CollectorRegistry


class HttpServer:
    def __init__(self, state: AggregatorState, host: str, port: int) -> None:
        self._srv = _Server((host, port), _Handler)
        self._srv.state = state
        self._srv.registry = CollectorRegistry(auto_describe=False)
        self._srv.registry.register(_StateCollector(state))
        self.port = int(self._srv.server_address[1])
        self._thread = threading.Thread(target=self._srv.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
