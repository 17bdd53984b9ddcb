"""The job store: each job's info, step records, agents and the cached analysis of its run.

Ingest (the gRPC event loop) and readers (the HTTP thread, the rules loop) meet here, so every
access goes through one lock. Ingest does no analysis: a job is marked dirty and its analysis is
recomputed on the next read, at most every ``min_recompute_s`` (a busy job is not re-analysed once
per batch), and outside the lock so that ingest never waits for it.

What one record may cost: a record implausibly ahead — beyond its run's
train-iters, or more than perfd.core.limits.MAX_ITERATION_LEAP past the newest iteration held — is refused
(the caller counts and logs it), never held; retention drops the *lowest* iterations held, so no
record, however far ahead, sets a watermark below which later ones are dropped. A restarted run is a
new run: its first record (``first_of_run``, or a rank whose hook now reports from another process)
drops what the old run held from that iteration on, so the new run's records replace the old run's
and are never refused as duplicates of them. Every retention drop is counted and logged, one line per
job and minute with the counts (:meth:`JobStore.log_retention`).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import sys
import threading
from collections.abc import Collection, Sequence

from perfd.aggregator.job_fold import job_info_of, job_level_steps, mark_disturbed
from perfd.aggregator.job_inputs import NO_INPUTS, AnalysisInputs, Standing
from perfd.aggregator.job_runs import close_run, digest_runs, figures_span, late_start, of_ended_run, run_mark
from perfd.aggregator.job_state import JobOverview, JobState, JobStats, StepConflicts
from perfd.aggregator.step_histogram import STEP_BUCKETS_S, slowest_step_s
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.run.runs import MAX_DIGESTS
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.core.limits import MAX_ITERATION_LEAP, REFUSAL_LOG_INTERVAL_S, RETAIN_BYTES, RETAIN_ITERATIONS
from perfd.core.model import JobInfo, ParallelLayout, StepRecord, merge_job_info
from perfd.core.stepfold import ALL_RANKS

__all__ = ["NO_INPUTS", "AnalysisInputs", "JobState", "JobStats", "JobStore", "Standing", "StepConflicts",
           "job_info_of", "job_level_steps", "mark_disturbed", "record_bytes", "worse_than"]

log = logging.getLogger(__name__)
# A job's step records, its parallel layout (None: no job info yet) and its GPU's name
RecordsLayout = tuple[list[StepRecord], ParallelLayout | None, str | None]

# Retention of each job's step records: perfd.core.limits (RETAIN_ITERATIONS, RETAIN_BYTES). The oldest
# iteration goes first, in O(1); the newest is always kept.


_MAX_RUN_MARKS = 1 << 16  # rank scopes whose hook pid a job remembers (a job's ranks; more: forgotten)
_PREDECESSOR_PROBES = 8  # held iterations below a conflicting one looked at for its rank scope
_ENTRY_BYTES = 40  # one slot of a dict, amortised (tracemalloc: 200 fields held 6.6 KB of dict)
_RANK_MEMORY_BYTES = 232  # one rank's memory report: its dict ...
_MEMORY_VALUE_BYTES = 100  # ... and each value in it


def record_bytes(rec: StepRecord) -> int:
    """Estimated memory of a held record: measured with tracemalloc on parsed Megatron-LM records
    (~83 bytes per per-rank timer value, ~1 KB for the rest), plus what its strings hold — the raw
    key/value fields, the timer names — by ``sys.getsizeof`` (1,500 records with one 100 KB field
    each held 150 MB that the estimate once did not see). Cheap at ingest: no
    string is walked."""
    per_rank = sum(len(tv.per_rank) for tv in rec.timers.values())
    fields = sum(sys.getsizeof(k) + sys.getsizeof(v) + _ENTRY_BYTES for k, v in rec.fields.items())
    names = sum(sys.getsizeof(n) for n in rec.timers)
    memory = sum(_RANK_MEMORY_BYTES + _MEMORY_VALUE_BYTES * len(v) for v in rec.memory_mb.values())
    return 1024 + 256 * len(rec.timers) + 96 * (per_rank + len(rec.rank_end_times)) + fields + names + memory


# The optional fields of a step record whose absence makes a copy of a held record worse (a field
# a bit flip made unparseable comes through as absent, never as a wrong zero: docs/design.md §2). The step
# hook's counts are not among them: like the raw fields they once travelled in, a copy is not judged
# by them.
_OPTIONAL = tuple(f.name for f in dataclasses.fields(StepRecord)
                  if f.name not in ("job", "iteration", "rank", "fields", "timers", "memory_mb", "source",
                                    "disturbed_by_capture", "first_of_run", "armed", "tokens_per_step",
                                    "flops_per_step", "rank_end_times"))


def worse_than(new: StepRecord, held: StepRecord) -> bool:
    """Whether ``new`` lacks something ``held`` has: a value, a timer, a rank's memory report or end."""
    return (any(getattr(held, f) is not None and getattr(new, f) is None for f in _OPTIONAL)
            or not held.timers.keys() <= new.timers.keys()
            or not held.memory_mb.keys() <= new.memory_mb.keys()
            or not held.rank_end_times.keys() <= new.rank_end_times.keys())


