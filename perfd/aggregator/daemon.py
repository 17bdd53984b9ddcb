"""`perfd aggregator`: gRPC ingest (grpc.aio) + analytics + Prometheus /metrics + JSON API."""

from __future__ import annotations

import asyncio
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.durable import Journal, restore, save_documents
from perfd.aggregator.exposure import exposure_warning, unauthenticated
from perfd.aggregator.guard import Guard
from perfd.aggregator.http import HttpServer
from perfd.aggregator.loops import EVENT_LOOPS, event_loop_runner
from perfd.aggregator.retention import Lifecycle
from perfd.aggregator.runtime import SWITCH_INTERVAL_S, gc_full, gc_seconds, tune_gc, tune_switch_interval
from perfd.aggregator.state import AggregatorState
from perfd.aggregator.state_schema import StoreError
from perfd.aggregator.state_store import DEFAULT_MAX_BYTES as DEFAULT_STATE_BYTES
from perfd.aggregator.state_store import StateStore
from perfd.aggregator.wandb_sync import WandbSync
from perfd.analytics.collectives.collective_config import CollectiveConfig
from perfd.core import limits as L
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.core.jobinfo_json import decode_job_info
from perfd.core.limits import REFUSED_JOB_INFO_VALUE
from perfd.core.refusals import Refusals
from perfd.core.shared_thresholds import STALL_PHASE_MAX_S
from perfd.engine.subjects import EngineConfig
from perfd.exporters.httpd import bind_error
from perfd.exporters.remote_write import DEFAULT_INTERVAL_S, Credentials, RemoteWriter, target_name
from perfd.rules.evaluator import RuleEngine
from perfd.rules.pack_loader import default_pack_path
from perfd.rules.rule_types import RulePackError
from perfd.rules.ruleset import load_rule_set
from perfd.transport.codec import Command, DecodedBatch, HelloInfo
from perfd.transport.delivery import Kept
from perfd.transport.security import IdentityPolicy, ServerTls, TokenFile
from perfd.transport.series import Series
from perfd.transport.server import IngestServer

if TYPE_CHECKING:  # imported where --engine starts it: nats is an optional dependency
    from perfd.engine.root import Root

log = logging.getLogger(__name__)


