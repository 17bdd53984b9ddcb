"""A job gone silent, for the liveness and stall tests: its newest step record arrived a while ago.

Through the state's ingest, as the state store's replay gives a record its first arrival: the newest
record again (a redelivery: it replaces itself), with when it arrived. No reach into the job store,
and the state's change count moves, so the next snapshot shows the silence."""

from __future__ import annotations

from perfd.aggregator.state import AggregatorState


def arrived_ago(st: AggregatorState, agent: str, job: str, seconds: float) -> float:
    """Make ``job``'s newest record (``agent``'s) have arrived ``seconds`` ago; returns now (the state's
    clock's)."""
    now = st.clock.time()
    newest = max(st.step_records(job), key=lambda r: r.iteration)
    st.ingest_steps(agent, [newest], now=now - seconds)
    return now
