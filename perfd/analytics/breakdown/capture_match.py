"""Whether a capture is of the job it is read against: ``perfd analyze megatron
LOG --capture TRACE`` with a trace of another job once gave a full budget and remedies, the only hint
"the capture slowed its steps by +143%" read as the profiler's own cost. Each check compares a figure
of the capture with the job's own, from what every timeline holds:

- **tokens**: PyTorch's layer-norm kernels launch one block per row (perfd.analytics.breakdown.kernels
  .ROW_NORM_KERNELS), so their grid says the tokens of a micro-batch; the job's are micro-batch size x
  sequence length (/ TP under sequence parallelism, / CP). None of the capture's norm launches with the
  job's rows: another model shape or batch.
- **pipeline**: a stage of a pipeline-parallel job sends and receives activations every micro-batch
  (``ncclDevKernel_SendRecv``); a capture with none is not of a pipeline stage, and one with them is not
  of a job without pipeline, expert or context parallelism (EP and CP exchange through the same kernel).
- **collectives**: a job of more than one GPU runs NCCL kernels every step (gradients, tensor or
  pipeline exchanges); a capture with none is of a one-GPU job.
- **flops**: the job's model FLOPs per GPU per step (its log's throughput x its steady step) over the
  capture's kernel time, for the steps the capture holds, cannot exceed the GPU's peak.
- **step time**: the capture's steps (those it marks, or asked for) against the job's steady step,
  beyond what a profiler adds (perfd.analytics.thresholds.CAPTURE_OTHER_JOB_STEP) or faster than it.

A check without its inputs is not made (``checked`` lists the ones that were). Typed evidence, the
numbers with it; the sentences are the report's (perfd.report.capture_text). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.analytics.common import TextEnum
from perfd.analytics.finding_types import Finding, Severity
from perfd.analytics.steps.gpus import GPU_TABLE
from perfd.core.model import JobInfo
from perfd.core.record_json import JsonWritten, unwritten, written_after

# The id of the finding that reads a capture's extra step time as the profiler's cost
# (perfd.analytics.advice.budget_findings.capture_cost): a capture whose steps are not the job's
# states the mismatch instead.
CAPTURE_COST_FINDING = "budget-capture-cost"
# A capture's kernels cannot run the job's FLOPs faster than the GPU's peak; 5% over it allows for the
# rounding of the log's throughput and of the peak's datasheet figure.
FLOPS_SLACK = 1.05
# The largest dense peak of the table (TFLOP/s, any dtype the job may run): the bound when the job's
# GPU is unknown (offline without --gpu).
MAX_PEAK_TFLOPS = max((v for g in GPU_TABLE for v in g.peak_tflops.values()), default=0.0)


class Check(TextEnum):
    TOKENS = "tokens"
    PIPELINE = "pipeline"
    COLLECTIVES = "collectives"
    FLOPS = "flops"
    STEP_TIME = "step_time"

    @property
    def decisive(self) -> bool:
        """A mismatch of this check alone refuses the capture. Step time is stated, never decisive: a
        capture of the job's own steps taken while something slowed them (an incident) runs slow too."""
        return self is not Check.STEP_TIME


