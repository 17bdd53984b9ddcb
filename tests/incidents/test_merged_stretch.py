"""A data slowdown that runs straight into slow steps of another kind is one incident (the steps
between were slow too), and the data wait is still named when it is most of what the incident lost.

Seen in CI on a loaded 2-core machine: the CPU-only hook loop's 40 data-slow steps (40 ms waits on
12 ms steps) ran into 54 steps slowed ~1.3x by the load; the incident's median step was not
data-bound, so it read "not explained" although the data wait was ~90% of its cost.
"""

from __future__ import annotations

from perfd.aggregator.state import AggregatorState
from tests.incidents.hook_steps import hook_state, jitter

JOB = "merged"


def _state(shape: list[tuple[float, float]]) -> AggregatorState:
    return hook_state(JOB, shape)


def test_a_data_stretch_that_runs_into_load_is_still_named_data_wait() -> None:
    shape = ([(4 + jitter(i), 12.0) for i in range(60)] + [(40 + jitter(i), 12.0) for i in range(40)]
             + [(4 + jitter(i), 17.0) for i in range(60)] + [(4 + jitter(i), 12.0) for i in range(70)])
    st = _state(shape)
    incs = [i for i in st.incidents.incidents(JOB) if (i["cost_s"] or 0) > 0.5]
    (inc,) = [i for i in incs if i["first_iteration"] <= 80 <= i["last_iteration"]]
    assert inc["last_iteration"] > 120  # one stretch, the load's steps in it
    assert inc["verdict"]["cause"] == "data_wait", inc["cause"]


def test_a_load_stretch_with_a_few_data_slow_steps_is_not_called_data_wait() -> None:
    """The other side of the rule: data that is a small part of the cost does not name the incident."""
    shape = ([(4 + jitter(i), 12.0) for i in range(60)] + [(40 + jitter(i), 12.0) for i in range(4)]
             + [(4 + jitter(i), 30.0) for i in range(60)] + [(4 + jitter(i), 12.0) for i in range(70)])
    st = _state(shape)
    incs = [i for i in st.incidents.incidents(JOB) if (i["cost_s"] or 0) > 0.5]
    (inc,) = [i for i in incs if i["first_iteration"] <= 100 <= i["last_iteration"]]
    assert inc["verdict"]["cause"] != "data_wait", inc["cause"]