class JobStore:
    def __init__(self, max_iterations_per_job: int = RETAIN_ITERATIONS, min_recompute_s: float = 0.5,
                 gpu_override: str | None = None, peak_tflops: float | None = None,
                 max_bytes_per_job: int = RETAIN_BYTES, standing: Standing | None = None,
                 clock: Clock = REAL_CLOCK) -> None:
        """``standing``: (job, agent) -> its standing as a writer of the job
        (perfd.aggregator.guard.Guard.standing; none given: every agent's is 0); ``clock``: when
        records arrive, and how old the last one is."""
        self.clock = clock
        self._lock = threading.Lock()
        self.max_bytes = max_bytes_per_job
        self.jobs: dict[str, JobState] = {}
        self.agent_job: dict[str, str] = {}  # agent -> the job it last said it serves
        self.stats = JobStats()
        self.max_iterations = max_iterations_per_job
        self.min_recompute_s = min_recompute_s
        self.gpu_override = gpu_override
        self.peak_tflops = peak_tflops
        self._standing: Standing = standing if standing is not None else (lambda job, agent: 0)

    def _job(self, name: str) -> JobState:
        js = self.jobs.get(name)
        if js is None:
            js = self.jobs[name] = JobState(name)
        return js

    # ---- ingest ------------------------------------------------------------------------------
    def hello(self, agent_id: str, jobs: Sequence[str], now: float | None = None) -> None:
        with self._lock:
            for j in jobs:
                js = self._job(j)
                js.agents.add(agent_id)
                js.touched_at = now if now is not None else self.clock.time()
                self.agent_job[agent_id] = j

    def add_agent(self, job: str, agent_id: str) -> None:
        with self._lock:
            self._job(job).agents.add(agent_id)

    def note_gpu_model(self, agent_id: str, model: str) -> None:
        """The GPU model an agent's NVML series name: the job's GPU for the peak table."""
        with self._lock:
            job = self.agent_job.get(agent_id)
            if job:
                self._job(job).gpu_name = model

    def set_gpu_model(self, job: str, model: str) -> None:
        """The GPU model of a job's GPUs as another agent reports them (perfd.core.placement); only for a
        job that exists (placement never creates one)."""
        with self._lock:
            js = self.jobs.get(job)
            if js is not None:
                js.gpu_name = model

    def ingest_job_info(self, agent_id: str, job: str, info: JobInfo, now: float | None = None) -> None:
        with self._lock:
            js = self._job(job)
            js.agents.add(agent_id)
            js.touched_at = now if now is not None else self.clock.time()
            js.job_info, js.job_info_agent = merge_job_info(js.job_info, info), agent_id
            st = js.job_info.started_at
            if js.run_start is None or st is None or st <= js.run_start:  # not a later run's start-up
                js.run_info = js.job_info
            js.dirty = True

    def ingest_steps(self, agent_id: str, steps: Sequence[StepRecord], now: float | None = None
                     ) -> StepConflicts:
        """Hold the records (a held one is replaced only by its own agent, and not by a worse
        copy — unless a new run begins there); returns what was kept out, for the caller to count
        and report. ``now``: when they arrived (a replay from the state store gives the time they
        first did)."""
        out = StepConflicts()
        arrived = now if now is not None else self.clock.time()
        lowest: dict[str, int] = {}  # job -> the lowest iteration of its records in this batch
        for rec in steps:
            if rec.iteration < lowest.get(rec.job, rec.iteration + 1):
                lowest[rec.job] = rec.iteration
        with self._lock:
            self.stats.steps += len(steps)
            # Plausibility per batch: each job's records are judged against what it held *before* the
            # batch (its progress: JobState.progress_of; for a job holding none, the batch's lowest),
            # never against each other — a ladder of records each MAX_ITERATION_LEAP past the one before,
            # in one batch, once evicted a job's every iteration and dropped its next ones;
            # one rung a batch, from a sender no other record corroborates, did too.
            anchors: dict[str, tuple[int, str]] = {}
            for job, low in lowest.items():
                held = self.jobs[job].progress_of(agent_id) if job in self.jobs else None
                anchors[job] = held or (low, "the lowest of its batch (none held)")
            for rec in steps:
                js = self._job(rec.job)
                js.agents.add(agent_id)
                key = (rec.iteration, str(rec.rank))
                why = self._implausible(js, rec, anchors[rec.job])
                if why is not None:
                    self.stats.implausible += 1
                    out.implausible.setdefault(rec.job, []).append((rec.iteration, why))
                    out.refused.add(id(rec))
                    continue
                if of_ended_run(js.ended_pids, rec):
                    self.stats.ended_run_records += 1
                    out.refused.add(id(rec))
                    continue
                if self._new_run(js, rec, key[1]) and js.records:  # nothing held: nothing ends
                    ended = self._close_run(js, key[1], rec)
                    out.ended_runs.setdefault(rec.job, []).append(ended)
                if isinstance(rec.rank, int) and rec.source is not None and rec.source.collector == "hook":
                    if len(js.hook_seen) >= _MAX_RUN_MARKS and rec.rank not in js.hook_seen:
                        js.hook_seen.clear()  # bounded: ranks come from the network
                    js.hook_seen[rec.rank] = (rec.fields.get("pid", ""), arrived)
                if rec.train_iters is not None and rec.train_iters > 0:
                    js.train_iters = rec.train_iters
                old = js.records.get(key)
                holder = js.owner.get(key, agent_id) if old is not None else agent_id
                if old is not None:
                    if holder != agent_id:
                        if not self._outranks(js, key, agent_id, holder):
                            self.stats.conflicts += 1
                            out.other_agent.setdefault((rec.job, holder), []).append(rec.iteration)
                            out.refused.add(id(rec))
                            continue
                        # The held record was written ahead of the job by an agent that does not
                        # continue it (see _outranks): the job's own writer takes the iteration.
                        self.stats.displaced += 1
                        out.displaced.setdefault((rec.job, holder), []).append(rec.iteration)
                    elif worse_than(rec, old):
                        self.stats.worse_duplicates += 1
                        out.worse.setdefault(rec.job, []).append(rec.iteration)
                        out.refused.add(id(rec))
                        continue
                ranked = isinstance(rec.rank, int) or rec.rank == ALL_RANKS
                if ranked and not js.logged:  # counted once the next begins
                    if js.hist_pending is None or rec.iteration > js.hist_pending:
                        done, js.hist_pending = js.hist_pending, rec.iteration
                        step = None if done is None else slowest_step_s(
                            js.records.get((done, sc)) for sc in js.by_iteration.get(done, ()))
                        if step is not None:
                            js.step_hist.observe(step)
                elif not ranked and old is None and rec.step_time_ms is not None \
                        and math.isfinite(rec.step_time_ms) and rec.step_time_ms >= 0:
                    js.step_hist.observe(rec.step_time_ms / 1e3)  # a re-sent record is not counted again
                js.logged = js.logged or not ranked
                if key not in js.records and not isinstance(rec.rank, int):
                    if rec.skipped_iterations is not None:
                        js.skipped_total = (js.skipped_total or 0) + max(0, rec.skipped_iterations)
                    if rec.nan_iterations is not None:
                        js.nan_total = (js.nan_total or 0) + max(0, rec.nan_iterations)
                size = record_bytes(rec)
                if old is None:
                    if rec.iteration not in js.by_iteration:
                        bisect.insort(js.iterations, rec.iteration)
                    js.by_iteration.setdefault(rec.iteration, []).append(key[1])
                else:  # a re-sent or corrected record replaces the held one
                    size -= record_bytes(old)
                if old is None or holder != agent_id:  # who writes the job, and how far (progress_of)
                    js.unhold(holder if old is not None else None)
                    js.hold(agent_id, rec.iteration)
                js.owner[key] = agent_id
                js.records[key] = rec
                if key[1] not in js.run_scopes and len(js.run_scopes) < _MAX_RUN_MARKS:
                    js.run_scopes.add(key[1])
                if rec.end_time is not None and rec.step_time_ms is not None and math.isfinite(rec.end_time):
                    start = rec.end_time - rec.step_time_ms / 1e3
                    js.run_start = start if js.run_start is None else min(js.run_start, start)
                js.held_bytes += size
                js.iteration_bytes[rec.iteration] = js.iteration_bytes.get(rec.iteration, 0) + size
                js.dirty = True
                js.last_step_time = js.touched_at = arrived
                self._retain(js, rec.iteration)
        return out

    def _implausible(self, js: JobState, rec: StepRecord, anchor: tuple[int, str]) -> str | None:
        """Why ``rec``'s iteration cannot be true (lock held), or None: past the train-iters its own
        line or its run states, or more than MAX_ITERATION_LEAP past ``anchor``: (the job's progress
        before this batch as its sender may claim it, JobState.progress_of, or the lowest of the batch
        for a job holding none; what it is)."""
        train = rec.train_iters if rec.train_iters is not None and rec.train_iters > 0 else (
            None if rec.first_of_run else js.train_iters)
        if train is not None and rec.iteration > train:
            return f"past the run's train-iters ({train})"
        base, what = anchor
        if rec.iteration > base + MAX_ITERATION_LEAP:
            return (f"{rec.iteration - base} iterations past {what} ({base}; "
                    f"perfd.core.limits.MAX_ITERATION_LEAP {MAX_ITERATION_LEAP})")
        return None

    @staticmethod
    def _new_run(js: JobState, rec: StepRecord, scope: str) -> bool:
        """Whether ``rec`` begins a new run of its rank scope over what is held (lock held): the
        framework's start-up came before it (``first_of_run``; not a resend of the very record that
        began the run held), the step hook now reports the rank from another process, or the engine's
        root counted a new run of the job (perfd.aggregator.job_runs.run_mark)."""
        pid = run_mark(rec)
        if pid is not None:
            before = js.run_marks.get(scope)
            js.run_marks[scope] = pid
            if len(js.run_marks) > _MAX_RUN_MARKS:
                js.run_marks = {scope: pid}  # bounded: scopes come from the network
            if before is not None and before != pid:
                return True
        if not rec.first_of_run or scope not in js.run_scopes:
            return False  # the first record of its scope in this run (its start-up began the run held)
        held = js.records.get((rec.iteration, scope))
        if held is not None and held.first_of_run and held.end_time == rec.end_time:
            return False
        return not late_start(js, scope, rec)

    def _close_run(self, js: JobState, scope: str, rec: StepRecord) -> int:
        """``rec`` begins a new run (lock held): the old run's records leave for a digest of it
        (perfd.aggregator.job_runs.close_run); counted and logged. Returns the run that ended."""
        ended, n = close_run(js, scope, rec, _MAX_RUN_MARKS)
        self.stats.new_runs += 1
        self.stats.replaced_by_new_run += n
        log.info("job %s: run %d begins at iteration %d (%s): run %d's %d record(s) are replaced by a digest "
                 "of that run", js.name[:80], js.run, rec.iteration, scope, ended, n)
        return ended

    def _retain(self, js: JobState, newest: int) -> None:
        """Keep the window (lock held): past RETAIN_ITERATIONS iterations or RETAIN_BYTES, the
        lowest iteration held goes (never the one just written unless it is the lowest: then it
        arrived older than the window, a drop of its own)."""
        while len(js.by_iteration) > self.max_iterations or (
                js.held_bytes > self.max_bytes and len(js.by_iteration) > 1):
            by_bytes = len(js.by_iteration) <= self.max_iterations
            it = js.iterations.pop(0)
            scopes = js.by_iteration.pop(it, [])
            for scope in scopes:
                js.records.pop((it, scope), None)
                js.unhold(js.owner.pop((it, scope), None))
            js.held_bytes -= js.iteration_bytes.pop(it, 0)
            self.stats.dropped_steps += len(scopes)
            if it == newest:
                self.stats.too_old += len(scopes)
                js.drops[2] += len(scopes)
            else:
                self.stats.evicted_iterations += 1
                self.stats.evicted_iterations_bytes += by_bytes
                js.drops[0] += 1
                js.drops[1] += len(scopes)
            js.evicted_any = True

    def log_retention(self, now: float | None = None, force: bool = False) -> None:
        """One log line per job and REFUSAL_LOG_INTERVAL_S with what retention dropped since the last
        one (records that arrived older than the window at warning level: they are data lost)."""
        now = self.clock.time() if now is None else now
        lines: list[tuple[int, str]] = []
        with self._lock:
            for js in self.jobs.values():
                its, recs, old = js.drops
                if not (its or old) or (not force and now - js.drops_logged_at < REFUSAL_LOG_INTERVAL_S):
                    continue
                js.drops, js.drops_logged_at = [0, 0, 0], now
                if old:
                    lines.append((logging.WARNING, f"job {js.name[:80]}: {old} step record(s) arrived older "
                                  f"than every iteration of its full retention window ({self.max_iterations} "
                                  "iterations, --retain-iterations / --retain-mib) and were dropped"))
                if its:
                    lines.append((logging.INFO, f"job {js.name[:80]}: {its} iteration(s) ({recs} record(s)) "
                                  f"left its retention window (the lowest go first)"))
        for level, text in lines:
            log.log(level, "%s", text)

    def _outranks(self, js: JobState, key: tuple[int, str], sender: str, holder: str) -> bool:
        """Whether ``sender``'s record takes the iteration ``key`` held from ``holder`` (lock held).
        Standing first (perfd.aggregator.guard.Guard.standing: a host a Hello named outranks one that
        only wrote first); at equal standing, the agent that continues the job there — whose record
        of the nearest iteration below in the same rank scope is held — takes it from one that wrote
        it ahead of the job (a stranger that wrote a job's future iterations before the job reached
        them). Otherwise the held record stays (a run restarted on another node from an earlier
        checkpoint keeps the first copy of the iterations it logs again)."""
        s_new, s_old = self._standing(js.name, sender), self._standing(js.name, holder)
        if s_new != s_old:
            return s_new > s_old
        it, scope = key
        i = bisect.bisect_left(js.iterations, it)
        for j in range(i - 1, max(-1, i - 1 - _PREDECESSOR_PROBES), -1):
            prev = js.owner.get((js.iterations[j], scope))
            if prev is not None:
                return prev == sender
        return False

    # ---- read side ---------------------------------------------------------------------------
    def _digest_closed(self, job: str, js: JobState, windows: list[tuple[float, float]],
                       inputs: AnalysisInputs) -> None:
        """Digest the runs a new one replaced, if any (outside the store lock: an analysis each, once;
        under the job's digest lock, which every analysis takes before it reads the runs)."""
        with js.digest_lock:
            with self._lock:
                closed, js.closed = js.closed, []
                done = list(js.runs)
                gpu = self.gpu_override or js.gpu_name
            if not closed:
                return
            done, failed = digest_runs(job, closed, done, windows,
                                       lambda span: inputs.class_inputs(job, span)[1], gpu, self.peak_tflops)
            with self._lock:
                js.runs = done[-MAX_DIGESTS:]
                # the job's analysis reads them: one that read its records while this run closed (after
                # this digest's check) holds none of it, and nothing else would make it again
                js.dirty = True
                self.stats.analysis_errors += failed

    def analysis(self, job: str, force: bool = False, inputs: AnalysisInputs = NO_INPUTS
                 ) -> RunAnalysis | None:
        """The job's analysis, recomputed if new data arrived (rate-limited): of its current run, with
        the digests of the runs before it (each made once, when a new run replaced its records).
        ``inputs``: what it reads of the aggregator's other parts (read outside the store lock)."""
        windows = inputs.capture_windows(job)  # outside the lock: it asks the capture coordinator
        with self._lock:
            js = self.jobs.get(job)
            if js is None:
                return None
        self._digest_closed(job, js, windows, inputs)
        with self._lock:
            newest = [js.records[(js.iterations[-1], sc)] for sc in js.by_iteration.get(js.iterations[-1], [])
                      if (js.iterations[-1], sc) in js.records] if js.iterations else []
            span = figures_span(newest, js.run_start, js.runs)
            need_gpu = not self.gpu_override and not js.gpu_name
        gpm, timeline, gpm_when = inputs.class_inputs(job, span)
        placed = inputs.placed_gpu(job) if need_gpu else None  # outside the lock: it asks the node view
        with self._lock:
            js = self.jobs.get(job)
            if js is None:
                return None
            if placed and not js.gpu_name:
                js.gpu_name, js.dirty = placed, True  # named now: MFU can be had
            # New records, or what the class reads changed (a capture finished, the job stopped
            # stepping and its last steady window's GPM now stands for it).
            changed = js.dirty or js.class_key != (gpm, timeline, gpm_when)
            stale = changed and (force or self.clock.time() - js.analysis_time >= self.min_recompute_s)
            if js.analysis is not None and not stale:
                return js.analysis
            raw = js.held_records()
            info = job_info_of(js.job_info, raw, js.folded_ranks)
            if js.evicted_any and info.started_at is not None:
                # The first iterations left the window: from the start-up stamp to the first step
                # held is not start-up. Goodput then covers the held iterations only.
                info = dataclasses.replace(info, started_at=None)
            gpu = self.gpu_override or js.gpu_name
            new_normal_at = js.new_normal_at
            earlier, run = list(js.runs), js.run
            js.dirty = False
            seq = js.begin_analysis()
        try:
            with js.analysis_lock:  # the memo and the caches belong to one analysis at a time
                records = mark_disturbed(job_level_steps(raw, js.folded), windows, js.disturbed)
                result = analyze_run(info, records, gpu_name=gpu, peak_tflops=self.peak_tflops,
                                     job_name=job, gpm=gpm, timeline=timeline, memo=js.memo,
                                     gpm_when=gpm_when, new_normal_at=new_normal_at, earlier=earlier,
                                     run=run, pause_sightings=inputs.pause_sightings(job))
        except Exception as exc:
            # Never raised past the job, never a silent []: counted, logged (with its traceback, once a
            # minute per job), said in the job's overview (analysis_error) while its last analysis
            # stays served; tried again when new data comes, not on every tick.
            with self._lock:
                self.stats.analysis_errors += 1
                n = js.analysis_failed(seq, run, exc, self.clock.time(), (gpm, timeline, gpm_when),
                                       REFUSAL_LOG_INTERVAL_S)
            if n:
                log.exception("analysis of job %s failed (%d time(s) since the last line; %d in all); its "
                              "last analysis stays served", job[:80], n, js.analysis_failures)
            return js.analysis
        with self._lock:
            return js.keep_analysis(seq, run, result, self.clock.time(), (gpm, timeline, gpm_when))

    def note_folded_ranks(self, job: str, ranks: Collection[int]) -> None:
        """Ranks whose records reached the job folded into one (perfd.engine): they count as
        reporting, as their own records would."""
        with self._lock:
            js = self._job(job)
            if not js.folded_ranks >= set(ranks):
                js.folded_ranks |= set(ranks)
                js.dirty = True

    def held_fold(self, job: str, iteration: int) -> StepRecord | None:
        """The ``"all"`` record held for the job's iteration, if any."""
        with self._lock:
            js = self.jobs.get(job)
            return js.records.get((iteration, "all")) if js is not None else None

    def set_new_normal(self, job: str, iteration: int | None = None) -> int | None:
        """The job's current step level is its new normal from ``iteration`` (default: after the last
        iteration held): a lasting shift's cost stops there. None when the job is not held."""
        with self._lock:
            js = self.jobs.get(job)
            if js is None:
                return None
            if iteration is None:
                iteration = max(js.by_iteration, default=0) + 1
            js.new_normal_at, js.dirty = iteration, True
            return iteration

    def gpu_models(self) -> dict[str, str]:
        """job -> the GPU model its agents' NVML series named, for the state store: the samples that
        named it are not kept, and a run digested after a restart, before an agent names it again,
        would lose its MFU for good (the digest is made once)."""
        with self._lock:
            return {j: js.gpu_name for j, js in self.jobs.items() if js.gpu_name}

    def new_normals(self) -> dict[str, int]:
        """job -> the iteration its new normal starts at (for the state store)."""
        with self._lock:
            return {j: js.new_normal_at for j, js in self.jobs.items() if js.new_normal_at is not None}

    def cached_analysis(self, job: str) -> RunAnalysis | None:
        """The last analysis computed, without recomputing (for callers holding other locks)."""
        with self._lock:
            js = self.jobs.get(job)
            return js.analysis if js else None

    def step_histograms(self, jobs: Sequence[str]) -> list[tuple[str, list[tuple[str, float]], float]]:
        """(job, [(le, cumulative count)], sum seconds) for /metrics."""
        out = []
        with self._lock:
            for job in jobs:
                js = self.jobs.get(job)
                if js is None or js.step_hist.n == 0:
                    continue
                h, acc, buckets = js.step_hist, 0, []
                for b, c in zip([*map(str, STEP_BUCKETS_S), "+Inf"], h.counts, strict=True):
                    acc += c
                    buckets.append((b, float(acc)))
                out.append((job, buckets, h.total_s))
        return out

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self.jobs)

    def has_data(self, job: str) -> bool:
        """The job holds step records or job info (a job only named in a Hello holds neither)."""
        with self._lock:
            js = self.jobs.get(job)
            return js is not None and (bool(js.records) or js.job_info is not None)

    def activity(self, job: str) -> tuple[float, float] | None:
        """(when its last step arrived, or 0.0; when anything of it last did), None: not held."""
        with self._lock:
            js = self.jobs.get(job)
            return None if js is None else (js.last_step_time, js.touched_at)

    def forget(self, job: str) -> None:
        """Drop the job and everything held of it (pruned, or released with no data)."""
        with self._lock:
            self.jobs.pop(job, None)
            for agent in [a for a, j in self.agent_job.items() if j == job]:
                del self.agent_job[agent]

    def forget_agent(self, agent_id: str) -> None:
        """The agent is gone for good: it serves no job any more."""
        with self._lock:
            self.agent_job.pop(agent_id, None)

    def agents_of(self, job: str) -> set[str]:
        with self._lock:
            js = self.jobs.get(job)
            return set(js.agents) if js else set()

    def job_of(self, agent_id: str) -> str | None:
        with self._lock:
            return self.agent_job.get(agent_id)

    def gpu_of(self, job: str) -> str | None:
        with self._lock:
            js = self.jobs.get(job)
            return self.gpu_override or (js.gpu_name if js else None)

    def steps_key(self, job: str) -> tuple[int, float]:
        """Changes whenever the job's step records do (cache key of derived analyses)."""
        with self._lock:
            js = self.jobs.get(job)
            return (len(js.records), js.last_step_time) if js else (0, 0.0)

    def job_info(self, job: str) -> JobInfo | None:
        """The job's start-up facts as its agents sent them (None: none yet)."""
        with self._lock:
            js = self.jobs.get(job)
            return js.job_info if js is not None else None

    def hook_seen(self, job: str) -> dict[int, tuple[str, float]]:
        """rank -> (its step hook's pid, when its latest hook record arrived), for the job's ranks
        whose hook has reported ({} when none has)."""
        with self._lock:
            js = self.jobs.get(job)
            return dict(js.hook_seen) if js is not None else {}

    def records_and_layout(self, job: str) -> RecordsLayout | None:
        """The job's step records, its parallel layout (None: no job info yet) and its GPU's name."""
        with self._lock:
            js = self.jobs.get(job)
            if js is None:
                return None
            layout = js.job_info.layout if js.job_info else None
            return js.held_records(), layout, self.gpu_override or js.gpu_name

    def overview(self, job: str) -> JobOverview | None:
        with self._lock:
            js = self.jobs.get(job)
            if js is None:
                return None
            its = [it for it, _ in js.records]  # min and max, not a sort: read on every scrape
            if len(js.agents_sorted) != len(js.agents):
                js.agents_sorted = tuple(sorted(js.agents))
            return JobOverview(
                job=job, agents=js.agents_sorted, gpu=self.gpu_override or js.gpu_name,
                iterations_seen=len(js.records), first_iteration=min(its) if its else None,
                last_iteration=max(its) if its else None, has_job_info=js.job_info is not None,
                last_step_age_s=(self.clock.time() - js.last_step_time) if js.last_step_time else None,
                last_step_time=js.last_step_time or None, skipped_iterations_total=js.skipped_total,
                nan_iterations_total=js.nan_total, analysis_failure=js.analysis_failure,
                analysis_failed_since=js.analysis_failed_since, analysis_failures=js.analysis_failures)
