"""The aggregator's HTTP side: Prometheus /metrics and a small JSON API.

Served by perfd.exporters.httpd in threads of its own: scrapes and API calls never block the gRPC
event loop that ingests, and the loop never blocks a scrape; a slow or idle client holds no thread,
and /metrics and /healthz have a lane API clients cannot fill.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from perfd.aggregator import forward as fwd
from perfd.aggregator.captures import CaptureCoordinator, CaptureRateLimited
from perfd.aggregator.job_rows import job_row_groups
from perfd.aggregator.snapshot import Analysed, JobSnapshot, latest_of_running, overviews_of
from perfd.aggregator.state_readers import HttpState
from perfd.analytics.incidents.attribution import foreign_processes, gpu_hints, place_ranks
from perfd.analytics.incidents.host_evidence import CpuUse, job_cpu_use
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.steps.liveness import RUNNING
from perfd.core import finite_json
from perfd.core import limits as L
from perfd.core.refusals import Refusals
from perfd.exporters import httpd
from perfd.exporters.prometheus import build_info_families, histogram_families, job_families, series_families
from perfd.exporters.remote_write import TargetStats
from perfd.report import analysis_json, collective_text, incident_text
from perfd.report.row_json import iteration_rows, row_codes
from perfd.transport.security import TokenFile

log = logging.getLogger(__name__)


class _StateCollector:
    """prometheus_client custom collector reading the aggregator state at scrape time."""

    def __init__(self, state: HttpState, per_rank_series: bool = True,
                 refusals: Refusals | None = None, export_node_series: bool = False) -> None:
        self.state = state
        self.per_rank_series = per_rank_series  # False: no per-rank series (very large jobs)
        self.refusals = refusals
        # The agents serve their node's GPU and host series themselves; re-exported here as well,
        # a sum over both scrape jobs would count every GPU twice. Off unless asked for.
        self.export_node_series = export_node_series
        # The remote writer's counters per target, when it runs (it writes what this collects).
        self.remote_write: Callable[[], Mapping[str, TargetStats]] | None = None

    def collect(self) -> Iterator[Metric]:
        now = self.state.clock.time()
        # Each job's snapshot, its analysis the refresher's last (Aggregator._refresh_loop): a scrape
        # never waits on one. A stalled or ended job's derived gauges leave.
        snaps = [snap for j in self.state.job_names() if (snap := self.state.snapshot(j)) is not None]
        latest = latest_of_running(snaps, now)
        yield from job_families(latest, per_rank=self.per_rank_series)
        yield from histogram_families("perfd_job_step_duration_seconds",
                                      self.state.step_histograms(sorted(latest)))
        ranks, *groups = job_row_groups(self.state, snaps, latest, now, self.per_rank_series, node_info=True)
        yield from series_families(ranks)
        rows = []
        for agent, s in self.state.node_series(self.export_node_series):
            labels = dict(s.labels)
            series_job = self.state.series_job(agent, s)  # a GPU series: its GPU's job (placement)
            if series_job:
                labels["job_name"] = series_job
            rows.append((labels, s.name, s.value))
        yield from series_families(rows)
        for group in groups:  # collectives, incidents, liveness, serving
            yield from series_families(group)
        t = self.state.transport_stats() if self.state.transport_stats is not None else {}
        own = {
            **self.state.own_counters(),
            "perfd_aggregator_batches_total": t.get("batches"),
            "perfd_aggregator_duplicate_batches_total": t.get("duplicates"),
            "perfd_aggregator_decode_errors_total": t.get("decode_errors"),
            "perfd_aggregator_agents_connected": t.get("agents_connected"),
            "perfd_aggregator_event_loop_lag_seconds": (t["loop_lag_ms"] / 1000 if "loop_lag_ms" in t
                                                       else None),
            "perfd_aggregator_agent_dropped_samples_total": t.get("agent_dropped_samples"),
            "perfd_aggregator_gc_seconds_total": t["gc_ms"] / 1000 if "gc_ms" in t else None,
            "perfd_aggregator_jobs_held": t.get("jobs_held"),
            "perfd_aggregator_series_held": t.get("series_held"),
            "perfd_aggregator_jobs_pruned_total": t.get("jobs_pruned"),
            "perfd_aggregator_state_held_bytes": t.get("state_store_held_bytes"),
            "perfd_aggregator_state_max_bytes": t.get("state_store_max_bytes"),
            "perfd_aggregator_agents_forgotten_total": t.get("agents_forgotten"),
        }
        yield from series_families([({}, k, float(v)) for k, v in own.items() if v is not None])
        if self.refusals is not None:
            counts = self.refusals.snapshot()
            yield from series_families([({"reason": r}, "perfd_aggregator_refused_total",
                                         float(counts.get(r, 0))) for r in L.REFUSED_REASONS])
        if self.remote_write is not None:
            rw = self.remote_write()
            counters = (("perfd_aggregator_remote_write_samples_total", "samples_sent"),
                        ("perfd_aggregator_remote_write_failed_requests_total", "requests_failed"),
                        ("perfd_aggregator_remote_write_dropped_samples_total", "samples_dropped"))
            yield from series_families([({"target": t}, name, float(getattr(st, attr)))
                                        for t, st in rw.items() for name, attr in counters])
        yield from build_info_families()


# Labels that name a GPU; a GPU series with any other label (throttle reason, ECC type) is one of
# several per GPU and stays out of the one-row-per-GPU view.
_GPU_ROW_LABELS = frozenset({"node", "gpu", "uuid", "model", "pci_bus_id", "replay", "job_name", "source"})


def job_gpus(state: HttpState, job: str) -> dict[str, Any] | None:
    """The latest GPU series of the job's GPUs (whichever agent reports them: perfd.core.placement), one
    row per (node, gpu) with the catalog names as keys and the GPU's compute processes as its agent
    last reported them (pid, user, name, command line, GPU memory, rank); and the host series (CPU,
    memory) of the nodes the job's agents run on. What `perfd top` shows, independent of what
    /metrics exports."""
    if job not in state.job_names():
        return None
    snap = state.snapshot(job)
    if snap is None:
        return None
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    hosts: dict[str, dict[str, float]] = {}
    agents = snap.agents
    for agent, s in state.host_series(agents):
        labels = dict(s.labels)
        if set(labels) <= {"node"}:  # per-node series only (not per interface or disk)
            hosts.setdefault(labels.get("node", agent), {})[s.name] = s.value
    for agent, s in state.job_gpu_series(job):
        labels = dict(s.labels)
        if set(labels) - _GPU_ROW_LABELS:
            continue
        key = (labels.get("node", agent), labels.get("gpu", ""))
        row = rows.setdefault(key, {"node": key[0], "gpu": key[1], "model": labels.get("model"),
                                    "uuid": labels.get("uuid"), "replay": "replay" in labels,
                                    "values": {}, "sources": {}, "processes": None})
        row["values"][s.name] = s.value
        if "source" in labels:
            row["sources"][s.name] = labels["source"]
    for key, procs in state.gpu_procs(job).items():
        if key in rows:
            rows[key]["processes"] = [dict(p) for p in procs]
    ordered = sorted(rows.items(),
                     key=lambda kv: (kv[0][0], int(kv[0][1]) if kv[0][1].isdigit() else 0))
    return {"job_name": job, "gpus": [row for _, row in ordered],
            "hosts": [{"node": n, "values": v} for n, v in sorted(hosts.items())],
            "rank_hosts": rank_hosts(snap), "gpu_sources": gpu_sources(state, snap)}


def gpu_sources(state: HttpState, snap: JobSnapshot) -> list[dict[str, Any]]:
    """Who could report the job's GPUs and what its NVML collector said at start (from each agent's
    Hello): the job's own agents and every agent on its nodes (a node agent). ``nvml`` is "ok",
    "unavailable: <why>" (no driver, no GPU, no permission), or None when the agent runs no NVML
    collector (--nvml off). A GPU panel that stays empty says why from this, not only the agent's log."""
    return state.gpu_sources(snap.agents, snap.nodes)


