"""A capture as it reads: what each check of a capture against the job found
(perfd.analytics.breakdown.capture_match), the finding that a capture is not of the job, the line a
command refuses it with; the reason of the class a capture's timeline supports
(perfd.analytics.advice.capture_findings.ClassBasis) and the diagnosis' JSON with it. Pure."""

from __future__ import annotations

import dataclasses

from perfd.analytics.advice.capture_findings import CaptureDiagnosis, ClassBasis
from perfd.analytics.breakdown.capture_match import (
    CaptureMatch,
    Check,
    Evidence,
    MatchFacts,
    MatchFinding,
)
from perfd.analytics.finding_types import Finding
from perfd.report.budget_text import class_shares_text


def _g(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def sentence(e: Evidence) -> str:
    """What one check found, with its numbers (the finding's and the refusal's words)."""
    x = e.extra
    if e.check is Check.TOKENS:
        seen = f"its layer-norm kernels normalise {_g(e.capture)} rows a launch"
        n = f" ({_g(x.get('launches'))} launches)" if x.get("launches") is not None else ""
        verdict = "as" if e.matches else "where"
        return f"{seen}{n}, {verdict} the job's micro-batch holds {_g(e.job)} tokens (micro-batch size × " \
               "sequence length per GPU)"
    if e.check is Check.PIPELINE:
        if (e.job or 0) > 1:
            return (f"{_g(e.capture)} ms of SendRecv kernels" if e.matches else "no SendRecv kernel") + \
                f", the job's {_g(e.job)} pipeline stages exchanging activations every micro-batch"
        return ("no SendRecv kernel, as a job without pipeline stages" if e.matches else
                f"{_g(e.capture)} ms of SendRecv kernels (a pipeline stage's), where the job has no pipeline "
                "parallelism")
    if e.check is Check.COLLECTIVES:
        return (f"{_g(e.capture)} ms of NCCL kernels" if e.matches else "no NCCL kernel") + \
            f", the job running on {_g(e.job)} GPUs"
    if e.check is Check.FLOPS:
        peak = "the GPU's peak" if x.get("peak_known") else "the highest peak of any GPU perfd knows"
        return (f"the job's {_g(x.get('tflop_per_step'))} TFLOP a step per GPU, {_g(x.get('steps'))} "
                f"step(s) in its {_g(x.get('compute_ms'))} ms of kernels, would run at "
                f"{_g(e.capture)} TFLOP/s, "
                + ("within" if e.matches else "beyond") + f" {peak} ({_g(e.job)} TFLOP/s)")
    ratio = x.get("ratio")
    why = "" if e.matches or ratio is None else (
        ": more than a profiler adds" if ratio > 1 else ": a profiler never makes steps faster")
    return (f"its steps take {_g(e.capture)} ms against the job's steady {_g(e.job)} ms"
            + (f" ({ratio:.2f}×{why})" if ratio is not None else ""))


def match_words(f: MatchFacts) -> tuple[str, str]:
    """The mismatch finding's title and observation: refused, or read anyway (``forced``), or its step
    time alone apart (stated beside its budget)."""
    m = f.match
    bad = m.mismatches
    what = ", ".join(e.check.value.replace("_", " ") for e in bad)
    if m.refused:
        title = (f"Capture {m.capture} is not of this job ({what})"
                 + ("; read anyway (--capture-force)" if f.forced else "; not used"))
    else:
        title = f"Capture {m.capture}'s steps are not the job's steady steps ({what})"
    obs = "; ".join(sentence(e) for e in bad) + "."
    if not m.refused:
        obs += (" The budget is read from it, but its idle parts are not the profiler's cost alone: a "
                "capture of another run, or of steps something slowed.")
    return title, obs


def worded_match(f: Finding) -> Finding:
    """The mismatch finding (perfd.analytics.breakdown.capture_match.MatchFinding) with its words; any
    other as it is."""
    if isinstance(f, MatchFinding) and f.facts is not None:
        title, observation = match_words(f.facts)
        return dataclasses.replace(f, title=title, observation=observation, facts=None)
    return f


def refusal(m: CaptureMatch) -> str:
    """The one line a command prints when it refuses a capture of another job."""
    bad = sorted(m.mismatches, key=lambda e: not e.check.decisive)
    return (f"the capture {m.capture} is not of this job: " + "; ".join(sentence(e) for e in bad)
            + " (--capture-force to read it anyway)")


def class_reason(b: ClassBasis) -> str:
    """Why a capture's timeline supports its class: the deciding device's class shares and where."""
    if b.decided is not None:
        return f"{class_shares_text(b.decided)} ({b.where})"
    return f"no device with kernels ({b.where})" if b.devices else "no device in the capture"


def diagnosis_json(d: CaptureDiagnosis) -> dict[str, object]:
    """A capture's diagnosis as served: its JSON with the class's reason beside the class."""
    out: dict[str, object] = {}
    for k, v in d.to_json().items():
        out[k] = v
        if k == "bottleneck":
            out["bottleneck_reason"] = class_reason(d.basis)
    return out
