"""A job's runs as the job store keeps them (perfd.analytics.run.runs): the records
of a run a new one replaced, held until the next analysis digests them, and which run's span the
captures informing the job's figures are taken from.

A restart — from iteration 1 or resumed from a checkpoint — begins a new run (perfd/aggregator/jobs.py
``_close_run``): every record the old run held leaves for a digest of it, made once, outside the store's
lock, by the analysis of those records alone (with the captures of its own span), so no figure of the
job mixes two runs and later runs keep the old one as a reference.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from perfd.aggregator.job_fold import job_info_of, job_level_steps, mark_disturbed
from perfd.aggregator.job_state import ClosedRun, JobState
from perfd.aggregator.step_histogram import slowest_step_s
from perfd.analytics.breakdown.diagnosis import TimelineClass
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_result import digest
from perfd.analytics.run.runs import RunDigest, last_unarmed
from perfd.core.model import StepRecord
from perfd.core.stepfold import ALL_RANKS, FIRST_RUN, RUN_FIELD

log = logging.getLogger(__name__)

Span = tuple[float | None, float | None]  # (from, to) epoch s; None: open


def figures_span(newest: Iterable[StepRecord], run_start: float | None, runs: Sequence[RunDigest]) -> Span:
    """(from, to) epoch s of the run whose figures the job's analysis reports: the current run's (from
    ``run_start``, its first step's start; open-ended), or — the records of its newest iteration all
    armed (a rank is armed for its process's life: so is its run) — the last earlier run without an
    armed rank: the captures informing the class and the budget are taken from that span only."""
    held = list(newest)
    if held and all(r.armed for r in held):
        ref = last_unarmed(runs)
        if ref is not None:
            return ref.start_time, ref.end_time
    after = runs[-1].end_time if runs else None
    return (run_start if run_start is not None else after), None


def digest_runs(job: str, closed: Sequence[ClosedRun], done: list[RunDigest],
                windows: list[tuple[float, float]], timeline_of: Callable[[Span], TimelineClass | None],
                gpu: str | None, peak_tflops: float | None) -> tuple[list[RunDigest], int]:
    """``done`` with a digest of each closed run appended, in order (the analysis of its records
    alone, with the capture of its own span); and how many could not be analysed (logged)."""
    failed = 0
    for c in closed:
        info = job_info_of(c.info, c.records, c.ranks)
        recs = mark_disturbed(job_level_steps(c.records), windows)
        start = min((r.end_time - (r.step_time_ms or 0.0) / 1e3 for r in recs if r.end_time is not None),
                    default=None)
        end = max((r.end_time for r in recs if r.end_time is not None), default=None)
        try:
            a = analyze_run(info, recs, gpu_name=gpu, peak_tflops=peak_tflops, job_name=job,
                            timeline=timeline_of((start, end)), earlier=done, run=c.run)
        except Exception:  # counted; the run's digest is lost, never the job's analysis
            log.exception("job %s: the digest of run %d failed", job[:80], c.run)
            failed += 1
            continue
        done.append(digest(a, c.run))
    return done, failed


def run_mark(rec: StepRecord) -> str | None:
    """What tells a record's run from another's: a step hook's rank record, its process's pid; a fold
    the engine's root handed on, the run that root counted (perfd.core.stepfold.RUN_FIELD). A fold carries
    its slowest rank's pid too, which changes with the slowest rank, not with a restart: not read."""
    if isinstance(rec.rank, int):
        return rec.fields.get("pid") if rec.source is not None and rec.source.collector == "hook" else None
    if rec.rank == ALL_RANKS:
        return rec.fields.get(RUN_FIELD, FIRST_RUN)
    return None


def of_ended_run(ended_pids: set[str], rec: StepRecord) -> bool:
    """A step hook's record from the process of a run that has ended (a late delivery): never the
    current run's."""
    if not ended_pids or rec.source is None or rec.source.collector != "hook":
        return False
    return rec.fields.get("pid") in ended_pids


def late_start(js: JobState, scope: str, rec: StepRecord) -> bool:
    """Whether ``rec``, a start-up's first record (``first_of_run``), is the held run's own start come
    late (the store's lock held): a later iteration of its scope is held that ended after it. A new run
    begins after the old one's records; the engine's root hands records on in the order they reach it,
    which a node message published again (a retry, a redelivery) makes other than the order they were
    written in: the run's first record, come after its next ones, ended that run and sent them to a
    digest, and the job's view lost them. A record with no end is not judged late."""
    end = rec.end_time
    if end is None:
        return False
    for it in reversed(js.iterations):
        if it <= rec.iteration:
            return False
        held = js.records.get((it, scope)) if scope in js.by_iteration.get(it, ()) else None
        if held is not None:
            return held.end_time is not None and held.end_time > end
    return False


def close_run(js: JobState, scope: str, rec: StepRecord, max_marks: int) -> tuple[int, int]:
    """``rec`` begins a new run of the job (the store's lock held): every record the old run held — a
    restart from iteration 1 or a resume from a checkpoint alike — leaves for a digest of that run (made
    at the next analysis), so no figure mixes the two runs. The run's train-iters, its new normal and
    the hook pids of its ranks go with it. Returns (the run that ended, its records replaced)."""
    ended = js.run
    held = js.held_records()
    if held:  # the job info of its own start-up: the next run's may have arrived before its first record
        js.closed.append(ClosedRun(ended, held, js.run_info or js.job_info, frozenset(js.folded_ranks)))
    js.folded_ranks = set()  # the new run's world is the ranks its folds hold
    mark = run_mark(rec)
    pid = mark if isinstance(rec.rank, int) else None
    js.ended_pids.update(p for r in held if r.source is not None and r.source.collector == "hook"
                         and isinstance(r.rank, int) and (p := r.fields.get("pid")) is not None and p != pid)
    if len(js.ended_pids) > max_marks:
        js.ended_pids = set()  # bounded: pids come from the network
    js.run_marks = {scope: mark} if mark is not None else {}
    js.run_scopes, js.run_start, js.run_info = set(), None, js.job_info
    if js.hist_pending is not None:  # the old run's last iteration: counted now, not by the new run
        step = slowest_step_s(js.records.get((js.hist_pending, sc))
                              for sc in js.by_iteration.get(js.hist_pending, ()))
        if step is not None:
            js.step_hist.observe(step)
        js.hist_pending = None
    js.records, js.owner, js.iterations, js.writers = {}, {}, [], {}
    js.by_iteration, js.iteration_bytes, js.held_bytes = OrderedDict(), {}, 0
    js.train_iters, js.new_normal_at, js.evicted_any = None, None, False
    js.run += 1
    js.dirty = True
    return ended, len(held)