# What the host panel shows of each rank process (perfd.core.events.RankHost; absent keys stay absent).
RANK_HOST_FIELDS = ("pid", "node", "state", "state_since", "cpu_cores", "wait_ratio", "cpu_demand_cores",
                    "allowed_cpus", "allowed_busy_ratio", "others_ratio", "own_ratio", "others", "children",
                    "children_cpu_cores", "cgroup", "throttled_ratio", "cpu_quota_cores", "pressure",
                    "pressure_source", "oom_kills", "threads", "observed_at", "arrived_at")


def rank_hosts(snap: JobSnapshot) -> list[dict[str, Any]]:
    """Each rank process of the job as its node's agent last reported it (collectors/ranks): state,
    CPU use, run-queue wait, allowed CPUs and their busy share, the processes that ran on them."""
    hosts: dict[int, Mapping[str, object]] = dict(snap.hosts())
    return [{"rank": r, **{k: o[k] for k in RANK_HOST_FIELDS if k in o}} for r, o in sorted(hosts.items())]


def rank_view(state: HttpState, snap: JobSnapshot, world_size: int | None,
              candidates: list[int]) -> dict[str, Any]:
    """Where each rank runs (from the process lists the agents report) and, for the candidate
    slow ranks, what their GPUs show. The placement is the snapshot's, unless the analysis names a
    world size: the processes that declare another are then left out (place_ranks)."""
    procs, values, throttles = snap.gpus()
    placements = (dict(snap.placed_ranks) if world_size is None
                  else place_ranks(procs, world_size, job=snap.job))
    pods = state.pods_by_gpu()  # Kubernetes: the pod each GPU is allocated to (collectors/k8s)
    ranks = []
    job_pids = frozenset(q.pid for q in placements.values())
    for r, pl in sorted(placements.items()):
        key = (pl.node, pl.gpu)
        ranks.append({"rank": r, "node": pl.node, "gpu": pl.gpu, "pid": pl.pid,
                      "local_rank": pl.local_rank, "gpu_values": values.get(key, {}),
                      "throttle_reasons": throttles.get(key, []), "pod": pods.get(key),
                      "other_processes": [dict(p) for p in foreign_processes(
                          pl, procs.get(key, []), job_pids)]})
    hints = gpu_hints(candidates, placements, values, throttles, procs) if candidates else []
    return {"ranks": ranks, "gpu_hints": [incident_text.hint_json(h) for h in hints],
            "source": "collectors/nvml process lists (RANK from each process's environment, else the "
                      "rank's step hook: its pid or its CUDA device, perfd.agent.hook_gpus) joined with "
                      "the latest NVML values of its GPU"}