@dataclass(frozen=True)
class Evidence(JsonWritten):
    """One check's figures: the capture's and the job's (what they count: ``unit``), and whether they
    agree. ``extra``: the other numbers the check read (launches, steps, the peak)."""

    check: Check
    matches: bool
    capture: float | None
    job: float | None
    unit: str
    extra: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureMatch(JsonWritten):
    """Every check made of one capture against one job."""

    capture: str  # the capture's name (file or id)
    evidence: tuple[Evidence, ...] = ()

    @property
    def mismatches(self) -> tuple[Evidence, ...]:
        return tuple(e for e in self.evidence if not e.matches)

    @property
    @written_after("capture")
    def matches(self) -> bool:
        return not self.mismatches

    @property
    @written_after("capture")
    def refused(self) -> bool:
        """A decisive check says the capture is another job's (or another run's, of other shape)."""
        return any(e.check.decisive for e in self.mismatches)

    @property
    def checked(self) -> tuple[Check, ...]:
        return tuple(e.check for e in self.evidence)

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> CaptureMatch | None:
        """A match read back (a capture record's ``match``); None when it is not one."""
        evs = d.get("evidence") or []
        if not isinstance(evs, (list, tuple)):
            return None
        ev: list[Evidence] = []
        for e in evs:
            extra = e.get("extra") or {} if isinstance(e, Mapping) else None
            if not isinstance(e, Mapping) or not isinstance(extra, Mapping):
                return None
            try:
                ev.append(Evidence(Check(e["check"]), bool(e["matches"]), _num(e.get("capture")),
                                   _num(e.get("job")), str(e.get("unit") or ""),
                                   {str(k): x for k, v in extra.items() if (x := _num(v)) is not None}))
            except (KeyError, ValueError):
                return None
        return cls(str(d.get("capture") or ""), tuple(ev))


@dataclass(frozen=True)
class JobFacts:
    """What the checks read of the job: its layout, the tokens of a micro-batch per GPU, its steady
    step and model FLOPs per GPU per step, and its GPU's dense peak (None: unknown)."""

    world: int | None
    pp: int | None
    ep: int | None
    cp: int | None
    rows: int | None
    step_ms: float | None
    flops_per_step: float | None  # per GPU
    peak_tflops: float | None


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def job_facts(job: JobInfo, medians: Mapping[str, object], peak_tflops: float | None,
              world: int | None = None) -> JobFacts:
    """The job's side from its start-up facts and its steady medians (``step_time_ms``,
    ``model_tflops_per_gpu``)."""
    lay, spec = job.layout, job.spec
    rows = None
    if lay.micro_batch_size and spec.seq_length:
        rows = lay.micro_batch_size * spec.seq_length
        sp = str(job.arguments.get("sequence_parallel", "")).strip().lower() == "true"
        if sp and lay.tp:
            rows //= lay.tp
        if lay.cp:
            rows //= lay.cp
    step, tflops = _num(medians.get("step_time_ms")), _num(medians.get("model_tflops_per_gpu"))
    flops = tflops * 1e12 * step / 1e3 if step and tflops else None
    return JobFacts(world or lay.world_size, lay.pp, lay.ep, lay.cp, rows, step, flops, peak_tflops)


def _tokens(devs: Sequence[DeviceBreakdown], facts: JobFacts) -> Evidence | None:
    rows: dict[int, int] = {}
    for d in devs:
        for r, n in d.norm_rows.items():
            rows[r] = rows.get(r, 0) + n
    if not rows or facts.rows is None:
        return None
    top = max(rows, key=lambda r: rows[r])
    counts = {"launches": float(sum(rows.values())), "launches_with_job_rows": float(rows.get(facts.rows, 0))}
    return Evidence(Check.TOKENS, facts.rows in rows, float(top), float(facts.rows), "rows", counts)


def _pipeline(devs: Sequence[DeviceBreakdown], facts: JobFacts) -> Evidence | None:
    if facts.pp is None or not devs:
        return None
    sendrecv = sum(d.sendrecv_ms for d in devs)
    if facts.pp > 1:
        return Evidence(Check.PIPELINE, sendrecv > 0, sendrecv, float(facts.pp), "ms of SendRecv")
    if (facts.ep or 1) > 1 or (facts.cp or 1) > 1:
        return None  # expert and context parallelism exchange through SendRecv too
    return Evidence(Check.PIPELINE, sendrecv == 0, sendrecv, float(facts.pp), "ms of SendRecv")


def _collectives(devs: Sequence[DeviceBreakdown], facts: JobFacts) -> Evidence | None:
    if not facts.world or facts.world <= 1 or not devs:
        return None
    comm = sum(d.comm_ms for d in devs)
    return Evidence(Check.COLLECTIVES, comm > 0, comm, float(facts.world), "ms of NCCL")


