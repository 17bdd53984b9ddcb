"""`perfd agent`: collectors → batches → the aggregator, plus the node's own /metrics.

The agent never touches the training job: it reads logs, NVML and /proc. When the aggregator is
gone, batches wait in the spool (bounded; the oldest are dropped and counted beyond its cap).
"""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import itertools
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric

from perfd.agent.agent_http import AgentMetrics, LatestSeries, MetricsHandler
from perfd.agent.checkpoints import Checkpoints
from perfd.agent.config import DEFAULT_JOB, AgentConfig
from perfd.agent.hook_gpus import HookGpus, hook_ranks, label_of
from perfd.agent.reduce import SampleReducer
from perfd.agent.scheduler import COLLECT_BUCKETS_S, RUNNING_ERROR_REASONS, Scheduler
from perfd.agent.stacks import StackDumper
from perfd.agent.stop_budget import CAPTURE_STOP_S, SHUTDOWN_BUDGET_S, StopBudget
from perfd.collectors.collector import Collected, Collector, Registry
from perfd.collectors.config_values import as_float
from perfd.core import catalog
from perfd.core import limits as L
from perfd.core.catalog import GPU_INFO
from perfd.core.events import CAPTURE_FAILED, CAPTURE_FINISHED, GPU_PROCESSES, payload_of
from perfd.core.jobinfo_json import job_info_to_json
from perfd.core.model import (
    CAPTURE_OUTCOMES,
    CAPTURE_TOOLS,
    CollectiveRecord,
    JobInfo,
    Sample,
    StepRecord,
    merge_job_info,
)
from perfd.core.placement import declared_job
from perfd.core.refusals import Refusals
from perfd.exporters import httpd
from perfd.transport.codec import COMMAND_STACKS, Command
from perfd.transport.spool import Spool

if TYPE_CHECKING:
    from perfd.agent.capture_executor import AgentCaptures

log = logging.getLogger(__name__)

# Collectors told the job's user (AgentConfig.job_uid): they take only its processes for the job's.
JOB_USER_COLLECTORS = frozenset({"hook", "nvml"})


def default_registry() -> Registry:
    """Every collector shipped with perfd, by name."""
    import perfd.collectors.dcgm
    import perfd.collectors.host
    import perfd.collectors.k8s
    import perfd.collectors.megatron
    import perfd.collectors.nvml
    import perfd.collectors.ranks
    import perfd.collectors.sglang
    import perfd.collectors.torchtitan

    reg = Registry()
    for mod in (perfd.collectors.megatron, perfd.collectors.nvml, perfd.collectors.host, perfd.collectors.k8s,
                perfd.collectors.sglang, perfd.collectors.dcgm, perfd.collectors.torchtitan,
                perfd.collectors.ranks):
        mod.register(reg)
    reg.register("nccl", _nccl_collector)
    reg.register("hook", _hook_collector)
    return reg


def _nccl_collector(cfg: Mapping[str, object]) -> Collector:
    from perfd.collectors.nccl import NcclCollector  # imported when configured: the agent stays lean

    # interval_s is the scheduler's (Agent.build reads it); the collector's own keys are stricter.
    return NcclCollector({k: v for k, v in cfg.items() if k != "interval_s"})


def _hook_collector(cfg: Mapping[str, object]) -> Collector:
    from perfd.collectors.hook import HookCollector

    return HookCollector({k: v for k, v in cfg.items() if k != "interval_s"})


MAX_COLLECTIVES_PER_BATCH = 20_000
# On the engine a job's info goes again this often, changed or not: a partition's lease moves (a
# rebalance, a shard lost or restarted) and the shard taking it over reads the info only from a node
# message that carries it; sent on change alone, it may never come, and that shard cannot group the
# job's ranks by pipeline stage (perfd.engine.shard_summaries.NO_INFO: no per-stage figures meanwhile).
# A few KB a node a minute.
JOBINFO_RESEND_S = 60.0


