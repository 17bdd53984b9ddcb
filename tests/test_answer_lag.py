"""benchmarks/answer_lag.py: an iteration's answer lag is measured to the first poll from which on its
row gave its final answer, never to an earlier poll that showed the iteration with some ranks only."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.answer_lag import AnswerWatch


def _row(it: int, end: float, rank: int | None, mfu: float | None = 0.4) -> dict[str, object]:
    return {"iteration": it, "end_time": end, "rank": rank, "mfu": mfu}


def test_the_lag_is_to_the_poll_from_which_the_row_gave_its_final_answer() -> None:
    w = AnswerWatch(lambda r: (r.get("mfu"), r.get("rank")))
    # Iteration 5 ends at 100.0: one shard's ranks (slowest 3) at 100.4, then 3 again after a flip
    # to 9 and back, the final slowest rank 7 from 101.2 on.
    for t, rank in ((100.4, 3), (100.8, 7), (101.0, 3), (101.2, 7), (101.6, 7)):
        w.note(t, [_row(5, 100.0, rank)])
    w.note(101.6, [_row(6, 101.5, 1)])  # iteration 6: seen settled at once (0.1 s)
    w.note(101.7, [_row(7, 101.6, 2)])  # iteration 7: never gives its final answer while polled
    got = w.lags([_row(5, 100.0, 7), _row(6, 101.5, 1), _row(7, 101.6, 4)])
    assert got["n"] == 2 and got["unsettled"] == 1
    assert got["s"] is not None and got["s"]["max"] == 1.2 and got["s"]["p50"] == 1.2
    # Iterations before the window's first are left out.
    assert w.lags([_row(5, 100.0, 7), _row(6, 101.5, 1)], first_iteration=6)["n"] == 1


def test_an_absent_part_of_the_answer_is_compared_as_absent() -> None:
    w = AnswerWatch(lambda r: (r.get("mfu"), r.get("rank")))
    w.note(10.5, [_row(1, 10.0, 2, mfu=None)])
    w.note(11.0, [_row(1, 10.0, 2, mfu=0.3)])
    got = w.lags([_row(1, 10.0, 2, mfu=0.3)])
    assert got["s"] == {"p50": 1.0, "p99": 1.0, "max": 1.0}