def _marked(d: DeviceBreakdown) -> float | None:
    """The steps the device's trace marks (None: it marks none)."""
    return float(d.trace_steps) if d.trace_steps is not None and d.trace_steps > 0 else None


def _steps_held(d: DeviceBreakdown, asked: float | None, step_ms: float) -> float | None:
    """Whole steps the device's capture holds: those it marks or asked for, else the whole steps its span
    could hold at the job's steady step (None: under one)."""
    if (marked := _marked(d)) is not None:
        return marked
    if asked:
        return asked
    span = d.span_ms
    n = int(span // step_ms) if span and step_ms > 0 else 0
    return float(n) if n >= 1 else None


def _flops(devs: Sequence[DeviceBreakdown], facts: JobFacts, asked: float | None) -> Evidence | None:
    if not facts.flops_per_step or not facts.step_ms or not devs:
        return None
    peak = facts.peak_tflops or MAX_PEAK_TFLOPS
    best: Evidence | None = None
    for d in devs:
        compute = d.compute_ms
        n = _steps_held(d, asked, facts.step_ms)
        if not compute or compute <= 0 or n is None:
            continue
        implied = facts.flops_per_step * n / (compute / 1e3) / 1e12  # TFLOP/s its kernels would run
        ev = Evidence(Check.FLOPS, implied <= peak * FLOPS_SLACK, implied, peak, "TFLOP/s",
                      {"steps": n, "compute_ms": compute, "tflop_per_step": facts.flops_per_step / 1e12,
                       "peak_known": 1.0 if facts.peak_tflops else 0.0})
        if best is None or (best.capture or 0.0) > implied:  # the device that makes the job most plausible
            best = ev
    return best


def _step(devs: Sequence[DeviceBreakdown], facts: JobFacts, asked: float | None) -> Evidence | None:
    if not facts.step_ms or not devs:
        return None
    d = max(devs, key=lambda x: x.span_ms)
    marked = _marked(d)
    n = marked if marked is not None else asked
    span = d.span_ms
    if not n or not span:
        return None  # steps not known but from the span over the steady step: nothing to compare
    step = span / n
    ratio = step / facts.step_ms
    ok = th.CAPTURE_FASTER_STEP.value <= ratio <= th.CAPTURE_OTHER_JOB_STEP.value
    return Evidence(Check.STEP_TIME, ok, step, facts.step_ms, "ms per step", {"ratio": ratio, "steps": n})


def check(capture: str, devices: Sequence[DeviceBreakdown], facts: JobFacts,
          steps: float | None = None) -> CaptureMatch:
    """Every check the inputs allow of a capture's devices against the job; ``steps``: the steps the
    capture asked for (None: as its trace marks them, if it does)."""
    devs = list(devices)
    got = [e for e in (_tokens(devs, facts), _pipeline(devs, facts), _collectives(devs, facts),
                       _flops(devs, facts, steps), _step(devs, facts, steps)) if e is not None]
    return CaptureMatch(capture, tuple(got))


@dataclass(frozen=True, slots=True, kw_only=True)
class MatchFacts:
    """A capture that does not match the job: the checks made, and whether it was read anyway."""

    match: CaptureMatch
    forced: bool


@dataclass
class MatchFinding(Finding):
    """The finding that a capture is not of the job (or not of its steady steps), its title and
    observation left to where it is shown (perfd.report.capture_text words them from ``facts``)."""

    facts: MatchFacts | None = field(default=None, metadata=unwritten())


def finding(m: CaptureMatch, forced: bool, label: str = "") -> MatchFinding | None:
    """The finding that says a capture does not match the job (None when it does): refused, or used
    anyway (``forced``), or its step time alone apart (stated beside its budget)."""
    if not m.mismatches:
        return None
    return MatchFinding("capture-mismatch", Severity.WARNING, "", "", m.to_json(), "", label or m.capture,
                        facts=MatchFacts(match=m, forced=forced))
