"""One rank's step-hook records fed to a real AggregatorState, from a shape of (data wait, compute) ms
per step: the incident tests that replay a recorded stretch's shape (test_merged_stretch,
test_split_stretch)."""

from __future__ import annotations

import time

from perfd.aggregator.state import AggregatorState
from perfd.core.model import HOOK_COMPUTE, HOOK_DATA_WAIT, StepRecord, TimerValue


def jitter(i: int) -> float:
    return (i * 7919 % 13) / 13 * 0.6  # a steady loop's few tenths of a ms, deterministic


def hook_state(job: str, shape: list[tuple[float, float]], every: int = 25) -> AggregatorState:
    """The records ending now, analysed every ``every`` steps as the live refresher would."""
    st = AggregatorState(min_recompute_s=0.0)
    t = time.time() - sum(d + c for d, c in shape) / 1e3 - 5
    for i, (d, c) in enumerate(shape, start=1):
        t += (d + c) / 1e3
        timers = {HOOK_DATA_WAIT: TimerValue(d, d, {0: d}), HOOK_COMPUTE: TimerValue(c, c, {0: c})}
        st.ingest_steps("agent-a", [StepRecord(job=job, iteration=i, rank=0, end_time=t, step_time_ms=d + c,
                                               interval=1, timers=timers)])
        if i % every == 0:
            st.analysis(job, force=True)
    st.analysis(job, force=True)
    return st