class Agent:
    def __init__(self, cfg: AgentConfig, registry: Registry | None = None) -> None:
        self.cfg = cfg
        self.registry = registry or default_registry()
        self.scheduler = Scheduler()
        self.view = LatestSeries()
        # AgentClient or EngineClient (imported lazily: grpc, nats) when sending; tests put a stand-in
        # there and read what it was given, so this stays Any.
        self.client: Any = None
        self._client_task: asyncio.Task[None] | None = None
        self.config_errors: dict[str, str] = {}
        self.metrics_port: int | None = None
        self.http: httpd.HttpServer | None = None
        self.http_refusals = Refusals()  # what the agent's own HTTP server turned away
        self.samples_total: dict[str, int] = {}
        self.submit_errors = 0
        self._started = time.time()
        self._jobinfo_sent: dict[str, str] = {}
        self._jobinfo_last: dict[str, str] = {}  # job -> its latest job info, re-sent after a reconnect
        self._jobinfo_merged: dict[str, JobInfo] = {}
        self._reconnects_seen = 0
        self.monotonic: Callable[[], float] = time.monotonic  # a test's clock in its place
        self._jobinfo_resent_at = self.monotonic()
        self._stepped: set[str] = set()  # jobs that stepped here since the job infos last went again
        self._spool: Spool | None = None  # opened before the collectors: their checkpoints resolve against it
        self.ready_file: str | None = None  # run_agent's: where the /metrics port goes once listening
        self._checkpoints = Checkpoints(cfg.state_dir) if cfg.state_dir else None
        self.reducer = SampleReducer(cfg.aggregator_sample_interval_s)
        self.captures: AgentCaptures | None = None  # when the aggregator can ask for captures
        self.stacks: StackDumper | None = None  # answers the aggregator's stacks requests (a stall)
        # GPU index -> the job its processes declare (perfd.core.placement), from the NVML collector's
        # latest process list of each GPU; None: none declared. Read by the /metrics thread.
        self.gpu_jobs: dict[str, str | None] = {}
        self.hook_gpus = HookGpus(cfg.job)  # ranks without RANK placed on their GPUs by their hooks
        self.captures_done: dict[tuple[str, str], int] = {}  # (tool, status) -> captures ended so

    # ---- set-up -------------------------------------------------------------------------------
    def build(self) -> None:
        if self.cfg.aggregator and self._spool is None:
            self._spool = Spool(self.cfg.spool_dir, max_bytes=self.cfg.spool_max_bytes)
            if self._checkpoints is not None:
                self._checkpoints.settled = self._spool.settled
        job_uid = self.cfg.job_uid
        for name, ccfg in self.cfg.collectors.items():
            conf = {"job": self.cfg.job or DEFAULT_JOB, **ccfg}
            if name in JOB_USER_COLLECTORS and job_uid is not None:
                conf.setdefault("job_user", job_uid)  # whose processes are the job's ranks
            if name == "hook" and self.cfg.job not in ("", DEFAULT_JOB):
                conf.setdefault("refuse_other_jobs", True)  # a process declaring another job is not ours
            ck = self._checkpoints.load(name) if self._checkpoints is not None else None
            if ck is not None:
                conf["resume"] = ck
            try:
                col = self.registry.create(name, conf)
            except Exception as exc:  # bad collector config: say which, run the others
                self.config_errors[name] = str(exc)
                log.error("collector %s not started: %s", name, exc)
                continue
            interval = conf.get("interval_s")
            self.scheduler.add(col, as_float(interval) if interval is not None else None)

    def start_metrics_server(self) -> None:
        if self.cfg.metrics_port is None:
            return
        reg = CollectorRegistry(auto_describe=False)
        reg.register(AgentMetrics(self))
        # One thread for every connection and its deadlines, two for /metrics, one that answers
        # 404: 2,000 idle connections cost buffers, not 2,000 threads (perfd.exporters.httpd).
        try:
            self.http = httpd.HttpServer(self.cfg.metrics_host, self.cfg.metrics_port, MetricsHandler, reg,
                                         refusals=self.http_refusals, api_threads=1, name="agent-http")
        except OSError as exc:
            raise httpd.bind_error(exc, self.cfg.metrics_host, self.cfg.metrics_port, "/metrics",
                                   "--metrics-port N (metrics_port: in the config file)",
                                   "--metrics-host or --listen-all") from exc
        self.http.start()
        self.metrics_port = self.http.port
        # Printed, not logged: at the default verbosity (warnings) an info line never shows, and the
        # address (the bound port with --metrics-port 0) is what a person starting it needs.
        print(f"perfd agent: listening on http://{self.cfg.metrics_host}:{self.metrics_port}/metrics",
              flush=True)

    # ---- /metrics -----------------------------------------------------------------------------
    def node_rows(self) -> list[tuple[Mapping[str, str], str, float]]:
        """The node series, each GPU series in the job that runs on its GPU (perfd.core.placement), the
        others in the agent's own job; without a job, no ``job_name`` label at all (a node agent
        must not invent a job "default" for every GPU it watches)."""
        jobs = dict(self.gpu_jobs)
        own = self.cfg.job or None
        out: list[tuple[Mapping[str, str], str, float]] = []
        info: dict[str, Mapping[str, str]] = {}  # gpu -> its identity labels, for GPU_INFO
        for labels, name, value in self.view.rows():
            gpu = labels.get("gpu") if name.startswith("perfd_gpu_") else None
            job = (jobs.get(gpu) or own) if gpu is not None else own
            lbl = {**labels, "job_name": job} if job else labels
            out.append((lbl, name, value))
            # One series per GPU: identity only (no reason/type), NVML's (not another source's).
            if gpu is not None and not set(labels) & {"reason", "type", "source"}:
                info.setdefault(gpu, lbl)
        out.extend((lbl, GPU_INFO, 1.0) for _gpu, lbl in sorted(info.items()))
        return out

    def _note_gpu_jobs(self, events: list[dict[str, object]]) -> None:
        for ev in events:
            if ev.get("kind") == GPU_PROCESSES.name:
                procs = payload_of(ev, GPU_PROCESSES)
                gpu = label_of(ev, "gpu")
                if procs is not None and isinstance(gpu, str):
                    self.gpu_jobs[gpu] = declared_job(procs)

    def _note_ranks(self, events: list[dict[str, object]], steps: list[StepRecord]) -> None:
        """Hand the rank processes the other collectors know to the ranks collector: each GPU
        process that declares a RANK (collectors/nvml), each step hook's sender (its pid and rank,
        with the uid the kernel gave for the sender: the ranks collector follows the pid only as
        that user's process)."""
        st = self.scheduler.states.get("ranks")
        note = getattr(st.collector, "note", None) if st is not None else None
        if note is None:
            return
        hook = self.scheduler.states.get("hook")
        verified: Mapping[int, int] = getattr(hook.collector, "verified", {}) if hook is not None else {}
        seen: set[tuple[str | None, int, int, str, int | None]] = set()
        for ev in events:
            if ev.get("kind") != GPU_PROCESSES.name:
                continue
            for p in payload_of(ev, GPU_PROCESSES) or []:
                rank, pid, job = p.get("rank"), p.get("pid"), p.get("job")
                # A rank its hook placed (perfd.agent.hook_gpus) is followed as the hook's, below, as
                # the user its credentials named; never as a GPU process of its own.
                if isinstance(rank, int) and isinstance(pid, int) and not p.get("rank_from"):
                    seen.add((job if isinstance(job, str) and job else None, rank, pid, "gpu", None))
        for rec in steps:
            pid = rec.fields.get("pid") if rec.source is not None and rec.source.collector == "hook" else None
            if isinstance(rec.rank, int) and pid is not None and pid.isdigit():
                uid = verified.get(int(pid))
                if uid is not None:  # a pid no verified sender named is not the agent's to follow
                    seen.add((rec.job, rec.rank, int(pid), "hook", uid))
        for job, rank, pid, source, uid in seen:
            note(pid, rank, source, job, uid)

    # ---- self metrics -------------------------------------------------------------------------
    def self_metric_rows(self) -> list[tuple[Mapping[str, str], str, float]]:
        node = {"node": self.cfg.node}
        rows: list[tuple[Mapping[str, str], str, float]] = []
        # Counters with known label values are served from 0: increase() needs a sample before the
        # first event to see it (else the first capture, the first collector error are missed).
        for name, st in self.scheduler.states.items():
            errors = {**dict.fromkeys(RUNNING_ERROR_REASONS, 0), **st.collector.errors}
            for reason, n in errors.items():
                rows.append(({**node, "collector": name, "reason": reason},
                             "perfd_agent_collector_errors_total", float(n)))
            rows.append(({**node, "collector": name}, "perfd_agent_samples_total",
                         float(self.samples_total.get(name, 0))))
        for name in self.config_errors:
            rows.append(({**node, "collector": name, "reason": "config"},
                         "perfd_agent_collector_errors_total", 1.0))
        if self.captures is not None:  # what the capture executor refused (a job's trace past its caps)
            refused = {**dict.fromkeys(L.TRACE_REFUSED_REASONS, 0), **self.captures.manager.errors}
            rows += [({**node, "collector": "captures", "reason": r}, "perfd_agent_collector_errors_total",
                      float(n)) for r, n in refused.items()]
            # Why the Kineto daemon is off (another user holds its name).
            rows += [({**node, "collector": "kineto", "reason": r}, "perfd_agent_collector_errors_total",
                      float(n)) for r, n in self.captures.kineto_errors.items()]
        counts = self.http_refusals.snapshot()
        rows += [({**node, "reason": r}, "perfd_agent_http_refused_total", float(counts.get(r, 0)))
                 for r in L.REFUSED_REASONS if r in counts or r in L.REFUSED_HTTP_REASONS]
        ru = resource.getrusage(resource.RUSAGE_SELF)
        rows.append((node, "perfd_agent_cpu_seconds_total", ru.ru_utime + ru.ru_stime))
        try:
            with open(f"/proc/{os.getpid()}/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            rows.append((node, "perfd_agent_resident_memory_bytes", float(rss)))
        except (OSError, ValueError, IndexError):
            pass
        done = dict(self.captures_done)
        if self.captures is not None:  # this agent can capture: every tool x outcome from 0
            done = {**{(t, o): 0 for t in CAPTURE_TOOLS for o in CAPTURE_OUTCOMES}, **done}
        for (tool, status), n in sorted(done.items()):
            rows.append(({**node, "tool": tool, "status": status}, "perfd_agent_captures_total", float(n)))
        if self.client is not None:
            c = self.client.counters()
            rows.append((node, "perfd_agent_spool_bytes", float(c["spool_bytes"])))
            rows.append((node, "perfd_agent_spool_dropped_samples_total",
                         float(c.get("dropped_samples", 0))))
            rows.append((node, "perfd_agent_send_failures_total", float(c.get("stream_errors", 0))))
            rows.append((node, "perfd_agent_connected", float(c.get("connected", 0))))
            rows.append((node, "perfd_agent_ack_timeouts_total", float(c.get("ack_timeouts", 0))))
        return rows

    def collect_duration_family(self) -> Metric:
        """perfd_agent_collect_duration_seconds: each collector's collect() durations (scheduler)."""
        d = catalog.get("perfd_agent_collect_duration_seconds")
        fam = HistogramMetricFamily(d.name, f"{d.description} [source: {d.source}]",
                                    labels=["node", "collector"])
        bounds = (*map(str, COLLECT_BUCKETS_S), "+Inf")
        for name, st in sorted(self.scheduler.states.items()):
            counts, total = list(st.duration_counts), st.duration_sum_s  # a copy: the thread writes on
            buckets = [(le, float(n)) for le, n in zip(bounds, itertools.accumulate(counts), strict=True)]
            fam.add_metric([self.cfg.node, name], buckets, total)
        return fam

    def _count_capture(self, ev: Mapping[str, object]) -> None:
        """A capture that ended, by tool and outcome (the catalog's status enum: ok, failed, skipped)."""
        kind = ev.get("kind")
        if kind not in (CAPTURE_FINISHED.name, CAPTURE_FAILED.name):
            return
        payload = ev.get("payload")
        status = str(payload.get("status") or "") if isinstance(payload, Mapping) else ""
        if kind == CAPTURE_FINISHED.name:
            status = "ok"
        elif status not in CAPTURE_OUTCOMES or status == "ok":  # a failure event says failed or skipped
            status = "failed"
        tool = str(label_of(ev, "tool") or "unknown")
        self.captures_done[(tool, status)] = self.captures_done.get((tool, status), 0) + 1

    # ---- the loop -----------------------------------------------------------------------------
    def _forward(self, items: list[tuple[str, Collected]]) -> None:
        samples: list[Sample] = []
        steps = []
        events: list[dict[str, object]] = []
        collectives: list[CollectiveRecord] = []
        job_info: dict[str, str] = {}
        checkpoints: dict[str, dict[str, object]] = {}
        for name, out in items:
            for s in out.samples:
                s.labels.setdefault("node", self.cfg.node)
            for ev in out.events:  # the aggregator keys GPU state by (node, gpu)
                ev.setdefault("labels", {}).setdefault("node", self.cfg.node)
            self.view.update(name, out.samples)  # the agent's /metrics: every sample
            samples.extend(out.samples)
            steps.extend(out.steps)
            events.extend(out.events)
            collectives.extend(out.collectives)
            self.samples_total[name] = self.samples_total.get(name, 0) + len(out.samples)
            for job, info in out.job_info.items():
                # Two describers of one job (a log and the step hooks) each send on change only:
                # merged here, so neither's news is lost to the other's in the same batch.
                merged = merge_job_info(self._jobinfo_merged.get(job), info)
                if not self.cfg.mfu_alert:  # the job's opt-out of the MFU alert travels with its info
                    merged = dataclasses.replace(merged, mfu_alert=False)
                self._jobinfo_merged[job] = merged
                text = job_info_to_json(merged)
                self._jobinfo_last[job] = text
                if self._jobinfo_sent.get(job) != text:
                    job_info[job] = text
            if out.checkpoint is not None:
                checkpoints[name] = out.checkpoint
        reconnects = getattr(self.client, "reconnects", 0)
        if self.client is not None and reconnects != self._reconnects_seen:
            # A new stream may reach an aggregator that lost what we sent (restarted without a
            # state dir): send every job's info again; a durable one just overwrites it.
            self._reconnects_seen = reconnects
            job_info = {**self._jobinfo_last, **job_info}
        if self.cfg.engine:
            self._stepped.update(r.job for r in steps)
            if self.monotonic() - self._jobinfo_resent_at >= JOBINFO_RESEND_S:
                # the jobs that stepped here since the last time only: an ended job's info stays put
                self._jobinfo_resent_at = self.monotonic()
                again = {j: self._jobinfo_last[j] for j in self._stepped if j in self._jobinfo_last}
                job_info = {**again, **job_info}
                self._stepped.clear()
        hook = self.scheduler.states.get("hook")
        self.hook_gpus.apply(events, hook_ranks(getattr(hook.collector, "ranks", None) or {}) if hook else [],
                             time.time())
        self._note_gpu_jobs(events)
        self._note_ranks(events, steps)
        samples = self.reducer.reduce(samples, time.time())  # the aggregator: latest every few seconds
        if self.captures is not None and events:
            self.captures.observe(events)  # rank -> pid, and the hook's profile progress
        if self.client is None or not (samples or steps or events or job_info or collectives):
            self._save_checkpoints(checkpoints)
            return
        n = MAX_COLLECTIVES_PER_BATCH  # a first Flight Recorder dump of many ranks can be large
        staged: list[int] = []

        def stage(seq: int) -> None:  # the positions pend on the batch about to enter the spool
            staged.append(seq)
            self._save_checkpoints(checkpoints, seq)

        try:
            self.client.submit(samples, steps, events, job_info_json=job_info or None,
                               collectives=collectives[:n], on_seq=stage if checkpoints else None)
            self._jobinfo_sent.update(job_info)
            for i in range(n, len(collectives), n):
                self.client.submit(collectives=collectives[i:i + n], on_seq=stage if checkpoints else None)
            if not staged:
                self._save_checkpoints(checkpoints)  # nothing was sent: they ride on what is pending
        except Exception as exc:  # an oversized batch or a spool failure: counted, agent lives
            self.submit_errors += 1
            log.warning("could not queue a batch for the aggregator: %s", exc)

    def _save_checkpoints(self, checkpoints: Mapping[str, dict[str, object]], seq: int | None = None) -> None:
        if self._checkpoints is not None:
            for name, ck in checkpoints.items():
                self._checkpoints.save(name, ck, seq)

    async def run(self, stop: asyncio.Event) -> None:
        self.build()
        self.start_metrics_server()  # first: a port in use stops start-up before any thread runs
        if self.ready_file:
            _write_ready(self.ready_file, self.metrics_port if self.metrics_port is not None else -1)
        self.scheduler.start()
        if self.cfg.engine:
            self._start_engine()
            if self.cfg.captures:
                self._start_captures()
        elif self.cfg.aggregator:
            from perfd.transport.client import AgentClient
            from perfd.transport.security import ClientTls, TokenFile

            caps = {name: ("ok" if st.capabilities and st.capabilities.available
                           else f"unavailable: {st.capabilities.reason if st.capabilities else '?'}")
                    for name, st in self.scheduler.states.items()}
            self.client = AgentClient(
                self.cfg.aggregator, self.cfg.agent_id,
                spool=self._spool,
                node=self.cfg.node, jobs=[self.cfg.job] if self.cfg.job else [], capabilities=caps,
                on_command=self._on_command,
                tls=(ClientTls(self.cfg.tls_ca, self.cfg.tls_cert, self.cfg.tls_key)
                     if self.cfg.tls_ca else None),
                token=TokenFile(self.cfg.auth_token_file) if self.cfg.auth_token_file else None)
            log.info("agent %s streaming to %s (%s, %s)", self.cfg.agent_id, self.cfg.aggregator,
                     ("mutual TLS" if self.cfg.tls_cert else "TLS") if self.cfg.tls_ca else "plaintext",
                     "bearer token" if self.cfg.auth_token_file else "no token")
            self._client_task = asyncio.create_task(self.client.run())
            if self.cfg.captures:
                self._start_captures()
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.cfg.batch_interval_s)
                except asyncio.TimeoutError:
                    pass
                self._forward(self.scheduler.drain())
        finally:
            await self._shutdown()

    def _start_engine(self) -> None:
        """The distributed path (perfd.engine): records to the engine, one message per node and
        iteration; commands (captures, a stall's stacks) come from the jobs' root over it."""
        from perfd.engine.publisher import EngineClient
        from perfd.engine.subjects import EngineConfig

        token = Path(self.cfg.engine_token_file).read_text().strip() if self.cfg.engine_token_file else None
        ecfg = EngineConfig(tuple(u.strip() for u in (self.cfg.engine or "").split(",") if u.strip()),
                            token=token, tls_ca=self.cfg.engine_tls_ca, tls_cert=self.cfg.engine_tls_cert,
                            tls_key=self.cfg.engine_tls_key, partitions=self.cfg.engine_partitions)
        fold = None
        if self.cfg.engine_collectives == "agent":  # its ranks' windows folded here (the analytics: only now)
            from perfd.analytics.collectives.shardfold import ShardCollectives

            fold = ShardCollectives()
        self.client = EngineClient(ecfg, self.cfg.agent_id, node=self.cfg.node, spool=self._spool,
                                   on_command=self._on_command, window_fold=fold)
        log.info("agent %s publishing to the engine %s (%s, %s, %d partitions)", self.cfg.agent_id,
                 ",".join(ecfg.servers), "TLS" if ecfg.tls_ca else "plaintext",
                 "token" if token else "no token", ecfg.partitions)
        self._client_task = asyncio.create_task(self.client.run())

    async def _shutdown(self) -> None:
        """Stop within SHUTDOWN_BUDGET_S of the signal, whatever is busy: each step gets what is left
        of one deadline (StopBudget). Nothing is lost by cutting a step short — every submitted batch
        is already in the spool, and the next start sends what the aggregator did not acknowledge."""
        budget = StopBudget(self.monotonic)
        # A shutdown that still overruns says where it is stuck (every thread's stack, on stderr).
        faulthandler.dump_traceback_later(SHUTDOWN_BUDGET_S + 0.3, exit=False)
        self.scheduler.stop(timeout_s=budget.left(0.4))
        budget.mark("collectors")
        self._forward(self.scheduler.drain())  # what the collectors produced last
        budget.mark("forward")
        if self.captures is not None:
            self.captures.close(timeout_s=min(CAPTURE_STOP_S, budget.left(0.3)))
            budget.mark("captures")
        if self.client is not None and self._client_task is not None:
            # Best effort: the spool keeps the rest.
            flushed = await self.client.flush(timeout=budget.left(0.6))
            budget.mark("flush" if flushed else "flush (cut short: the spool keeps the rest)")
            self._client_task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(self._client_task), timeout=budget.floored())
            except (asyncio.CancelledError, asyncio.TimeoutError):
                pass
            budget.mark("stream")
            self.client.close()
        if self.http is not None:
            self.http.stop(timeout=budget.floored(0.5))
            budget.mark("http")
        faulthandler.cancel_dump_traceback_later()
        took = budget.took()
        # A slow stop is worth a line at the default level: it names the step that took the time.
        log.log(logging.WARNING if took > 1.0 else logging.INFO, "agent stopped in %.2f s (%s)", took,
                ", ".join(budget.phases))

    def _start_captures(self) -> None:
        from perfd.agent.capture_executor import AgentCaptures

        hook = self.scheduler.states.get("hook")
        ranks = self.scheduler.states.get("ranks")
        followed = getattr(ranks.collector, "rank_pids", None) if ranks is not None else None
        try:
            self.captures = AgentCaptures(self.cfg.job or DEFAULT_JOB, self.cfg.capture_root(),
                                          self.cfg.capture_quota_bytes, self._emit_event,
                                          kineto=self.cfg.kineto_daemon,
                                          hook=hook.collector if hook is not None else None,
                                          kineto_socket_dir=self.cfg.kineto_socket_dir,
                                          rank_pids=followed, job_uid=self.cfg.job_uid)
        except Exception as exc:  # no capture store (disk, permissions): say so, monitor on
            log.error("captures disabled: %s", exc)

    def _stacks(self) -> StackDumper:
        """The stack dumper, made at the first request: its pids are the ranks collector's."""
        if self.stacks is None:
            st = self.scheduler.states.get("ranks")
            col = st.collector if st is not None else None

            def pids_of(job: str) -> Mapping[int, int]:
                got = getattr(col, "rank_pids", None)
                return got(job or None) if got is not None else {}

            self.stacks = StackDumper(self._emit_event, pids_of)
        return self.stacks

    def _emit_event(self, ev: dict[str, object]) -> None:
        """Capture progress, from the capture threads: straight to the spool and the aggregator."""
        labels = ev.setdefault("labels", {})
        if isinstance(labels, dict):
            labels.setdefault("node", self.cfg.node)
        ev.setdefault("job", self.cfg.job or DEFAULT_JOB)
        self._count_capture(ev)
        if self.client is not None:
            try:
                self.client.submit(events=[ev])
            except Exception as exc:
                self.submit_errors += 1
                log.warning("could not queue a capture event: %s", exc)

    def _on_command(self, cmd: Command) -> None:
        if getattr(cmd, "kind", "") == COMMAND_STACKS:
            self._stacks().handle(cmd)
            return
        if self.captures is None:
            log.warning("command %s (%s) received; captures are disabled on this agent",
                        getattr(cmd, "id", "?"), getattr(cmd, "kind", "?"))
            return
        self.captures.handle(cmd)


def _write_ready(path: str, port: int) -> None:
    """The port, whole or not at all (a supervisor polls the file): a temporary file renamed."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


def run_agent(cfg: AgentConfig, ready_file: str | None = None) -> int:
    """Run until SIGINT/SIGTERM. Returns the process exit code. ``ready_file``: once /metrics listens,
    its port is written there (-1 without a /metrics server): with ``--metrics-port 0`` a supervisor
    (the demo, tests) learns the port the agent bound, where a port picked free beforehand can be
    taken by another program before the agent binds it (seen with two test suites at once)."""
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        agent = Agent(cfg)
        agent.ready_file = ready_file
        await agent.run(stop)

    try:
        asyncio.run(main())
    except (OSError, ValueError) as exc:  # a port in use, a TLS or token file that cannot be used
        print(f"perfd agent: {exc}", file=sys.stderr)
        return 2
    return 0
