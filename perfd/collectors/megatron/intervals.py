"""How many iterations a Megatron-LM record's averages cover (StepRecord.interval), for one run.

Apart from the parser (collectors/megatron/parser.py: lines to records) because it is no reading of a
line but a judgement over the run's successive records: whether Megatron reset its accumulators after
a run's first logged iteration, decided from the first record's number, the log interval and, when
those cannot say, the next record's own numbers.
"""

from __future__ import annotations

from perfd.core.model import StepRecord


class RunIntervals:
    """The records of one run, in order (a new run: a new instance)."""

    def __init__(self) -> None:
        self.prev: StepRecord | None = None  # the previous record of this run
        self._first: str | None = None  # whether it was the run's first-iteration log ("certain" | "maybe")

    def of(self, rec: StepRecord, log_interval: int | None) -> int | None:
        """How many iterations this record's averages cover.

        Recent Megatron-LM (core 0.20 here) logs the first iteration of every run, fresh or
        resumed, on top of each ``log_interval``-th one, and does not reset its accumulators
        after that first log. So the first record covers 1 iteration and the next one everything
        since the run began: on the shared fixture (log interval 1) iteration 2's 3180 ms is the
        mean of iterations 1 (5868 ms) and 2 (~493 ms). Timers are still divided by log_interval:
        the parser's _complete fixes that.

        A first record whose iteration is not a multiple of log_interval can only be such a log.
        With log interval 1 the first record (iteration 1) looks like any other, and versions
        without the first-iteration log reset after it: the next record then decides by its own
        numbers (_looks_unreset). Without a log interval or evidence: the gap to the previous one.
        """
        li = log_interval
        prev = self.prev
        self.prev = rec
        # First record seen, a restart, or a run resumed after start-up output (iteration 21 after
        # a checkpoint of 20 is a run's first log too, whatever the previous record's number).
        if prev is None or rec.iteration <= prev.iteration or rec.first_of_run:
            if li and rec.iteration % li:
                self._first = "certain"
                return 1
            if rec.iteration == 1 or (rec.first_of_run and li == 1):
                self._first = "maybe"
                return 1
            self._first = None
            return li
        gap = rec.iteration - prev.iteration
        state, self._first = self._first, None
        if state == "certain" or (state == "maybe" and _looks_unreset(prev, rec, gap)):
            return gap + 1
        return gap


def _looks_unreset(prev: StepRecord, rec: StepRecord, gap: int) -> bool:
    """Does ``rec``'s step time average ``prev``'s iteration in too (no reset after ``prev``)?

    The wall-clock gap between the two lines is the time of the ``gap`` new iterations. Without
    a reset the printed mean is (prev's time + that) / (gap + 1); with one, that / gap.
    """
    p_end, r_end, p_step, r_step = prev.end_time, rec.end_time, prev.step_time_ms, rec.step_time_ms
    if p_end is None or r_end is None or p_step is None or r_step is None:
        return False
    wall_ms = (r_end - p_end) * 1000.0
    if wall_ms <= 0:
        return False
    with_reset = wall_ms / gap
    without_reset = (p_step + wall_ms) / (gap + 1)
    return abs(r_step - without_reset) < abs(r_step - with_reset)
