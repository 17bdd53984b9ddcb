"""What a job's analysis reads beside its step records, from the aggregator's other parts: the
class inputs (the GPM of the job's GPUs while it steps, else of its last steady window, and the
class its latest capture supports), its compute per step as its last budget has it, and the windows
its captures disturbed.

Split from perfd/aggregator/state.py: these are what a job store analysis reads beside its records
(perfd.aggregator.job_inputs.AnalysisInputs), and they read what the job store does not hold (the
capture coordinator's records through ``captures_of``, the node view's GPM, the incident tracker's
open incidents), so the analysis side (perfd.aggregator.job_analyses) builds one :class:`ClassInputs`
over its parts and hands it to the store with each analysis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from perfd.aggregator.capture_records import CaptureRecord, ncu_of
from perfd.aggregator.incidents import IncidentTracker
from perfd.aggregator.jobs import JobStore
from perfd.aggregator.nodes import NodeView
from perfd.aggregator.steady_gpm import SteadyGpm
from perfd.analytics.breakdown.bottleneck import GpmReading, GpmWhen
from perfd.analytics.breakdown.diagnosis import TimelineClass
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.ncu.ncu_verdicts import rows_class
from perfd.analytics.steps.liveness import stale_after
from perfd.core.model import CaptureStatus

STEPPING_MIN_S = 5.0  # a job whose last step is this recent (or STEPPING_STEPS steps) is stepping
STEPPING_STEPS = 3

CapturesOf = Callable[[str], list[CaptureRecord]]


def in_span(t: object, lo: float | None, hi: float | None, slack_s: float = 1.0) -> bool:
    """Whether a capture that started at ``t`` lies in a run's span (an unknown start: in every run)."""
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return True
    return (lo is None or t >= lo - slack_s) and (hi is None or t <= hi + slack_s)


class ClassInputs:
    """The job store's class inputs and capture windows, read from the state's parts."""

    def __init__(self, jobs: JobStore, nodes: NodeView, incidents: IncidentTracker,
                 captures_of: CapturesOf, stale_after_s: Callable[[], float | None]) -> None:
        self.jobs = jobs
        self.nodes = nodes
        self.incidents = incidents
        self.captures_of = captures_of
        self.stale_after_s = stale_after_s  # --job-stale-after (None: from the job's steps)
        self.steady_gpm = SteadyGpm()  # the GPM of each job's last steady window, for after it stops

    def forget(self, job: str) -> None:
        """The job was pruned: its last steady GPM goes."""
        self.steady_gpm.forget(job)

    def class_inputs(self, job: str, span: tuple[float | None, float | None] = (None, None)
                     ) -> tuple[GpmReading | None, TimelineClass | None, GpmWhen]:
        """GPM of the job's GPUs while it steps (after it stops, the last reading taken while it
        stepped with no incident open: its last steady window), the class its latest capture within
        ``span`` supports, and which GPM window that is. ``span``: (from, to) epoch s of the run whose
        figures the analysis reports (perfd.analytics.run.runs): a capture of another run of the job
        never informs them (once run 1's Kineto steps were read against run 2's armed steps). A
        capture is left out when it ran during a real incident (it shows the incident, not the job);
        its own disturbance does not count. A capture taken with Python stacks informs the job only
        when none without them does: its idle parts hold more of the profiler's own cost (+16% against
        +3% a step on an H100 Megatron-LM job)."""
        timeline = None
        spans = [(i.incident.start_time, i.incident.end_time) for i in self.incidents.typed_incidents(job)
                 if not i.disturbance]
        order = sorted(self.captures_of(job), key=lambda c: (not c.stack, c.finished_at or 0.0))
        lo, hi = span
        for c in order:
            t = c.started_at
            if not in_span(t, lo, hi):
                continue
            during = isinstance(t, (int, float)) and any(
                a is not None and a - 1.0 <= t <= (b if b is not None else float("inf")) + 1.0
                for a, b in spans)
            got = c.timeline() if not during else None
            if got is not None:
                timeline = got
        # An Nsight Compute capture's kernel figures join the budget's parts; with no timeline, the
        # timers' budget (a class of its own they do not vote).
        ncu = ncu_of(self.captures_of(job))
        if ncu.categories:
            if timeline is not None:
                timeline = dataclasses.replace(timeline, ncu=ncu.categories, ncu_id=ncu.capture_id,
                                               ncu_kernels=ncu.kernels, ncu_joined_to=ncu.joined_to)
            else:  # the rows class the job when they cover most of its compute
                cls, why, _ = rows_class([c.summary for c in ncu.categories], self.compute_ms(job))
                timeline = TimelineClass(cls, why, f"capture {ncu.capture_id} (ncu)",
                                         ncu=ncu.categories, ncu_id=ncu.capture_id, ncu_kernels=ncu.kernels,
                                         ncu_joined_to=ncu.joined_to)
        ov = self.jobs.overview(job)
        age = ov.last_step_age_s if ov else None
        running = age is None or age <= stale_after(None, self.stale_after_s())
        if running and self.stepping(job, age, STEPPING_MIN_S):
            gpm = self.nodes.gpm(self.jobs.agents_of(job))
            now = self.jobs.clock.time()
            # Kept for after the job: at most one reading a second, only while a step came within the
            # last two steps (a job that just stopped shows an idle GPU), and no incident open.
            if gpm is not None and self.steady_gpm.due(job, now) \
                    and self.stepping(job, age, 2.0, 2) and not self.incidents.has_open(job):
                self.steady_gpm.add(job, gpm, now)
            return gpm, timeline, GpmWhen.STEPPING
        return self.steady_gpm.window(job), timeline, GpmWhen.LAST_STEADY

    def compute_ms(self, job: str) -> float | None:
        """The job's compute ms per step as its last analysis' budget has it (the ncu rows' coverage)."""
        a = self.jobs.cached_analysis(job)
        b = a.summary.step_budget if a is not None else None
        compute = b.get(Part.COMPUTE) if b is not None else None
        return compute.ms if compute is not None else None

    def stepping(self, job: str, age: float | None, min_s: float, steps: int = STEPPING_STEPS) -> bool:
        """The job's last step came within ``steps`` steps' time (at least ``min_s``): its GPUs' GPM
        shows its work (a job that stopped but is not yet stale would show an idle GPU)."""
        if age is None:
            return False
        a = self.jobs.cached_analysis(job)
        step_ms = a.summary.median("step_time_ms") if a is not None else None
        return age <= max(min_s, steps * (step_ms or 0.0) / 1e3)

    def capture_windows(self, job: str) -> list[tuple[float, float]]:
        """(start, end) of the job's captures: the iterations they touch are disturbed. A capture ends in
        the ranks when their trace is written, where its agent says when (its analysis of the trace takes
        seconds more, in the agent: on the H200 the steps ran at their own speed through the 5 s between,
        tests/data/loops/hf_clm_h200), else when it finished."""
        out = []
        for c in self.captures_of(job):
            t0 = c.started_at
            t1 = c.finished_at or (None if c.status is CaptureStatus.STARTED else t0)
            ready = c.result.trace_ready_at if c.result is not None else None
            if ready is not None and isinstance(t0, (int, float)) and isinstance(t1, (int, float)) \
                    and t0 <= ready <= t1:
                t1 = ready
            if isinstance(t0, (int, float)):
                out.append((float(t0), float(t1) if isinstance(t1, (int, float)) else self.jobs.clock.time()))
        return out