@dataclass
class AggregatorConfig:
    grpc_host: str = L.LOOPBACK  # secure by default: another address (or --listen-all) opens it up
    grpc_port: int = 50051
    http_host: str = L.LOOPBACK
    http_port: int = 9401
    # Security (perfd.transport.security): TLS for gRPC (mutual with tls_client_ca) and a bearer
    # token for gRPC and the HTTP API (all of it but /metrics and /healthz).
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    auth_token_file: str | None = None
    # Which agent ids and jobs each client certificate may use (perfd.transport.security.IdentityPolicy).
    identity_policy: str | None = None
    limits: L.Limits = field(default_factory=L.Limits)
    gpu: str | None = None  # override the GPU name used for the peak table
    peak_tflops: float | None = None
    max_iterations_per_job: int = L.RETAIN_ITERATIONS  # --retain-iterations
    max_bytes_per_job: int = L.RETAIN_BYTES  # --retain-mib
    per_rank_series: bool = True  # False: /metrics leaves out per-rank series (very large jobs)
    export_node_series: bool = False  # True: /metrics also re-exports the agents' GPU and host series
    # Rule packs evaluated every rules_interval_s; None = the shipped default pack, [] = no rules.
    rules_files: list[str] | None = None
    rules_interval_s: float = 5.0
    refresh_interval_s: float = 0.5  # how often analyses of jobs with new data are rebuilt for /metrics
    event_loop: str = EVENT_LOOPS[0]  # --event-loop: auto | uvloop | asyncio (run_aggregator)
    switch_interval_s: float = SWITCH_INTERVAL_S  # --gil-switch-ms (run_aggregator; perfd.aggregator.runtime)
    # --state-dir: job info, step records, events, rule/capture state survive a restart (SQLite, WAL).
    state_dir: str | None = None
    state_max_bytes: int = DEFAULT_STATE_BYTES  # --state-max-mib: the state dir's journal, Hellos, documents
    # Weights & Biases: one run per job (perfd.exporters.wandb); None = off.
    wandb_project: str | None = None
    wandb_mode: str = "offline"  # offline (no server; `wandb sync` later) | online | disabled
    wandb_dir: str | None = None  # where runs are written (perfd.exporters.wandb.default_directory)
    wandb_interval_s: float = 10.0
    # Collective analysis (link capabilities): the default and per-job overrides.
    collectives: CollectiveConfig | None = None
    collectives_per_job: dict[str, CollectiveConfig] = field(default_factory=dict)
    # Seconds without a step after which a job is stalled or ended (None: 10 of its own median
    # steps, at least 60 s; perfd.analytics.steps.liveness).
    job_stale_after_s: float | None = None
    # How long after a job's last record its announced pauses may hold a live stall back
    # (perfd.core.shared_thresholds.STALL_PHASE_MAX_S unless given: --stall-phase-max).
    stall_phase_max_s: float = STALL_PHASE_MAX_S.value
    # Prometheus remote-write of what /metrics shows (perfd.exporters.remote_write); [] = off.
    remote_write: list[str] = field(default_factory=list)
    remote_write_interval_s: float = DEFAULT_INTERVAL_S
    remote_write_labels: dict[str, str] = field(default_factory=dict)  # default: perfd_aggregator=HOST:PORT
    remote_write_credentials: Credentials | None = None  # tenant, auth and CA of every write
    # The distributed path (perfd.engine): this aggregator is (or stands by as) the jobs' root.
    engine: EngineConfig | None = None
    engine_replicas: int = 1
    engine_root_id: str | None = None  # default: HOST:GRPC_PORT
    engine_job: str | None = None  # the one job this root leads (its own root); None: every job without one
    # This aggregator's HTTP as the other roots reach it (http://POD_IP:PORT): while it leads, a
    # standby forwards its API there (perfd.aggregator.forward); None: a standby answers for itself
    engine_advertise_http: str | None = None