def _candidates(analysis: RunAnalysis) -> list[int]:
    """Slow-rank candidates: persistent stragglers, else the latest iteration's flagged ranks."""
    ranks = list(analysis.summary.straggler_persistent_ranks)
    if not ranks and analysis.iterations:
        ranks = list(analysis.iterations[-1].straggler_candidate_ranks)
    return [int(r) for r in ranks]


# What an incident's summary entry leaves to /api/jobs/<job>/incidents: the typed items its verdict
# was decided over (the steps' ``observed``, the GPU's ``gpu_observed``, each snapshot's ``items``) are
# all in its ``verdict`` (lead, effects, also): the summary says each once.
SUMMARY_INCIDENT_OMITS = ("observed", "gpu_observed")


def summary_incident(d: Mapping[str, Any]) -> dict[str, Any]:
    """An incident as the job summary serves it (docs/api.md): each fact once."""
    out = dict(d)
    ev = out.get("evidence")
    if isinstance(ev, Mapping):
        ev = {k: v for k, v in ev.items() if k not in SUMMARY_INCIDENT_OMITS}
        gpu = ev.get("gpu")
        if isinstance(gpu, Mapping):
            ev["gpu"] = {r: {k: v for k, v in s.items() if k != "items"} if isinstance(s, Mapping) else s
                         for r, s in gpu.items()}
        out["evidence"] = ev
    return out


