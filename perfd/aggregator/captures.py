"""Rules → capture commands, on the aggregator.

Every ``interval_s`` the rule engine evaluates each job's latest numbers (job scope), per-rank
numbers (rank scope) and GPU numbers (gpu scope). A firing capture rule becomes a ``capture``
command to the agents that host the target ranks; alerts and firings become events. The same path
serves captures asked for by hand (`perfd capture`, POST /api/captures) and by Alertmanager (its
webhook), so cooldowns, rate limits and "one capture per process" hold whoever asks.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from perfd.aggregator import rule_scopes
from perfd.aggregator.capture_ranks import RanksRefused, checked_ranks, ranks_of_label
from perfd.aggregator.capture_ready import ReadyGate
from perfd.aggregator.capture_records import CaptureRecord, CaptureResult, Decided, arming_of, record_bytes
from perfd.aggregator.job_rows import job_rows
from perfd.aggregator.snapshot import Analysed, JobSnapshot, latest_of_running
from perfd.aggregator.state_readers import CaptureState
from perfd.analytics.advice.capture_findings import CaptureDiagnosis, diagnose_capture, steady_compute_ms
from perfd.analytics.advice.remedies import Framework
from perfd.analytics.breakdown.bottleneck import BottleneckClass
from perfd.analytics.breakdown.budget import NO_FLOPS, NO_TIMERS
from perfd.analytics.breakdown.capture_match import check as check_capture
from perfd.analytics.breakdown.capture_match import finding as capture_finding
from perfd.analytics.breakdown.capture_match import job_facts
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.analytics.breakdown.job_budget import contexts
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.analytics.steps.flops import flops_split
from perfd.analytics.steps.liveness import ENDED, RUNNING
from perfd.core import catalog
from perfd.core import limits as L
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.core.events import CAPTURE_PROGRESS, RULE_FIRING
from perfd.core.model import (
    CAPTURE_TOOLS,
    CPU,
    CaptureFailure,
    CaptureStatus,
    CaptureTool,
    capture_tool,
    kineto_iterations_per_step,
)
from perfd.core.refusals import Refusals
from perfd.core.typed import obj
from perfd.report.grade_text import worded, worded_recommendation
from perfd.rules.evaluator import CaptureArbiter, Firing, RuleEngine, ScopeKey, TargetWait, job_of
from perfd.rules.rule_types import CaptureAction, CaptureTargets, Rule
from perfd.transport.codec import Command

log = logging.getLogger(__name__)

SendCommand = Callable[[str, Command], bool]
STALE_CAPTURE_S = 600.0  # a capture nobody reported on releases its processes after this


class CaptureRateLimited(Exception):
    """Too many capture requests for one job (perfd.core.limits.CAPTURE_REQUESTS_PER_JOB)."""


MAX_INCIDENT_RANKS = 4  # ranks one incident capture takes at most
CPU_ONLY_SKIP = ("the job computes on CPUs only (no CUDA): a capture divides GPU time, and there is none "
                 "to divide; its host side is in the rank's host evidence and stacks (name a tool to trace "
                 "its CPU ops anyway: perfd capture --tool kineto)")


class CaptureCoordinator:
    def __init__(self, state: CaptureState, engine: RuleEngine | None, send: SendCommand,
                 interval_s: float = 5.0, *, limits: L.Limits | None = None,
                 refusals: Refusals | None = None,
                 hosts: Callable[[str], set[str]] | None = None,
                 clock: Clock = REAL_CLOCK) -> None:
        self.state = state
        # "now" for the rules, a request and an agent's report (the rules' retry pauses count from it)
        self.clock = clock
        self.limits = limits if limits is not None else L.Limits()
        self.refusals = refusals if refusals is not None else Refusals()
        # The agents hosting a job (perfd.aggregator.guard): the only ones a capture command goes
        # to. None: every agent the state saw for the job (a coordinator without a guard).
        self.hosts = hosts
        self._requests: dict[str, deque[float]] = {}  # job -> times of recent requests
        self.engine = engine
        self.send = send
        self.interval_s = interval_s
        self.arbiter = engine.arbiter if engine is not None else CaptureArbiter()
        if engine is not None:
            engine.resolve_targets = self._resolve_targets
            engine.ready = self._ready
        self.ready = ReadyGate(self._snapshot, state.hook_seen)  # rules wait for a ready target
        # The capture records, the state's (its analyses read the copies it publishes): written here,
        # inside the book's writing() (the HTTP threads, the rules tick and the agents' reports all
        # come here), never read by anyone else under its lock (perfd/aggregator/capture_book.py).
        self.book = state.capture_book
        self.captures = self.book.records
        self._firing_of: dict[str, Firing | tuple[str, tuple[int, ...] | None]] = {}
        self.evaluations = 0
        self.firings_total = 0
        state.add_event_listener(self.on_event)  # capture progress reported by the agents

    def forget_job(self, job: str) -> None:
        """The job was pruned (perfd.aggregator.retention): its request window and its rules' states
        and budgets go; its capture records stay, as history, within MAX_CAPTURE_RECORDS."""
        with self.book.lock:  # no record changes: nothing to publish
            self._requests.pop(job, None)
        self.ready.forget_job(job)
        if self.engine is not None:
            self.engine.forget_job(job)

    # ---- targets ---------------------------------------------------------------------------
    def _snapshot(self, job: str) -> JobSnapshot | None:
        """The job's snapshot with its analysis current (recomputed here if new data arrived,
        rate-limited: the rules read what the tick's refresh just analysed)."""
        return self.state.snapshot(job, Analysed.CURRENT)

    def slowest_rank(self, job: str) -> int | None:
        """The latest analysed iteration's slowest rank: the highest compute ratio, else the rank the
        round trips name. Two columns of the run table's last row, read where they are kept (a
        capture request needs no whole row built)."""
        snap = self._snapshot(job)
        its = snap.iterations if snap is not None else None
        if its is None:
            return None
        last = len(its) - 1
        ratios: Mapping[int, float] = its.get(last, "straggler_rank_compute_ratio")
        if ratios:
            return max(ratios, key=lambda r: ratios[r])
        rank: int | None = its.get(last, "straggler_rtt_max_rank")
        return rank

    def incident_ranks(self, job: str) -> tuple[int, ...]:
        """For each open incident of the job, the costliest first: the rank its verdict blames, else
        the ranks it names (at most MAX_INCIDENT_RANKS: a capture of every rank of a large job is not
        what an incident needs)."""
        out: list[int] = []
        snap = self.state.snapshot(job)
        recs = [r.incident for r in snap.open_incidents()] if snap is not None else []
        for inc in sorted(recs, key=lambda i: -(i.cost_s or 0.0)):
            blamed = inc.verdict.rank if inc.verdict is not None else None
            for r in [blamed] if blamed is not None else inc.ranks:
                if r not in out:
                    out.append(r)
        return tuple(out[:MAX_INCIDENT_RANKS])

    def _resolve_targets(self, job: str, key: object, targets: CaptureTargets,
                         values: Mapping[str, float | None]) -> tuple[int, ...] | None:
        if targets.ranks is not None:
            return tuple(targets.ranks)
        if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int):
            return (key[1],)  # a rank-scope firing targets the rank that fired
        if targets.incident_ranks:
            named = self.incident_ranks(job)
            if named:
                return named
        if targets.slowest_rank or targets.incident_ranks:  # an incident naming no rank: the slowest
            r = self.slowest_rank(job)
            return (r,) if r is not None else None
        snap = self._snapshot(job) if targets.pp_stage is not None else self.state.snapshot(job)
        placed = snap.placed_ranks if snap is not None else {}
        if targets.node is not None:
            ranks = tuple(sorted(r for r, p in placed.items() if p.node == targets.node))
            return ranks or None
        if targets.pp_stage is not None:
            a = snap.analysis if snap is not None else None
            pp, world = (a.job.layout.pp, a.job.layout.world_size) if a is not None else (None, None)
            if pp and world:
                per_stage = world // pp  # Megatron's default order puts pp outermost
                lo = targets.pp_stage * per_stage
                return tuple(range(lo, lo + per_stage))
        return None  # the whole job

    # ---- readiness -------------------------------------------------------------------------
    def _ready(self, rule: Rule, key: ScopeKey, action: CaptureAction, ranks: tuple[int, ...] | None,
               now: float) -> TargetWait | None:
        """The engine's readiness check (perfd.aggregator.capture_ready)."""
        return self.ready.wait(rule.name, job_of(key), action, ranks, now)

    def _not_ready(self, rec: CaptureRecord, now: float) -> None:
        """A capture's agent said its target was not ready: the rule that asked for it gets its budget
        back (no cooldown) and asks again after a pause (called with the lock held)."""
        f = self._firing_of.get(rec.id)
        if not isinstance(f, Firing) or self.engine is None:
            return
        self.engine.refund(f)
        pause = self.ready.not_ready(f.rule.name, f.job, now)
        log.info("capture %s for job %s (%s): its target was not ready (%s); asked again in %.0f s, no "
                 "cooldown taken", rec.id, rec.job, rec.origin, rec.reason[:200], pause)

    # ---- evaluation ------------------------------------------------------------------------
    def scope_values(self, now: float | None = None) -> dict[ScopeKey, dict[str, float | None]]:
        """What the rules read: every job series /metrics exports, by scope, for each job that has
        not ended (perfd.aggregator.rule_scopes); GPU series only where some rule reads them."""
        now = self.clock.time() if now is None else now
        first = [s for j in self.state.job_names() if (s := self.state.snapshot(j)) is not None]
        ended = {s.job for s in first if s.state_at(now)[0] == ENDED}
        for s in first:  # a running job's analysis current before the rules read it (rate-limited)
            if s.state_at(now)[0] == RUNNING:
                self._snapshot(s.job)
        snaps = [s for j in (s.job for s in first) if (s := self.state.snapshot(j)) is not None]
        latest = latest_of_running(snaps, now)  # /metrics' derived gauges: running jobs only
        out: dict[ScopeKey, dict[str, float | None]] = {}
        rule_scopes.add_rows(out, job_rows(self.state, snaps, latest, now), ended)
        for job in latest:  # every job metric is a key; an absent one is None (a rule on it stays pending)
            vals = out.setdefault(job, {})
            for m in catalog.job_metrics():
                vals.setdefault(m.name, None)
        if self.engine is not None:
            live = [s for s in snaps if s.job not in ended]  # a job that ended has no scope
            rule_scopes.add_gpu_values(out, live, self.engine.reads("gpu"), self.engine.reads("rank"))
            rule_scopes.add_rank_host_values(out, live, self.engine.reads("rank"))
        return out

    def evaluate(self, now: float | None = None) -> list[Firing]:
        if self.engine is None:
            return []
        t = self.clock.time() if now is None else now
        self._expire(t)
        # The rules' inputs before the book's lock: they have running jobs analysed (seconds for a big
        # job), which an agent's capture report, taken under the lock, need not wait for.
        values = self.scope_values()  # as of the clock: a ``now`` given moves the rules' time only
        # The lock alone: a tick that makes no record publishes none (a copy of every record a tick).
        with self.book.lock:
            firings = self.engine.evaluate(t, values, self._disk_used())
            self.evaluations += 1
            for f in firings:
                if f.new:
                    self.firings_total += 1
                    self.state.ingest_events("aggregator", [{
                        "kind": RULE_FIRING.name, "severity": f.severity, "job": f.job, "time": t,
                        "text": f"rule {f.rule.name} firing: {f.annotations.summary or f.rule.expr.text}",
                        "labels": {**f.labels, "rule": f.rule.name}, "payload": f.to_dict()}])
                if f.capture_allowed and isinstance(f.action, CaptureAction):
                    with self.book.writing():
                        ranks = list(f.ranks) if f.ranks is not None else None
                        origin = f"rule:{f.rule.name}"
                        a = f.action
                        skip = a.tool == "auto" and self._cpu_only(f.job)  # perfd picks: none fits
                        rec = (self._skip_cpu_only(f.job, ranks, a.tool, a.steps, origin, t) if skip
                               else self._dispatch(f.job, ranks, a.tool, a.steps, origin, t, a.stack))
                        self._firing_of[rec.id] = f
                        if not rec.status.live:  # never sent, or the sending failed
                            self._release(rec.id)
        return firings

    # ---- requests by hand or by Alertmanager -------------------------------------------------
    def request(self, job: str, ranks: object, tool: str, steps: int, origin: str,
                now: float | None = None, stack: bool = False) -> CaptureRecord:
        """A capture not from our own rules: still one capture per process at a time. ``ranks`` as the
        request gave them (perfd.aggregator.capture_ranks checks them; None: every rank)."""
        t = self.clock.time() if now is None else now
        named = capture_tool(tool)
        if named is None:
            raise ValueError(f"tool must be one of {', '.join(CAPTURE_TOOLS)}, got {tool[:40]!r}")
        if len(job.encode()) > L.MAX_JOB_NAME_BYTES:  # no job has it; its record would hold it
            self.refusals.refuse(L.REFUSED_LABELS, f"capture request ({origin[:64]}) for a job name of "
                                 f"{len(job.encode())} bytes; cap {L.MAX_JOB_NAME_BYTES}")
            raise ValueError(f"a job name is at most {L.MAX_JOB_NAME_BYTES} bytes")
        try:  # before the rate window: a refused request takes no turn of the job's
            rk = checked_ranks(ranks, self._world_size(job))
        except RanksRefused as exc:
            self.refusals.refuse(L.REFUSED_CAPTURE_RANKS, f"capture request for job {job[:64]!r} "
                                 f"({origin[:64]}): {exc}")
            raise
        if steps < 1:
            raise ValueError("steps must be >= 1")
        if steps > self.limits.max_capture_steps:
            shown = str(steps) if steps < 10**12 else f"~2^{steps.bit_length()}"  # a client's number: cut
            self.refusals.refuse(L.REFUSED_CAPTURE_STEPS, f"capture of {shown} steps for job {job[:64]!r} "
                                 f"({origin}); cap {self.limits.max_capture_steps}")
            raise ValueError(f"steps must be <= {self.limits.max_capture_steps}")
        with self.book.writing():
            recent = self._requests.setdefault(job, deque())
            while recent and t - recent[0] > self.limits.capture_rate_window_s:
                recent.popleft()
            if len(recent) >= self.limits.capture_requests_per_job:
                self.refusals.refuse(L.REFUSED_CAPTURE_RATE, f"capture request for job {job[:64]!r} "
                                     f"({origin}): {len(recent)} in the last "
                                     f"{self.limits.capture_rate_window_s:g} s")
                raise CaptureRateLimited(
                    f"at most {self.limits.capture_requests_per_job} capture requests per job every "
                    f"{self.limits.capture_rate_window_s:g} s")
            recent.append(t)
            if len(self._requests) > self.limits.max_jobs:  # jobs come and go: forget idle ones
                window = self.limits.capture_rate_window_s
                for j in [j for j, d in self._requests.items() if not d or t - d[-1] > window]:
                    del self._requests[j]
            if not self.arbiter.try_acquire(job, rk):
                rec = CaptureRecord(uuid.uuid4().hex[:12], job, list(rk) if rk else None, named, steps,
                                    origin, t, status=CaptureStatus.REFUSED,
                                    reason="busy: a capture is running on these processes", updated_at=t)
                self._keep(rec)
                return rec
            rec = self._dispatch(job, list(rk) if rk else None, named, steps, origin, t, stack)
            self._firing_of[rec.id] = (job, rk)
            if not rec.status.live:  # sent to no agent (or the sending failed): its ranks are free
                self._release(rec.id)
            return rec

    def _world_size(self, job: str) -> int | None:
        """The world size the job states (its job info, within perfd.core.bounds), else None."""
        info = self.state.job_info(job)
        return info.layout.world_size if info is not None else None

    # ---- bookkeeping -----------------------------------------------------------------------
    def _cpu_only(self, job: str) -> bool:
        """The job computes on CPUs (perfd.core.model.JobInfo.device, from its step hook)."""
        snap = self._snapshot(job)
        a = snap.analysis if snap is not None else None
        return a is not None and a.job.device == CPU

    def _skip_cpu_only(self, job: str, ranks: list[int] | None, tool: CaptureTool, steps: int, origin: str,
                       t: float) -> CaptureRecord:
        """A rule's ``tool: auto`` capture of a CPU-only job, not sent: perfd picks the tool, and none
        fits — each times GPU work (the step budget divides the GPU's timeline), a CPU-only job has
        none, so the trace would cost the job its profiler's overhead and give ``budget: null``
        (the default incident_capture rule once ran torch.profiler inside such jobs). Its host
        side is the rank's host evidence (collectors/ranks) and its stacks. A rule or a person naming
        a tool still gets it (its CPU ops are a trace to read, not a budget)."""
        rec = CaptureRecord(uuid.uuid4().hex[:12], job, ranks, tool, steps, origin, t,
                            status=CaptureStatus.SKIPPED, reason=CPU_ONLY_SKIP, updated_at=t)
        self._keep(rec)
        log.info("capture %s for job %s (%s) skipped: the job computes on CPUs only", rec.id, job, origin)
        return rec

    def _dispatch(self, job: str, ranks: list[int] | None, tool: CaptureTool, steps: int, origin: str,
                  t: float, stack: bool = False) -> CaptureRecord:
        rec = CaptureRecord(uuid.uuid4().hex[:12], job, ranks, tool, steps, origin, t, updated_at=t,
                            stack=stack)
        agents = self._agents_for(job, ranks)
        # Kineto counts optimizer steps; how many make a training step is the job's framework's to say
        info = self.state.job_info(job)
        per_step = {"iterations_per_step": str(kineto_iterations_per_step(info))} if info is not None else {}
        cmd = Command(kind="capture", job=job, ranks=tuple(ranks or ()), id=rec.id,
                      args={"tool": tool, "steps": str(steps), "start_iteration": "next",
                            "origin": origin, **({"stack": "1"} if stack else {}), **per_step})
        failed: list[str] = []
        for agent in agents:
            try:
                if self.send(agent, cmd):
                    rec.agents.append(agent)
            except Exception as exc:  # whatever the sender raises ends this record, never its caller
                failed.append(f"{agent[:64]}: {type(exc).__name__}: {str(exc)[:200]}")
                log.exception("capture %s for job %s: sending its command to agent %s failed", rec.id,
                              job[:64], agent[:64])
        if not rec.agents and failed:  # failed, never left requested: its ranks are released
            rec.status = CaptureStatus.FAILED
            rec.reason = f"the command could not be sent ({'; '.join(failed)})"
            rec.finished_at = t
        elif not rec.agents:
            rec.status, rec.reason = CaptureStatus.UNDELIVERABLE, (
                "no connected agent hosts the job" if not agents else "agents not connected")
        self._keep(rec)
        log.info("capture %s for job %s ranks %s (%s) -> agents %s: %s", rec.id, job, ranks, origin,
                 rec.agents, rec.status)
        return rec

    def _keep(self, rec: CaptureRecord) -> None:
        """Store a record, within the records' caps (:meth:`_prune`)."""
        self.captures[rec.id] = rec
        self._prune()

    def _prune(self) -> None:
        """Beyond max_capture_records records, or max_capture_record_bytes of what they hold, the oldest
        ended ones go first (those still running are kept: their agents will report on them)."""
        over = len(self.captures) - self.limits.max_capture_records
        size = sum(record_bytes(r) for r in self.captures.values())
        if over <= 0 and size <= self.limits.max_capture_record_bytes:
            return
        ended = sorted((r for r in self.captures.values() if not r.status.live), key=lambda r: r.requested_at)
        for r in ended:
            if over <= 0 and size <= self.limits.max_capture_record_bytes:
                break
            del self.captures[r.id]
            self._firing_of.pop(r.id, None)
            over, size = over - 1, size - record_bytes(r)

    def _agents_for(self, job: str, ranks: list[int] | None) -> list[str]:
        """Agents whose node hosts a target rank; every host of the job when placement is unknown
        (each agent captures only the ranks it hosts). Never an agent that does not host the job.
        An agent's node: where the GPU processes it reports run, else the node its Hello named (a
        job's sidecar reads no GPU: its ranks are placed by the node's agent)."""
        snap = self.state.snapshot(job)
        placed = snap.placed_ranks if snap is not None else {}
        if self.hosts is not None:
            agents_all = sorted(self.hosts(job))
        else:
            agents_all = sorted(self.state.job_agents(job))
        if not ranks or not placed:
            return agents_all
        nodes = {placed[r].node for r in ranks if r in placed}
        node_of = self.state.agent_nodes(agents_all)
        chosen = sorted({a for a, n in node_of.items() if n in nodes and a in agents_all})
        return chosen or agents_all

    def on_event(self, ev: Mapping[str, object]) -> None:
        """Capture progress reported by an agent (capture_started/finished/failed): taken only from
        an agent the capture was sent to (another's is refused and counted, ``not_target``: a
        stranger naming a capture's id once turned it from failed into finished with its own
        result)."""
        kind = str(ev.get("kind", ""))
        if kind not in CAPTURE_PROGRESS:
            return
        links = obj(ev.get("links"))
        sender = str(ev.get("agent") or "")
        with self.book.writing():
            rec = None
            for key in ("command_id", "capture_id"):  # agents name our request by command_id
                cid = links.get(key)
                if cid and str(cid) in self.captures:
                    rec = self.captures[str(cid)]
                    break
            if rec is None:
                return
            if sender not in rec.agents:
                self.refusals.refuse(L.REFUSED_NOT_TARGET, f"{kind} for capture {rec.id} from agent "
                                     f"{sender[:64]}, which it was not sent to", agent=sender)
                return
            if links.get("capture_id") and links.get("capture_id") != rec.id:
                rec.agent_capture_ids = sorted({*rec.agent_capture_ids, str(links["capture_id"])})
            now = self.clock.time()
            t = ev.get("time")
            at = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else now
            rec.updated_at = now
            rec.status = CAPTURE_PROGRESS[kind]
            rec.reason = str(ev.get("text", ""))
            if rec.status is CaptureStatus.STARTED and rec.started_at is None:
                rec.started_at = at
            elif rec.status.ended:
                rec.finished_at = at
                # a capture that failed before it started ran at no time
                if rec.status is CaptureStatus.FINISHED:
                    rec.started_at = rec.started_at or at
            result = CaptureResult.of(ev.get("payload")) if ev.get("payload") is not None else None
            if result is not None:
                rec.result = result
                if result.range_held_s is not None:
                    rec.range_held_s = result.range_held_s
                if rec.decided is not None:  # what decided the class, as this report has it
                    rec.decided = rec.decided.of_result(result)
                if rec.status is CaptureStatus.FINISHED:
                    self._diagnose(rec)
                if rec.status.ended:
                    rec.arming = arming_of([rec], self.state.records_and_layout, self.state.capture_windows)
            cause = result.cause if result is not None else None
            if rec.status.ended:
                rec.cause = cause if rec.status is not CaptureStatus.FINISHED else None
                f = self._firing_of.get(rec.id)
                if cause is CaptureFailure.NOT_READY and rec.status is not CaptureStatus.FINISHED:
                    self._not_ready(rec, self.clock.time())
                elif isinstance(f, Firing):
                    self.ready.ran(f.rule.name, f.job)
            if rec.status.ended:
                self._release(rec.id)
                self._prune()  # its result and text now count (after the release: its firing is done)

    def _diagnose(self, rec: CaptureRecord) -> None:
        """The capture's step budget, class, findings and remedies, in the job's context (framework,
        FLOPs, steady timers) and against its steady compute per iteration where the timers give it
        (called with the lock held; the analysis is cached, not recomputed here). The (rank, device)
        whose budget decided the class is kept (``decided``): the job's analysis reads its breakdown."""
        if rec.result is None:
            return
        ranks = rec.result.ranks
        snap = self.state.snapshot(rec.job)
        a = snap.analysis if snap is not None else None
        got = self.state.records_and_layout(rec.job)
        steady = a.steady.iterations if a is not None else []
        framework = Framework.of(a.job.framework if a is not None else None)
        fl, timers = (contexts(a.summary.medians, a.peak, a.job.layout.pp, a.flops,
                               flops_split(a.flops, a.job.model, a.job.framework_version,
                                           a.job.framework or "megatron"))
                      if a is not None else (NO_FLOPS, NO_TIMERS))
        findings: list[Finding] = []
        recs: list[Recommendation] = []
        # (top class share, rank, device, diagnosis, the rank's devices)
        best: tuple[float, str, int, CaptureDiagnosis, tuple[DeviceBreakdown, ...]] | None = None
        for rank, part in sorted(ranks.items()):
            devices = part.devices
            if devices is None:
                continue
            r = int(rank) if str(rank).isdigit() else None
            base = steady_compute_ms(got[0], steady, r) if got is not None else None
            d = diagnose_capture(devices, label=f"capture {rec.id} rank {rank}", iterations=rec.steps,
                                 steady_compute_ms=base, framework=framework, flops=fl, timers=timers,
                                 config=a.config if a is not None else None)
            # worded here: the capture's record keeps and serves its findings as they read
            findings += [worded(f) for f in d.findings]
            recs += [worded_recommendation(r) for r in d.recommendations]
            if d.bottleneck is not BottleneckClass.UNKNOWN and d.class_shares:
                top = max(d.class_shares.values())
                if best is None or top > best[0]:
                    dev = max(d.budgets, key=lambda k: d.budgets[k].step_ms)
                    best = (top, str(rank), dev, d, devices)
            if d.slowdown:
                rec.slowdown[str(rank)] = max(d.slowdown.values())
        rec.findings, rec.recommendations = findings, recs
        info = self.state.job_info(rec.job)
        if a is not None and info is not None:
            facts = job_facts(info, a.summary.medians, a.peak.peak_tflops, a.job.layout.world_size)
            order = sorted(ranks, key=lambda r: (best is None or str(r) != best[1], str(r)))
            for rank in order:
                devices = ranks[rank].devices
                if devices is None:
                    continue
                m = check_capture(f"{rec.id} rank {rank}", devices, facts, float(rec.steps))
                rec.match = m
                said = capture_finding(m, False, f"capture {rec.id} rank {rank}")
                if said is not None:
                    rec.findings.append(worded(said))
                break
        if best is not None:
            _top, rank, dev, d, devices = best
            rec.bottleneck, rec.basis = d.bottleneck, d.basis
            rec.decided = Decided(rank, dev, devices)
            rec.budget = d.budgets[dev]

    def _release(self, cid: str) -> None:
        f = self._firing_of.pop(cid, None)
        if isinstance(f, Firing) and self.engine is not None:
            self.engine.capture_finished(f)
        elif isinstance(f, tuple):
            self.arbiter.release(f[0], f[1])

    def _expire(self, now: float) -> None:
        with self.book.lock:  # every rules tick: published only where a record expires
            stale = [cid for cid, rec in self.captures.items()
                     if rec.status.live and now - rec.requested_at > STALE_CAPTURE_S]
            if not stale:
                return
        with self.book.writing():
            for cid in stale:
                rec = self.captures.get(cid)
                if rec is not None and rec.status.live:
                    rec.status, rec.reason = CaptureStatus.FAILED, "no report from the agent"
                    rec.updated_at = now
                    self._release(cid)

    def _disk_used(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for rec in self.captures.values():
            size = rec.result.artifact_bytes if rec.result is not None else None
            if size is not None:
                used[rec.job] = used.get(rec.job, 0) + size
        return used

    def list(self) -> list[dict[str, Any]]:
        """Every record as of the last change's end (no lock: a scrape never waits on a diagnosis)."""
        return [r.to_json() for r in sorted(self.book.published(), key=lambda r: r.requested_at)]


# The label an alert must carry, with this value, to ask for a capture through the webhook: an
# Alertmanager route that sends every alert here (a catch-all receiver, a copied route without the
# matcher) must not turn each firing job alert into a profiler run.
CAPTURE_LABEL = "perfd_capture"
CAPTURE_LABEL_VALUE = "true"


def alertmanager_plan(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Capture requests from an Alertmanager webhook body (version 4), and how many firing alerts
    asked for none because they lack ``perfd_capture="true"``. A firing alert asks for a capture
    when it carries ``perfd_capture="true"`` and names a job (label ``job_name``); ``perfd_tool``,
    ``perfd_steps`` and ``rank`` (or ``perfd_ranks``: "0,3") refine it. Resolved alerts ask for
    nothing."""
    out: list[dict[str, Any]] = []
    unmarked = 0
    alerts = body.get("alerts") or []
    if not isinstance(alerts, list):
        raise ValueError("'alerts' must be a list")
    for alert in alerts:
        if not isinstance(alert, Mapping) or alert.get("status") != "firing":
            continue
        labels = alert.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise ValueError("an alert's 'labels' must be an object")
        if str(labels.get(CAPTURE_LABEL, "")).lower() != CAPTURE_LABEL_VALUE:
            unmarked += 1
            continue
        job = labels.get("job_name")
        if not job:
            continue
        ranks_text = labels.get("perfd_ranks") or labels.get("rank")
        # checked by the request (perfd.aggregator.capture_ranks): a rank that is not one is refused
        # by name, never dropped (a label of none read became a capture of every rank)
        ranks = ranks_of_label(str(ranks_text)) if ranks_text else None
        steps_text = str(labels.get("perfd_steps", "3"))
        alertname = str(labels.get("alertname", "?"))[:L.MAX_LABEL_VALUE_BYTES]  # kept in its record
        out.append({"job": str(job), "ranks": ranks or None, "tool": str(labels.get("perfd_tool", "auto")),
                    "steps": int(steps_text) if steps_text.isdigit() and len(steps_text) < 9 else 3,
                    "origin": f"alertmanager:{alertname}"})
    return out, unmarked


def alertmanager_requests(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The capture requests of alertmanager_plan, without the count of unmarked alerts."""
    return alertmanager_plan(body)[0]
