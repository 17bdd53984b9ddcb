"""Whether a slowdown is what perfd's own capture left behind. Pure.

An incident that begins as a capture ends is the capture's (the steps stayed slow). A Kineto trace
taken on demand without ``TEARDOWN_CUPTI=1`` leaves CUPTI subscribed, and every later kernel launch
pays for it: a host-bound job then steps slower for the rest of its run (the Hugging Face Trainer
~30%, Lightning's demo 24%, docs/evidence/kineto_teardown_h200). Its steady median drifts up to
the new pace, so the same lasting slowdown surfaces again later as incidents that begin nowhere near
the capture; each is the capture's too when the steps between the capture and it never came back to
the pace before it (:func:`since_capture`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from perfd.analytics import thresholds as th

# The steps read on each side: the pace just before the capture, not the run's first steps (warm-up)
PACE_STEPS = 50
MIN_BEFORE = 10  # steps before the capture to know its pace
MIN_SINCE = 5  # steps between the capture and the incident to know they never came back


@dataclass(frozen=True)
class SinceCapture:
    """The capture (indexes of its steps) an incident is the aftermath of, and the paces either side."""

    capture: Sequence[int]
    before_ms: float  # median step over up to PACE_STEPS steps before the first capture
    since_ms: float  # median step from the capture's end to the incident's start

    @property
    def ratio(self) -> float:
        return self.since_ms / self.before_ms


def since_capture(captures: Sequence[Sequence[int]], start: int, sized: Sequence[float | None]
                  ) -> SinceCapture | None:
    """The latest capture before index ``start`` since which the steps (``sized``: time per unit of work,
    None where unknown or disturbed) stayed th.AFTER_CAPTURE_PACE or more above their pace before the
    first capture; None where they did not (or too few steps say)."""
    earlier = [c for c in captures if c and c[-1] < start]
    if not earlier:
        return None
    # the pace before perfd first captured the job: a capture's warm-up is a capture of its own (the
    # Trainer's recording: the request's stretch, then the trace's), already slowed
    first, c = earlier[0], earlier[-1]
    before = [z for i in range(max(0, first[0] - PACE_STEPS), first[0]) if (z := sized[i]) is not None]
    since = [z for i in range(c[-1] + 1, start) if (z := sized[i]) is not None]
    if len(before) < MIN_BEFORE or len(since) < MIN_SINCE:
        return None
    got = SinceCapture(c, statistics.median(before), statistics.median(since))
    return got if got.before_ms > 0 and got.ratio >= th.AFTER_CAPTURE_PACE.value else None