def job_cpu(snap: JobSnapshot, now: float) -> CpuUse | None:
    """How the job's ranks use their CPUs, for its data-loading action: as last observed while it
    stepped (a step record came after the observation: not its teardown, not its exit), else as its
    agents see it now (no step since the first observation yet). A job no longer running says when
    (else after exit the advice read "its 0 child process(es)", or "CPUs are full")."""
    use = job_cpu_use(snap.hosts_last_running())
    now_seen = snap.hosts(now)
    if use is None:
        return job_cpu_use(now_seen)
    state, _ = snap.state_at(now)
    gone = any(o.get("state") in ("gone", "zombie") for o in now_seen.values())
    return dataclasses.replace(use, while_running=True) if state != RUNNING or gone else use


def job_summary(state: HttpState, job: str) -> dict[str, Any] | None:
    snap = state.snapshot(job, Analysed.SERVED)
    if snap is None:
        return None
    now = snap.clock.time()
    overview = snap.overview_at(now)
    view = state.serving_view(job)
    serving = view.to_json() if view is not None else None
    analysis = snap.analysis
    if analysis is None or not analysis.iterations:
        # A serving job (or a training job before its first iteration): its report, if any, is
        # the serving report.
        return {"overview": overview, "latest": None, "summary": None,
                "report": serving["report"] if serving else None, "serving": serving,
                **rank_view(state, snap, None, []), "collectives": collectives_json(state, job),
                "incidents": snap.incident_docs()}
    cpu = job_cpu(snap, now)
    full = analysis_json(analysis, snap.incidents, arming=state.arming_of(job), cpu=cpu)
    world = analysis.job.layout.world_size
    return {
        "overview": overview,
        "job": full["job"],
        "latest": full["iterations"][-1],
        "summary": full["summary"],
        # the summary's, plus the stall of a hung job so far
        "goodput": gp.to_json() if (gp := snap.goodput(now)) is not None else None,
        "report": full["report"],
        **rank_view(state, snap, world, _candidates(analysis)),
        "collectives": collectives_json(state, job),
        "serving": serving,
        "incidents": [summary_incident(i) for i in full["incidents"]],
    }


def collectives_json(state: HttpState, job: str) -> dict[str, Any] | None:
    """The job's collective analysis (perfd.analytics.collectives.collective_analysis); None without NCCL
    data."""
    try:
        a = state.collective_analysis(job, cached=True)
    except Exception as exc:  # counted in the store; the rest of the summary still answers
        log.exception("collective analysis of job %s failed", job)
        return {"error": repr(exc)}
    return collective_text.collectives_json(a) if a is not None else None  # its findings worded here


def job_iterations(state: HttpState, job: str, sources: bool = True) -> dict[str, Any] | None:
    """Every analysed iteration the aggregator holds for ``job`` (the per-iteration rows of
    `perfd analyze megatron --json`: provenance as codes, perfd.report.row_json), oldest
    first, with their legend (``iteration_codes``); None for an unknown job. ``sources=False``: the
    legend without each metric's source (the summary's report has them)."""
    snap = state.snapshot(job, Analysed.SERVED)
    if snap is None:
        return None
    if (analysis := snap.analysis) is None:  # none yet, or it failed: analysis_error says why
        return {"job_name": job, "iterations": [], "iteration_codes": {},
                "analysis_error": snap.analysis_error()}
    codes = row_codes(analysis)
    its = list(iteration_rows(analysis, codes=codes))
    return {"job_name": job, "iterations": its, "iteration_codes": codes.legend(sources),
            "analysis_error": snap.analysis_error()}


# Paths anyone who reaches the port may read, token or not: Prometheus scrapes and liveness probes.
OPEN_PATHS = ("/metrics", "/healthz")


def _path(target: str) -> str | None:
    """The path of a request target, unquoted later; None when it does not parse (answered 400)."""
    try:
        return urlparse(target).path.rstrip("/") or "/"
    except ValueError:
        return None