class Aggregator:
    def __init__(self, cfg: AggregatorConfig, clock: Clock = REAL_CLOCK) -> None:
        self.cfg, self.clock = cfg, clock  # the clock every time-dependent part reads (perfd.core.clock)
        self.refusals = Refusals()
        tls = None
        if cfg.tls_cert or cfg.tls_key or cfg.tls_client_ca:
            if not (cfg.tls_cert and cfg.tls_key):
                raise ValueError("--tls-cert and --tls-key go together (--tls-client-ca needs both)")
            tls = ServerTls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
        policy = None
        if cfg.identity_policy:
            if not cfg.tls_client_ca:  # identities come from client certificates
                raise ValueError("--identity-policy needs mutual TLS (--tls-client-ca)")
            policy = IdentityPolicy(cfg.identity_policy)
        self.guard = Guard(cfg.limits, self.refusals, self._job_allowed if policy is not None else None,
                           identity_of=lambda agent: self.server.identity_of(agent))
        # Who keeps an iteration two hosts wrote (the guard's standing); how a stall asks its agents
        # for the ranks' stacks; links for the collective analysis.
        self.state = AggregatorState(cfg.max_iterations_per_job, gpu_override=cfg.gpu,
                                     peak_tflops=cfg.peak_tflops, max_bytes_per_job=cfg.max_bytes_per_job,
                                     collectives=cfg.collectives, collectives_per_job=cfg.collectives_per_job,
                                     job_stale_after_s=cfg.job_stale_after_s,
                                     stall_phase_max_s=cfg.stall_phase_max_s, standing=self.guard.standing,
                                     send=self.send_command, clock=clock)
        self.guard.placed_jobs = self.state.jobs_on  # a node agent reports the jobs on its GPUs
        self.guard.node_of = self._node_of  # ... on a node the jobs' hosts name
        # A job-less event is the job's its sender hosts, never a label's (perfd.aggregator.eventlog).
        self.state.log.hosted = lambda agent: [j for j in self.guard.jobs_of(agent)
                                               if agent in self.guard.hosts(j)]
        self.state.log.refusals = self.refusals  # events past their pool's share (event_share)
        self.token = TokenFile(cfg.auth_token_file) if cfg.auth_token_file else None
        self.store: StateStore | None = (StateStore(cfg.state_dir, max_bytes=cfg.state_max_bytes)
                                         if cfg.state_dir else None)
        # agent -> series id -> its definition, admitted by the guard (once per definition).
        self._series: dict[str, dict[int, Series]] = {}
        self.server = IngestServer(self.on_batch, self._on_hello, tls=tls, token=self.token,
                                   limits=cfg.limits, refusals=self.refusals,
                                   journal=(Journal(self.store, cfg.limits.max_jobs_per_agent)
                                            if self.store is not None else None),
                                   admit_series=self._admit_series, policy=policy,
                                   on_stream_end=lambda agent: self.lifecycle.stream_ended(agent))
        self.http: HttpServer | None = None
        self.grpc_port = 0
        self.captures = CaptureCoordinator(self.state, self._engine(cfg, clock), self.send_command,
                                           cfg.rules_interval_s, limits=cfg.limits,
                                           refusals=self.refusals, hosts=self._hosts, clock=clock)
        self._rules_task: asyncio.Task[None] | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._working: set[asyncio.Future[None]] = set()  # the loops' work on worker threads, in flight
        self._stopping = False
        self.job_info_errors = 0
        self.wandb: WandbSync | None = None
        self._wandb_task: asyncio.Task[None] | None = None
        if cfg.wandb_project:
            from perfd.exporters.wandb import WandbExporter, default_directory

            exporter = WandbExporter(cfg.wandb_project, cfg.wandb_mode,
                                     cfg.wandb_dir or default_directory(cfg.state_dir))
            self.wandb = WandbSync(self.state, exporter, self.captures.list, cfg.wandb_interval_s)
        self.remote: RemoteWriter | None = None
        self.lifecycle = Lifecycle(self, clock)  # what is held now: releases, pruning, forgetting agents
        self.ticks = 0  # rules ticks completed
        self.restored: dict[str, int] = {}  # what the start-up replay read, and its milliseconds

    @staticmethod
    def _engine(cfg: AggregatorConfig, clock: Clock) -> RuleEngine | None:
        if cfg.rules_files is None:
            default = default_pack_path()
            if not default.is_file():  # an install without the shipped packs: say so, run on
                log.warning("no default rule pack at %s: no rules evaluated (give --rules FILE)", default)
                return None
            files = [str(default)]
        else:
            files = cfg.rules_files
        # One set, as `perfd rules check` builds it (perfd.rules.ruleset): a bad pack, or a rule named
        # like one of an earlier pack without 'override: true', stops start-up with every error.
        rs = load_rule_set(files)
        if rs.errors:
            raise RulePackError(rs.errors)
        for w in rs.warnings:  # loads, but never fires (or overrides nothing): say so once, at start-up
            log.warning("%s", w)
        for old, new in rs.replaced:
            log.info("rule %s of %s overrides the one of %s", new.name, new.origin, old.origin)
        return RuleEngine(rs.rules, clock) if rs.rules else None

    async def _refresh_loop(self) -> None:
        """Analyses of jobs with new data, every refresh interval, on a worker thread: /metrics
        serves the last one and never waits on an analysis (docs/reliability.md)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.cfg.refresh_interval_s)
            try:
                await self._in_worker(loop, self.state.refresh)
            except Exception:
                log.exception("analysis refresh failed")

    async def _rules_loop(self) -> None:
        """Every rules interval: the jobs with new data analysed (their incidents too), then the rules."""
        while True:
            await asyncio.sleep(self.cfg.rules_interval_s)
            try:
                # Analysis may run here (rate-limited): off the event loop, so ingest never waits.
                await self._in_worker(asyncio.get_running_loop(), self.tick)
            except Exception:  # a rule bug must not stop ingest; it is logged each time
                log.exception("rule evaluation failed")

    async def _in_worker(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
        """``fn`` on a worker thread, held in ``_working`` until it returns: a cancelled task does not
        stop its thread, and stop() waits for it before closing the state store."""
        fut = loop.run_in_executor(None, fn)
        self._working.add(fut)
        try:
            await asyncio.shield(fut)
        finally:
            if fut.done():
                self._working.discard(fut)
            else:
                fut.add_done_callback(self._working.discard)

    def tick(self) -> None:
        """The rules loop's work, as of the aggregator's clock (a test moves a ManualClock, then ticks)."""
        # Each part on its own: one that raises (logged each time) does not keep the others from running
        # — the rules from evaluating, jobs from being pruned, the documents from being saved. Once the
        # aggregator stops, the parts left are skipped (stop() saves the documents itself).
        for what, part in (("analysis refresh", self.state.refresh),
                           ("rule evaluation", self.captures.evaluate),
                           ("housekeeping", self.lifecycle.housekeeping), ("state store", self._save)):
            if self._stopping:
                return
            try:
                part()
            except Exception:
                log.exception("%s failed in the rules tick", what)
        self.ticks += 1  # a whole tick done: what arrived before it started is analysed (tests wait on it)

    def _save(self) -> None:
        if self.store is not None:
            # The journal keeps its newest max_batches batches, within max_bytes; pruned first, so that
            # the documents' commit makes the pruning durable in the same tick.
            self.store.prune()
            save_documents(self, self.store)
            self.store.prune()  # the journal keeps its newest max_batches batches
            self.store.shrink()  # committed, the freed pages go back: the files stay under the cap

    def _on_hello(self, hello: HelloInfo) -> list[str]:
        return self.on_hello_jobs(hello.agent_id, hello.jobs, node=hello.node,
                                   capabilities=hello.capabilities)

    def on_hello_jobs(self, agent_id: str, jobs: Sequence[str], now: float | None = None,
                       node: str | None = None, capabilities: Mapping[str, str] | None = None) -> list[str]:
        """The jobs of the Hello the guard admitted (what the state store keeps of it)."""
        self.lifecycle.hello(agent_id)
        admitted = self.guard.hello(agent_id, jobs)
        self.state.hello(agent_id, admitted, now, node, capabilities)
        return admitted

    def ingest_job_info_text(self, agent_id: str, job: str, text: str, now: float | None = None) -> bool:
        """True when the job info was taken (the state store keeps only that)."""
        if not self.guard.may_write(agent_id, job, "job info"):
            return False
        try:
            info, rejected = decode_job_info(text)
            if rejected:  # the rest of the job info is kept: only the absurd values go
                self.refusals.refuse(REFUSED_JOB_INFO_VALUE, f"job info of {job[:80]} from agent "
                                     f"{agent_id[:80]}: {'; '.join(rejected)[:400]}", len(rejected))
            self.state.ingest_job_info(agent_id, job, info, now)
        except (ValueError, TypeError) as exc:
            self.job_info_errors += 1
            log.warning("agent %s sent unusable job info for %s: %s", agent_id, job, exc)
            return False
        return True

    def _node_of(self, agent_id: str) -> str | None:
        """The node the agent's live Hello named (None: none since this aggregator started)."""
        said = self.state.hello_of(agent_id)
        return said[0] if said is not None else None

    def _job_allowed(self, agent_id: str, job: str) -> bool:
        """The identity policy's word on ``agent_id`` writing ``job`` (an agent with no identity bound
        was replayed from the state store at start: what it wrote passed the policy when it came)."""
        policy, identity = self.server.policy, self.server.identity_of(agent_id)
        return policy is None or identity is None or policy.may_write_job(identity, job)

    def _admit_series(self, agent_id: str, sid: int, s: Series) -> bool:
        """IngestServer.admit_series, for each series definition it reads: one held already is admitted
        again, not counted twice (a reconnect redefines every series); a refused one is kept nowhere."""
        cache = self._series.get(agent_id)
        held = cache.get(sid) if cache is not None else None
        if held == s:
            return True
        if held is not None:  # the id now names another series: the one it named is released
            self.guard.release_series(agent_id, 1)
        if self.guard.admit_series(agent_id, s.name, s.labels):
            if cache is None:
                cache = self._series[agent_id] = {}
            cache[sid] = s
            return True
        if cache is not None:
            cache.pop(sid, None)  # the id now names a refused series
        return False

    def send_command(self, agent_id: str, command: Command) -> bool:
        """To the agent's stream when it has one, else — this aggregator the jobs' root on the engine —
        through the engine (perfd.engine.root.Root.send_command). Any thread."""
        root = self.engine_root
        if root is not None and not self.server.live(agent_id):  # a dict read: as send_command's own
            return bool(root.send_command(agent_id, command))
        return self.server.send_command(agent_id, command)

    def _hosts(self, job: str) -> set[str]:
        """The agents a capture of ``job`` may go to: its hosts (a stream's Hello named the job); for
        a job seen through the engine, which no Hello names, the agents whose records of it came
        through the engine (the engine's credentials are that path's boundary)."""
        hosts = self.guard.hosts(job)
        if hosts or self.engine_root is None:
            return hosts
        from perfd.engine.root import ENGINE_AGENT

        return (set(self.state.job_agents(job)) | set(self.state.rank_host_agents(job))) - {ENGINE_AGENT}

    def forget_series(self, agent_id: str) -> None:
        """The agent was forgotten (perfd.aggregator.retention): its series leave the cap."""
        self._series.pop(agent_id, None)
        self.guard.release_series(agent_id)

    def on_batch(self, agent_id: str, batch: DecodedBatch, arrived_at: float | None = None) -> Kept:
        """``arrived_at``: when the batch first arrived (the state store's replay), else now. Returns
        what was kept of it: the state store journals nothing that was refused."""
        st, guard = self.state, self.guard
        info_kept = [job for job, text in batch.job_info_json.items()
                     if self.ingest_job_info_text(agent_id, job, text, arrived_at)]
        if batch.new_series:  # also in a batch without samples: the ids' next samples need it
            st.series_defined(agent_id, batch.new_series)
        if batch.n_samples:
            # batch.series holds admitted series only: samples of a refused one are dropped there
            st.ingest_samples(agent_id, batch.series, batch.series_ids, batch.timestamps_ns, batch.values)
        steps = guard.steps(agent_id, batch.steps) if batch.steps else []
        refused_steps: set[int] = set()
        if steps:
            kept_out = st.ingest_steps(agent_id, steps, arrived_at)
            refused_steps = kept_out.refused
            for (job, holder), its in kept_out.other_agent.items():
                self.refusals.refuse(L.REFUSED_STEP_CONFLICT, f"{len(its)} step record(s) of job "
                                     f"{job[:64]!r} from agent {agent_id[:64]} for iterations held "
                                     f"from agent {holder[:64]}; the held ones kept", len(its))
            for (job, holder), its in kept_out.displaced.items():
                self.refusals.refuse(L.REFUSED_STEP_AHEAD, f"{len(its)} step record(s) of job {job[:64]!r} "
                                     f"from agent {holder[:64]} (e.g. iteration {its[0]}) were written ahead "
                                     f"of the job: replaced by agent {agent_id[:64]}'s, which continues it",
                                     len(its), agent=holder)
            for job, bad in kept_out.implausible.items():
                self.refusals.refuse(L.REFUSED_ITERATION_AHEAD, f"{len(bad)} step record(s) of job "
                                     f"{job[:64]!r} from agent {agent_id[:64]} with an implausible iteration "
                                     f"(e.g. {bad[0][0]}: {bad[0][1]}); refused", len(bad), agent=agent_id)
            for job, its in kept_out.worse.items():
                self.refusals.refuse(L.REFUSED_WORSE_DUPLICATE, f"{len(its)} copy(ies) of held step "
                                     f"records of job {job[:64]!r} (e.g. iteration {its[0]}) from agent "
                                     f"{agent_id[:64]} lack values the held ones have; kept the held ones",
                                     len(its))
        colls = guard.collectives(agent_id, batch.collectives) if batch.collectives else []
        if colls:
            st.ingest_collectives(agent_id, colls)
        # Typed at the edge (refused entries counted), then who may send them (the guard).
        typed = guard.typed_events(agent_id, batch.events) if batch.events else []
        evs = [ev for _i, ev, _cut in typed]
        ev_kept = guard.events(agent_id, evs) if evs else []
        if ev_kept:
            st.ingest_events(agent_id, [evs[k] for k in ev_kept])
        taken = {id(r) for r in steps} - refused_steps
        held_colls = {id(c) for c in colls}
        return Kept(steps=[i for i, r in enumerate(batch.steps) if id(r) in taken],
                    events=[typed[k][0] for k in ev_kept],
                    collectives=[i for i, c in enumerate(batch.collectives) if id(c) in held_colls],
                    job_info=info_kept,
                    payloads={typed[k][0]: json.dumps(typed[k][1].get("payload"), separators=(",", ":"),
                                                      default=str) for k in ev_kept if typed[k][2]})

    def _transport_counters(self) -> dict[str, int]:
        d = self.server.counters()
        d["job_info_errors"] = self.job_info_errors
        gc_s = gc_seconds()
        full = gc_full()
        if gc_s is not None and full is not None:  # timed in the aggregator process (run_aggregator)
            d["gc_ms"] = round(gc_s * 1000)
            d["gc_full_ms"], d["gc_full_collections"] = round(full[0] * 1000), full[1]
        d.update({f"refused_{k}": v for k, v in self.refusals.snapshot().items()})
        d.update(self.lifecycle.counters())
        if self.store is not None:
            st = self.store.stats()
            d.update({f"state_store_{k}": int(st[k]) for k in (
                "commits", "commit_failures", "rollbacks", "agents_lost", "journal_batches", "pruned",
                "pruned_for_bytes", "hellos", "held_bytes", "max_bytes", "jobs_deleted",
                "rows_of_pruned_jobs", "logical_bytes", "budget_bytes", "pruned_hellos", "pruned_seqs",
                "shrinks", "settled_bytes", "settled_logical_bytes")})
            d.update({f"state_restored_{k}": v for k, v in self.restored.items()})
        return d

    engine_root: Root | None = None  # with --engine
    _engine_task: asyncio.Task[None] | None = None
    _engine_stop: asyncio.Event

    async def start(self) -> None:
        if self.store is not None:  # everything back before the first agent connects
            t0 = time.monotonic()
            got = restore(self, self.store)
            got["ms"] = round(1e3 * (time.monotonic() - t0))  # what a restart costs (bounded by the caps)
            self.restored = got
            log.info("state restored from %s in %.2f s: %s", self.store.path, got["ms"] / 1e3, got)
        try:
            self.grpc_port = await self.server.start(self.cfg.grpc_host, self.cfg.grpc_port)
        except OSError as exc:  # the same line as HTTP's: what, where, why, and the flag to change
            raise bind_error(exc, self.cfg.grpc_host, self.cfg.grpc_port, "gRPC", "--grpc-port N",
                             "--grpc-host") from exc
        self.lifecycle.started(asyncio.get_running_loop())
        self.state.transport_stats = self._transport_counters
        try:
            self.http = HttpServer(self.state, self.cfg.http_host, self.cfg.http_port, self.captures,
                                   per_rank_series=self.cfg.per_rank_series, token=self.token,
                                   refusals=self.refusals, export_node_series=self.cfg.export_node_series)
        except OSError as exc:
            await self.server.stop(None)
            raise bind_error(exc, self.cfg.http_host, self.cfg.http_port, "HTTP", "--http-port N",
                             "--http-host") from exc
        self.http.start()
        if self.cfg.remote_write:
            self._start_remote_write()
        if self.cfg.engine is not None:
            self._start_engine_root(self.cfg.engine)
        self._rules_task = asyncio.create_task(self._rules_loop())
        self._refresh_task = asyncio.create_task(self._refresh_loop())
        if self.wandb is not None:
            self._wandb_task = asyncio.create_task(self.wandb.run())
        grpc_sec = ("mutual TLS" if self.cfg.tls_client_ca else "TLS") if self.cfg.tls_cert else "plaintext"
        auth = "bearer token required" if self.token else "no token"
        log.info("aggregator listening: gRPC %s:%d (%s, %s); HTTP %s:%d (%s outside /metrics and /healthz)",
                 self.cfg.grpc_host, self.grpc_port, grpc_sec, auth, self.cfg.http_host, self.http.port, auth)
        exposed = unauthenticated(self.cfg.grpc_host, self.cfg.http_host, self.token is not None,
                                  bool(self.cfg.tls_client_ca))
        if exposed:  # on stderr too (perfd.app.cli's log handler), at start
            log.warning("aggregator %s", exposure_warning(exposed, f"{self.cfg.grpc_host}:{self.grpc_port}",
                                                           f"{self.cfg.http_host}:{self.http.port}"))

    def _start_engine_root(self, engine: EngineConfig) -> None:
        from perfd.aggregator.engine_sink import EngineSink
        from perfd.engine.root import Root
        from perfd.exporters.engine_metrics import RootMetrics

        root_id = self.cfg.engine_root_id or f"{socket.gethostname()}:{self.grpc_port}"
        c, sink = self.cfg, EngineSink(self.state, self.guard, self.lifecycle.prune)
        root = self.engine_root = Root(engine, sink, root_id, c.engine_replicas, c.engine_advertise_http,
                                       c.engine_job)
        self.state.collectives.shares = root.comm  # shares from the shards' summaries, where they summarise
        if self.http is not None:
            self.http.app.leader = lambda: None if root.stats.leader else root.leader_http
            self.http.app.registry.register(RootMetrics(root.stats, root.engine_state, root.comm.counts))
        self.state.engine_stats, self._engine_stop = root.stats_json, asyncio.Event()
        self._engine_task = asyncio.create_task(root.run(self._engine_stop))
        log.info("engine root %s on %s (%d partitions)", root_id, ",".join(engine.servers), engine.partitions)

    def _start_remote_write(self) -> None:
        assert self.http is not None
        labels = self.cfg.remote_write_labels or {
            "perfd_aggregator": f"{socket.gethostname()}:{self.grpc_port}"}
        self.remote = RemoteWriter(self.cfg.remote_write, self.http.collector.collect, labels,
                                   interval_s=self.cfg.remote_write_interval_s,
                                   credentials=self.cfg.remote_write_credentials)
        self.http.collector.remote_write = self.remote.stats
        self.remote.start()
        log.info("remote-write every %.0f s to %s (labels %s)", self.cfg.remote_write_interval_s,
                 ", ".join(target_name(u) for u in self.cfg.remote_write), labels)

    async def stop(self) -> None:
        t0 = time.monotonic()
        self._stopping = True
        if self.remote is not None:
            self.remote.stop()
        if self._rules_task is not None:
            self._rules_task.cancel()
        if self._refresh_task is not None:
            self._refresh_task.cancel()
        if self._wandb_task is not None:
            self._wandb_task.cancel()
        if self._engine_task is not None:  # the lease goes back, a standby root takes over at once
            self._engine_stop.set()
            try:
                await asyncio.wait_for(asyncio.shield(self._engine_task), timeout=STOP_WAIT_WORK_S)
            except (asyncio.TimeoutError, Exception):  # stopping: what the root held is in the stream
                self._engine_task.cancel()
        await self.server.stop(grace=1.0)
        phases = [f"gRPC {time.monotonic() - t0:.2f}s"]
        if self.http is not None:
            self.http.stop()
            phases.append(f"HTTP {time.monotonic() - t0:.2f}s")
        if self._working:
            # The rules tick and the refresh run on worker threads, which a cancelled task does not stop:
            # the store is closed after them ("Cannot operate on a closed database"), each at its next part.
            _done, late = await asyncio.wait(set(self._working), timeout=STOP_WAIT_WORK_S)
            phases.append(f"tick {time.monotonic() - t0:.2f}s" + (" (still running)" if late else ""))
        if self.store is not None:
            save_documents(self, self.store)
            self.store.close()
            phases.append(f"store {time.monotonic() - t0:.2f}s")
        if self.wandb is not None:  # last: it waits for a round in flight, which never holds the save back
            await self.wandb.close()
            phases.append(f"W&B {time.monotonic() - t0:.2f}s")
        took = time.monotonic() - t0
        log.log(logging.WARNING if took > 1.5 else logging.INFO, "aggregator stopped in %.2f s (%s)", took,
                ", ".join(phases))


