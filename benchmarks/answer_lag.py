"""How far behind a job's end the answer the API serves is: for each iteration, the time from its end
to the first poll of the root's /api/jobs/<job>/iterations from which on its row gave the answer it
gives at the end of the run (MFU, the slowest rank, the exposed communication: what
``perfd bench engine`` reads as the answer), and so held every rank that decides it. Pure.

The figure is an upper bound: a poll's time is when its response was read, so each lag is over by up
to the polling period and the request's own time (both in the result). An iteration whose row never
gave its final answer while polled (it settled after the window) is counted apart, not guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Answer = tuple[Any, ...]
# How many of the newest rows each poll keeps: the iterations still settling (a 2 s iteration settles
# within a few seconds; older rows no longer change).
NEWEST_ROWS = 8


@dataclass
class AnswerWatch:
    """Feed every poll's rows (``note``), then the rows after the run drained (``lags``)."""

    answer_of: Callable[[Mapping[str, Any]], Answer]
    seen: dict[int, list[tuple[float, Answer]]] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)

    def note(self, t: float, rows: Sequence[Mapping[str, Any]]) -> None:
        """One poll read at wall time ``t``: its newest rows' answers."""
        its = sorted((int(r["iteration"]), r) for r in rows if "iteration" in r)
        for it, row in its[-NEWEST_ROWS:]:
            if row.get("end_time") is None:
                continue
            self.ends[it] = float(row["end_time"])
            self.seen.setdefault(it, []).append((t, self.answer_of(row)))

    def lags(self, final_rows: Sequence[Mapping[str, Any]], first_iteration: int = 0) -> dict[str, Any]:
        """Per iteration polled (from ``first_iteration``: the window's), seconds from its end to the
        first poll from which on its row gave its final answer; their quantiles, and how many never
        settled while polled."""
        final = {int(r["iteration"]): self.answer_of(r) for r in final_rows if "iteration" in r}
        lags: list[float] = []
        unsettled = 0
        for it, polls in sorted(self.seen.items()):
            if it < first_iteration or it not in final:
                continue
            settled_at = None
            for t, answer in polls:
                if answer != final[it]:
                    settled_at = None
                elif settled_at is None:
                    settled_at = t
            if settled_at is None:
                unsettled += 1
            else:
                lags.append(max(0.0, settled_at - self.ends[it]))
        return {"n": len(lags), "unsettled": unsettled, "s": _quantiles(lags)}


def _quantiles(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    s = sorted(xs)
    return {"p50": round(s[len(s) // 2], 3), "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 3),
            "max": round(s[-1], 3)}