class _Handler(httpd.BufferedHandler):
    app: _App

    def _authorized(self, path: str) -> bool:
        """With a token configured every path but OPEN_PATHS needs ``Authorization: Bearer``;
        answers 401 (counted) when it is missing or wrong."""
        token = self.app.token
        if token is None or path in OPEN_PATHS or token.check(self.headers.get("Authorization")):
            return True
        self.app.refusals.refuse(L.REFUSED_UNAUTHENTICATED, f"HTTP {self.command} {path[:80]} from "
                                 f"{self.client_address[0]} without a valid bearer token")
        body = json.dumps({"error": "a bearer token is required (Authorization: Bearer <token>)"}).encode()
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Bearer realm="perfd"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True
        return False

    def _send(self, code: int, body: bytes, ctype: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: object) -> None:
        self._send(code, finite_json.dumps(obj, indent=2).encode(),
                   "application/json")

    def _target(self) -> str | None:
        path = _path(self.path)
        if path is None:
            self._json(400, {"error": f"unparsable request target {self.path[:80]!r}"})
        return path

    def _events(self) -> None:
        self._json(*self.app.state.events_page(parse_qs(urlparse(self.path).query)))

    def _forwarded(self, path: str) -> bool:
        """A standby root's request, answered by the leading root (perfd.aggregator.forward)."""
        leader = self.app.leader() if self.app.leader is not None else None
        if leader is None or not fwd.forwarded(path):
            return False
        body = None
        if self.command == "POST":
            n = _body_length(self)
            if n is None:
                return True  # refused, answered
            body = self.rfile.read(n)
        code, out, ctype = fwd.forward(leader, self.command, self.path, dict(self.headers.items()), body)
        self._send(code, out, ctype, ((fwd.SERVED_BY, f"leader {leader}"),))
        return True

    def do_POST(self) -> None:
        path = self._target()
        if path is None or not self._authorized(path) or self._forwarded(path):
            return
        try:
            _post(self, path)
        except Exception as exc:
            log.exception("HTTP POST %s failed", self.path)
            self._json(500, {"error": repr(exc)})

    def do_GET(self) -> None:
        path = self._target()
        if path is None or not self._authorized(path) or self._forwarded(path):
            return
        state = self.app.state
        try:
            if path == "/metrics":
                # The text format, uncompressed, whatever the scraper accepts: as before (the
                # agent, like prometheus_client's own server, negotiates).
                body, headers = httpd.metrics_response(self.app.registry, None, None)
                self._send(200, body, headers[0][1], tuple(headers[1:]))
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            elif path == "/api/stats":
                refused = self.app.refusals
                self._json(200, {**state.stats_json(),
                                 "refused_by_agent": refused.by_agent() if refused is not None else {}})
            elif path == "/api/captures":
                caps = self.app.captures
                self._json(200, {"captures": caps.list() if caps else []})
            elif path == "/api/events":
                self._events()
            elif path == "/api/jobs":
                self._json(200, {"jobs": overviews_of(state.snapshot(j) for j in state.job_names())})
            elif path.startswith("/api/jobs/") and path.endswith("/iterations"):
                job = unquote(path[len("/api/jobs/"):-len("/iterations")])
                its = job_iterations(state, job, parse_qs(urlparse(self.path).query).get(
                    "sources", ["1"])[0] != "0")
                if its is None:
                    self._json(404, {"error": f"no job named {job!r}", "jobs": state.job_names()})
                else:
                    self._json(200, its)
            elif path.startswith("/api/jobs/") and path.endswith("/incidents"):
                job = unquote(path[len("/api/jobs/"):-len("/incidents")])
                snap = state.snapshot(job, Analysed.SERVED)  # a job's first analysis opens its incidents
                if snap is None:
                    self._json(404, {"error": f"no job named {job!r}", "jobs": state.job_names()})
                else:
                    self._json(200, {"job_name": job, "incidents": snap.incident_docs()})
            elif path.startswith("/api/jobs/") and path.endswith("/gpus"):
                job = unquote(path[len("/api/jobs/"):-len("/gpus")])
                gpus = job_gpus(state, job)
                if gpus is None:
                    self._json(404, {"error": f"no job named {job!r}", "jobs": state.job_names()})
                else:
                    self._json(200, gpus)
            elif path.startswith("/api/jobs/") and path.endswith("/summary"):
                job = unquote(path[len("/api/jobs/"):-len("/summary")])
                summary = job_summary(state, job)
                if summary is None:
                    self._json(404, {"error": f"no job named {job!r}", "jobs": state.job_names()})
                else:
                    self._json(200, summary)
            else:
                self._json(404, {"error": f"no such path {path}", "paths": [
                    "/metrics", "/healthz", "/api/stats", "/api/jobs", "/api/jobs/<job>/summary",
                    "/api/jobs/<job>/iterations", "/api/jobs/<job>/incidents", "/api/jobs/<job>/gpus",
                    "/api/captures", "/api/events", "POST /api/captures", "POST /api/alertmanager"]})
        except Exception as exc:  # a bug must answer 500, not kill the server thread
            log.exception("HTTP %s failed", path)
            self._json(500, {"error": repr(exc)})


