"""The words of a loop's own pauses at a cadence (perfd.analytics.incidents.cadence): the finding that names
them ("a pause every 100 iterations, ~2.3 s"), what was seen during them, and the line that announces
them (``with hook.phase("checkpoint"):``). Called by perfd.report.finding_text for a CadenceFacts."""

from __future__ import annotations

from perfd.analytics.incidents.cadence import CadencePause, PausePart, PauseSeen, SeenKind
from perfd.analytics.run.run_facts import CadenceFacts
from perfd.core.model import HOOK_OUTSIDE

# What the pause is, as far as what was seen tells.
WHAT: dict[PausePart, str] = {
    PausePart.CHECKPOINT: "a checkpoint save",
    PausePart.EVALUATION: "an evaluation",
    PausePart.UNTOLD: "an evaluation or a checkpoint save",
}
# The goodput part its time is booked under.
BOOKED: dict[PausePart, str] = {
    PausePart.CHECKPOINT: "checkpoint",
    PausePart.EVALUATION: "evaluation",
    PausePart.UNTOLD: "cadence (what was seen does not tell an evaluation from a checkpoint save)",
}
PHASE_LINE: dict[PausePart, str] = {
    PausePart.CHECKPOINT: 'with hook.phase("checkpoint"):',
    PausePart.EVALUATION: 'with hook.phase("evaluation"):',
}


def seen_text(s: PauseSeen) -> str:
    """One item of what was seen during the pauses."""
    match s.kind:
        case SeenKind.DISK_WRITES:
            return f"rank {s.rank}'s process wrote {s.value / 1e6:.0f} MB/s to disk (a checkpoint save)"
        case SeenKind.NO_DISK_WRITES:
            return f"rank {s.rank}'s process wrote little to disk ({s.value / 1e6:.1f} MB/s at most)"
        case SeenKind.GPU_BUSY:
            return f"rank {s.rank}'s GPU was busy ({s.value:.0%}) while no step ended (an evaluation)"
        case SeenKind.GPU_IDLE:
            return f"rank {s.rank}'s GPU stayed idle ({s.value:.0%} at most)"


def _iterations(c: CadencePause) -> str:
    its = [str(i) for i in c.iterations]
    return ", ".join(its) if len(its) <= 6 else f"{', '.join(its[:3])}, …, {its[-1]}"


def cadence_words(c: CadencePause) -> tuple[str, str]:
    """The finding's title and observation."""
    lo, hi = min(p.seconds for p in c.pauses), max(p.seconds for p in c.pauses)
    took = f"{lo:.1f} s" if hi - lo < 0.05 else f"{lo:.1f}–{hi:.1f} s"
    seen = ("; ".join(seen_text(s) for s in c.seen) if c.seen else
            "perfd saw nothing of the ranks inside these pauses (no GPU sample or disk reading fell in them)")
    return (f"A pause every {c.every} iterations, ~{c.typical_s:.1f} s",
            f"Iterations {_iterations(c)} each took {took} more than the steady step, outside the step (the "
            f"steps themselves ran at their steady time): the loop's own work every {c.every} iterations, "
            f"{WHAT[c.part]} it does not announce, not an incident. Seen during it: {seen}. Goodput books "
            f"its {c.total_s:.1f} s as {BOOKED[c.part]}.")


def cadence_source() -> str:
    return f"hook timer {HOOK_OUTSIDE} (the time between the steps) over the steps at the cadence"


def cadence_recommendation(f: CadenceFacts) -> tuple[str, str]:
    """The line that announces the pause, and why."""
    c = f.cadence
    line = PHASE_LINE.get(c.part)
    if line is not None:
        act = f"Announce the loop's {WHAT[c.part]} every {c.every} iterations: `{line}` around it"
    else:
        act = (f"Announce the loop's work every {c.every} iterations: `{PHASE_LINE[PausePart.EVALUATION]}` "
               f"around its evaluation, `{PHASE_LINE[PausePart.CHECKPOINT]}` around its checkpoint save")
    share = f"; the pauses take {c.total_s / f.run_s:.1%} of the run" if f.run_s else ""
    return act, ("perfd then times each as what it is (goodput's evaluation and checkpoint parts, the step "
                 "it lies before kept at its own time) instead of inferring it from a slow step" + share)
