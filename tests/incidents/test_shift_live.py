"""A lasting shift seen live: the real aggregator (in the test's process,
tests/inproc.py) fed over gRPC as the job runs, steps 60 → 90 ms from iteration 151 to the end at 300.
Before, the incident the shift opened closed near iteration 250 as the steady median adapted, and the
rest was counted nowhere; now it stays open as a change point, its cost (Σ step − 60 ms) counted to the
end and in goodput, until ``POST /api/jobs/<job>/new-normal`` takes 90 ms as the new normal. The figures
printed are recorded in docs/reliability.md."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from perfd.core.model import StepRecord
from perfd.transport.client import AgentClient
from tests.inproc import pipeline
from tests.procs import NOT_YET, get_json, wait_for

pytestmark = pytest.mark.slow


def steps(first: int, last: int, t_end: float) -> list[StepRecord]:
    """Iterations first..last of the run, the last ending at ``t_end``."""
    ms = [60.0 if i < 151 else 90.0 for i in range(1, 301)]
    t = t_end - sum(ms[first - 1:last]) / 1e3
    out = []
    for i in range(first, last + 1):
        t += ms[i - 1] / 1e3
        out.append(StepRecord(job="shift", iteration=i, rank="last", end_time=t, step_time_ms=ms[i - 1],
                              interval=1))
    return out


def incident(base: str) -> dict[str, Any] | None:
    incs = get_json(f"{base}/api/jobs/shift/incidents")["incidents"]
    return incs[0] if len(incs) == 1 else None


def reached(base: str, k: int) -> bool:
    i = incident(base)
    return i is not None and i["last_iteration"] >= k


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        got: dict[str, Any] = json.loads(r.read())
    return got


def test_a_lasting_shift_stays_counted_until_taken_as_the_new_normal(tmp_path: Path) -> None:
    with pipeline(tmp_path, "--no-rules", "--rules-interval", "0.5") as p:
        base = p.base

        async def run() -> dict[str, Any]:
            c = AgentClient(p.target, "node-a", jobs=["shift"])
            task = asyncio.create_task(c.run())
            try:
                now = time.time()
                c.submit(steps=steps(1, 200, now - 12.0))
                assert await c.flush(30)
                first: dict[str, Any] = await asyncio.to_thread(
                    wait_for, lambda: (i := incident(base)) is not None and i["open"] and i, 30,
                    "the slowdown's incident open", ignore=NOT_YET)
                for k in range(201, 301, 20):  # the rest of the run, as it comes
                    c.submit(steps=steps(k, k + 19, now + (k - 201) * 0.09))
                    assert await c.flush(30)
                    await asyncio.to_thread(wait_for, functools.partial(reached, base, k), 30,
                                            f"the analysis at iteration {k}", ignore=NOT_YET)
                return first
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        first = p.call(run(), "the run's batches and the analysis following them", 240)
        at_end = p.wait(lambda: (i := incident(base)) is not None and i["last_iteration"] == 300 and i, 30,
                        "the incident at the end of the run")
        gp = p.wait(lambda: (g := get_json(f"{base}/api/jobs/shift/summary").get("goodput"))
                    and g["parts_s"]["incident"] > 4.0 and g, 30, "goodput")
        got = post(f"{base}/api/jobs/shift/new-normal", {"iteration": 220})
        closed = p.wait(lambda: (i := incident(base)) is not None and not i["open"] and i, 30,
                        "the incident closed")
        gp2 = get_json(f"{base}/api/jobs/shift/summary")["goodput"]
        events = [e["kind"] for e in get_json(f"{base}/api/events?job=shift")["events"]]
        print(f"FIGURES lasting shift live: opened at iteration {first['first_iteration']}; at the end "
              f"(300) open={at_end['open']}, kinds {at_end['kinds']}, cost {at_end['cost_s']:.2f} s, goodput "
              f"incident part {gp['parts_s']['incident']:.2f} s; after POST new-normal 220: closed at "
              f"{closed['last_iteration']}, cost {closed['cost_s']:.2f} s, goodput incident "
              f"{gp2['parts_s']['incident']:.2f} s; {got['change_points']}")
        assert at_end["open"] and "level-shift" in at_end["kinds"]
        assert at_end["cost_s"] == pytest.approx(150 * 0.030, rel=1e-3)
        assert gp["parts_s"]["incident"] == pytest.approx(at_end["cost_s"], rel=1e-3)
        assert got["new_normal_at"] == 220
        assert closed["last_iteration"] == 219 and closed["cost_s"] == pytest.approx(69 * 0.030, rel=1e-3)
        assert gp2["parts_s"]["incident"] == pytest.approx(closed["cost_s"], rel=1e-3)
        assert "incident_closed" in events