def _body_length(handler: _Handler) -> int | None:
    """The body's length from Content-Length, refused (answered, counted, None) before a byte of
    it is read when it is absent with chunked encoding, not a number, negative or over the cap."""
    refusals = handler.app.refusals
    if handler.headers.get("Transfer-Encoding"):
        code, err = 411, "send the body with a Content-Length (no chunked encoding)"
    else:
        raw = handler.headers.get("Content-Length") or "0"
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if 0 <= length <= L.MAX_HTTP_BODY_BYTES:
            return length
        code, err = (413, f"body larger than {L.MAX_HTTP_BODY_BYTES} bytes") if length > 0 else (
            400, f"invalid Content-Length {raw[:32]!r}")
    refusals.refuse(L.REFUSED_HTTP_BODY,
                    f"HTTP POST {handler.path[:80]} from {handler.client_address[0]}: {err}")
    handler.close_connection = True  # the unread body must not be parsed as the next request
    handler._json(code, {"error": err})
    return None


POST_PATHS = ("/api/captures", "/api/alertmanager", "/api/jobs/<job>/new-normal")
NEW_NORMAL = "/new-normal"


def _new_normal(handler: _Handler, job: str, body: dict[str, Any]) -> None:
    """POST /api/jobs/<job>/new-normal [{"iteration": N}]: the job's lasting shift
    (perfd.analytics.steps.changepoint) is its new normal from iteration N (default: after the last one
    held); its cost stops being counted there."""
    it = body.get("iteration")
    if it is not None and (not isinstance(it, int) or isinstance(it, bool) or it < 0):
        handler._json(400, {"error": "'iteration' must be a non-negative integer"})
        return
    state = handler.app.state
    at = state.set_new_normal(job, it)
    if at is None:
        handler._json(404, {"error": f"no job named {job!r}", "jobs": state.job_names()})
        return
    a = state.analysis(job, force=True)  # its incidents close now, not at the next tick
    shifts = [cp.to_json() for i in (a.incidents if a is not None else [])
              if (cp := i.evidence.change_point) is not None]
    handler._json(200, {"job_name": job, "new_normal_at": at, "change_points": shifts})


