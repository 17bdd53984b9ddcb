"""A data slowdown that runs straight into slow steps of another kind is one incident (the steps
between were slow too), and the data wait is still named when it is most of what the incident lost.

Seen in CI on a loaded 2-core machine: the CPU-only hook loop's 40 data-slow steps (40 ms waits on
12 ms steps) ran into 54 steps slowed ~1.3x by the load; the incident's median step was not
data-bound, so it read "not explained" although the data wait was ~90% of its cost.
"""

from __future__ import annotations

import time

from perfd.aggregator.state import AggregatorState
from perfd.model import HOOK_COMPUTE, HOOK_DATA_WAIT, StepRecord, TimerValue

JOB = "merged"


def _state(shape: list[tuple[float, float]]) -> AggregatorState:
    """One rank's hook records: (data wait, compute) in ms per step, ending now."""
    st = AggregatorState(min_recompute_s=0.0)
    t = time.time() - sum(d + c for d, c in shape) / 1e3 - 5
    for i, (d, c) in enumerate(shape, start=1):
        t += (d + c) / 1e3
        timers = {HOOK_DATA_WAIT: TimerValue(d, d, {0: d}), HOOK_COMPUTE: TimerValue(c, c, {0: c})}
        st.ingest_steps("agent-a", [StepRecord(job=JOB, iteration=i, rank=0, end_time=t, step_time_ms=d + c,
                                               interval=1, timers=timers)])
        if i % 25 == 0:
            st.analysis(JOB, force=True)
    st.analysis(JOB, force=True)
    return st


def _jitter(i: int) -> float:
    return (i * 7919 % 13) / 13 * 0.6  # a steady loop's few tenths of a ms, deterministic


def test_a_data_stretch_that_runs_into_load_is_still_named_data_wait() -> None:
    shape = ([(4 + _jitter(i), 12.0) for i in range(60)] + [(40 + _jitter(i), 12.0) for i in range(40)]
             + [(4 + _jitter(i), 17.0) for i in range(60)] + [(4 + _jitter(i), 12.0) for i in range(70)])
    st = _state(shape)
    incs = [i for i in st.incidents.incidents(JOB) if (i["cost_s"] or 0) > 0.5]
    (inc,) = [i for i in incs if i["first_iteration"] <= 80 <= i["last_iteration"]]
    assert inc["last_iteration"] > 120  # one stretch, the load's steps in it
    assert inc["verdict"]["cause"] == "data_wait", inc["cause"]


def test_a_load_stretch_with_a_few_data_slow_steps_is_not_called_data_wait() -> None:
    """The other side of the rule: data that is a small part of the cost does not name the incident."""
    shape = ([(4 + _jitter(i), 12.0) for i in range(60)] + [(40 + _jitter(i), 12.0) for i in range(4)]
             + [(4 + _jitter(i), 30.0) for i in range(60)] + [(4 + _jitter(i), 12.0) for i in range(70)])
    st = _state(shape)
    incs = [i for i in st.incidents.incidents(JOB) if (i["cost_s"] or 0) > 0.5]
    (inc,) = [i for i in incs if i["first_iteration"] <= 100 <= i["last_iteration"]]
    assert inc["verdict"]["cause"] != "data_wait", inc["cause"]