# SIGTERM is honoured within 5 s (docs/reliability.md): past this long after the signal the process
# ends whatever is still running (what the store committed is kept: an Ack follows a commit).
SHUTDOWN_BUDGET_S = 4.5
# How long a stop waits for the rules tick's part in flight before closing the store (within the budget;
# a part still running then finds the store closed and leaves it: StateStore.closed).
STOP_WAIT_WORK_S = 2.0


def _exit_now(why: str) -> NoReturn:
    log.log(logging.ERROR if why else logging.DEBUG, "%s", why)
    faulthandler.cancel_dump_traceback_later()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _stop_on_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, server: IngestServer) -> None:
    """SIGTERM and SIGINT stop the ingest at once, set ``stop`` on the loop and start the shutdown
    deadline. A plain handler, not loop.add_signal_handler: Python runs it between two bytecodes
    of whatever the main thread is doing, where the loop's handler waited for the step running to
    end, and then for every batch ready before it (under a series flood the loop reached ``stop``
    3 s after the signal)."""
    started: list[float] = []

    def on_signal(signum: int, frame: object) -> None:
        server.begin_stop()  # the streams deliver nothing more: the loop comes to stop.set soon
        loop.call_soon_threadsafe(stop.set)
        if started:
            return
        started.append(time.monotonic())
        def overdue() -> None:
            faulthandler.dump_traceback(all_threads=True)
            _exit_now(f"aggregator: not stopped {SHUTDOWN_BUDGET_S:g} s after signal {signum}; exiting now "
                      "(stacks above)")

        timer = threading.Timer(SHUTDOWN_BUDGET_S, overdue)
        timer.daemon = True
        timer.start()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def run_aggregator(cfg: AggregatorConfig, ready_file: str | None = None) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        agg = Aggregator(cfg)
        _stop_on_signals(asyncio.get_running_loop(), stop, agg.server)
        await agg.start()
        tune_gc()
        tune_switch_interval(cfg.switch_interval_s)
        assert agg.http is not None
        print(f"perfd aggregator: listening on gRPC {cfg.grpc_host}:{agg.grpc_port}"
              f"{' (TLS)' if cfg.tls_cert else ''}, HTTP http://{cfg.http_host}:{agg.http.port}/metrics"
              f"{' (token required but for /metrics and /healthz)' if cfg.auth_token_file else ''}"
              f"; event loop {loop_name}; switch interval {cfg.switch_interval_s * 1e3:g} ms"
              f"; GRPC_EXPERIMENTS={os.environ.get('GRPC_EXPERIMENTS', '(gRPC defaults)')}", flush=True)
        if ready_file:  # lets a supervisor (the demo, tests) learn the bound ports
            with open(ready_file, "w") as f:
                f.write(f"{agg.grpc_port} {agg.http.port}\n")
        await stop.wait()
        await agg.stop()

    try:
        loop_name, run = event_loop_runner(cfg.event_loop)
        run(main())
    except (OSError, ValueError, StoreError) as exc:  # a port in use, an unusable TLS/token file or state dir
        print(f"perfd aggregator: {exc}", file=sys.stderr)
        return 2
    # Stopped cleanly: the store is closed and nothing is left to do but free the state object by
    # object, which took the interpreter 6.6 s after a series flood (a million series). The
    # process ends here instead; the output is flushed first.
    _exit_now("")