def _post(handler: _Handler, path: str) -> None:
    """POST /api/captures {job, ranks?, steps?, tool?, stack?}, POST /api/alertmanager (webhook v4) and
    POST /api/jobs/<job>/new-normal."""
    shift_job = (unquote(path[len("/api/jobs/"):-len(NEW_NORMAL)])
                 if path.startswith("/api/jobs/") and path.endswith(NEW_NORMAL) else None)
    if path not in POST_PATHS and not shift_job:  # before the body is parsed: nothing else takes one
        handler._json(404, {"error": f"no POST handler for {path[:80]}", "paths": list(POST_PATHS)})
        return
    caps = handler.app.captures
    length = _body_length(handler)
    if length is None:
        return
    try:
        body = json.loads(handler.rfile.read(length) or b"{}")
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
    except RecursionError:  # the C parser's answer to thousands of nested [ or {
        handler._json(400, {"error": "invalid JSON: nested too deeply"})
        return
    except ValueError as exc:
        handler._json(400, {"error": f"invalid JSON: {exc}"})
        return
    if shift_job:
        _new_normal(handler, shift_job, body)
        return
    if caps is None:
        handler._json(503, {"error": "captures are not enabled on this aggregator"})
        return
    try:
        if path == "/api/captures":
            if not body.get("job"):
                raise ValueError("'job' is required")
            ranks = body.get("ranks")  # checked and counted by the request (perfd.aggregator.capture_ranks)
            steps = body.get("steps", 3)
            if not isinstance(steps, int) or isinstance(steps, bool):
                raise ValueError("'steps' must be an integer")
            stack = body.get("stack", False)
            if not isinstance(stack, bool):
                raise ValueError("'stack' must be true or false")
            try:
                rec = caps.request(str(body["job"]), ranks, str(body.get("tool", "auto")), steps, "manual",
                                   stack=stack)
            except CaptureRateLimited as exc:
                handler._json(429, {"error": str(exc)})
                return
            handler._json(409 if rec.status.refused else 202, rec.to_json())
        elif path == "/api/alertmanager":
            from perfd.aggregator.captures import CAPTURE_LABEL, alertmanager_plan

            reqs, unmarked = alertmanager_plan(body)
            if len(reqs) > L.MAX_ALERTS_PER_WEBHOOK:
                handler.app.refusals.refuse(
                    L.REFUSED_WEBHOOK_ALERTS, f"Alertmanager POST with {len(reqs)} capture alerts; the first "
                    f"{L.MAX_ALERTS_PER_WEBHOOK} considered", len(reqs) - L.MAX_ALERTS_PER_WEBHOOK)
            made, refused = [], []
            for r in reqs[:L.MAX_ALERTS_PER_WEBHOOK]:
                try:
                    rec = caps.request(r["job"], r["ranks"], r["tool"], r["steps"], r["origin"])
                    made.append(rec.to_json())
                except (CaptureRateLimited, ValueError) as exc:
                    refused.append({"job": r["job"], "origin": r["origin"], "error": str(exc)})
            if unmarked:  # said in the reply and the log: a route sending every alert here shows up
                log.info("Alertmanager POST: %d firing alert(s) without %s=\"true\" asked for no capture",
                         unmarked, CAPTURE_LABEL)
            handler._json(200, {"captures": made, "refused": refused,
                                "ignored_alerts": max(0, len(reqs) - L.MAX_ALERTS_PER_WEBHOOK),
                                "not_capture_alerts": unmarked})
    except (ValueError, TypeError) as exc:
        handler._json(400, {"error": str(exc)})
    except RecursionError:  # a value nested too deeply to print (a job name of 900 nested lists)
        handler._json(400, {"error": "a value nested too deeply"})


class _App:
    """What the handlers serve: set once by HttpServer, read by its worker threads."""

    def __init__(self, state: HttpState, captures: CaptureCoordinator | None, token: TokenFile | None,
                 refusals: Refusals) -> None:
        self.state = state
        self.captures = captures
        self.token = token
        self.refusals = refusals
        self.registry = CollectorRegistry(auto_describe=False)
        self.leader: Callable[[], str | None] | None = None  # a standby root's leader (its HTTP)


class HttpServer:
    def __init__(self, state: HttpState, host: str, port: int,
                 captures: CaptureCoordinator | None = None, per_rank_series: bool = True,
                 token: TokenFile | None = None, refusals: Refusals | None = None,
                 export_node_series: bool = False) -> None:
        self.app = _App(state, captures, token, refusals if refusals is not None else Refusals())
        self.collector = _StateCollector(state, per_rank_series, self.app.refusals, export_node_series)
        self.app.registry.register(self.collector)
        self._srv = httpd.HttpServer(host, port, _Handler, self.app, refusals=self.app.refusals)
        self.port = self._srv.port

    def start(self) -> None:
        self._srv.start()

    def stop(self) -> None:
        self._srv.stop()

    def threads(self) -> tuple[threading.Thread, ...]:
        return self._srv.threads()
