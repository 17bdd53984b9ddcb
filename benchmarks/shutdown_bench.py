"""`perfd bench shutdown`: how long an aggregator's stop takes while its rules tick is in housekeeping,
against its shutdown budget (perfd.aggregator.daemon.SHUTDOWN_BUDGET_S).

    perfd bench shutdown [--rounds 5] [--tick-s 1.5] [--json]

Each round, in this process: an aggregator with a state dir (its real store, gRPC server and rules loop)
is given three jobs' steps, its housekeeping held ``--tick-s`` (a tick over many jobs), and stopped
while the tick runs: the stop waits for the tick, then closes the store. The seconds from the stop's
call to its return, per round. The suite asserts the order (the tick ends before the store closes,
nothing fails: tests/faults/test_clean_stop.py); the seconds are the machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfd.aggregator.daemon import SHUTDOWN_BUDGET_S, Aggregator, AggregatorConfig  # noqa: E402
from perfd.core.model import StepRecord  # noqa: E402
from perfd.transport.client import AgentClient  # noqa: E402


async def one_stop(state: Path, tick_s: float) -> float:
    agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], rules_interval_s=0.05,
                                      state_dir=str(state)))
    await agg.start()
    t0 = time.time() - 5
    c = AgentClient(f"127.0.0.1:{agg.grpc_port}", "a1", jobs=[])
    c.submit(steps=[StepRecord(job=f"j{k}", iteration=i, rank="last", end_time=t0 + i, step_time_ms=10.0)
                    for k in range(3) for i in range(1, 4)])
    task = asyncio.create_task(c.run())
    try:
        if not await c.flush(60):
            raise RuntimeError("the steps were not acknowledged")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    entered = threading.Event()
    real = agg.lifecycle.housekeeping

    def slow_housekeeping() -> None:
        entered.set()
        time.sleep(tick_s)
        real()

    agg.lifecycle.housekeeping = slow_housekeeping  # type: ignore[method-assign]
    if not await asyncio.to_thread(entered.wait, 30):
        raise RuntimeError("no housekeeping tick within 30 s")
    t = time.monotonic()
    await agg.stop()
    return time.monotonic() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench shutdown", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="stops (default %(default)s)")
    ap.add_argument("--tick-s", type=float, default=1.5,
                    help="seconds the housekeeping is held (default %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.tick_s < 0:
        ap.error("--rounds must be positive and --tick-s not negative")
    stops = []
    with tempfile.TemporaryDirectory(prefix="perfd-shutdown-") as tmp:
        for r in range(a.rounds):
            stops.append(round(asyncio.run(one_stop(Path(tmp) / f"state{r}", a.tick_s)), 3))
            if not a.json:
                print(f"round {r + 1}: stop took {stops[-1]:.3f} s", flush=True)
    res = {"tick_s": a.tick_s, "budget_s": SHUTDOWN_BUDGET_S, "stop_s": stops,
           "stop_s_median": round(statistics.median(stops), 3), "stop_s_max": max(stops),
           "within_budget": sum(s <= SHUTDOWN_BUDGET_S for s in stops)}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"stop with a {a.tick_s:g} s tick: median {res['stop_s_median']} s, max {res['stop_s_max']} s; "
              f"{res['within_budget']} of {len(stops)} within the {SHUTDOWN_BUDGET_S:g} s budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
