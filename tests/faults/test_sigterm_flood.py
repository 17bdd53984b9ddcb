"""SIGTERM while a series flood saturates the aggregator's event loop: it still exits cleanly, its stop
run to its end before its own deadline (the 5 s promised, docs/reliability.md) forces an exit. Before,
it took 6.0 s in the issue's run, and up to 26 s here: the loop reached the stop only after every batch
ready before it, went on delivering batches through the gRPC grace, and the interpreter then freed a
million series one by one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.procs import WaitTimeout, free_port, http_get, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
ROOT = Path(__file__).resolve().parents[2]

# 20 agents, each defining 2,500 new series per batch, 20 batches each: a million series.
FLOOD = r'''
import asyncio, sys
from perfd.core.model import Sample
from perfd.transport import AgentClient

async def one(addr, i):
    c = AgentClient(addr, f"flood-{i}", node=f"n{i}", jobs=[f"flood-job-{i}"], backoff_initial_s=0.05,
                    backoff_max_s=0.5)
    t = asyncio.create_task(c.run())
    # Connected (its Hello answered) before its flood: a Hello names every series defined so far, and
    # with the flood's batches submitted first each was ~50,000 series, which a loaded machine's
    # aggregator did not have within its 10 s Hello timeout: refused, reconnected with a larger one,
    # and no sample went in for a minute (seen twice). Bounded: a client not connected in 60 s ends
    # the flood, saying so (the test shows the flood's output).
    for _ in range(1200):
        if c.connected:
            break
        await asyncio.sleep(0.05)
    else:
        raise SystemExit(f"flood-{i}: never connected in 60 s: {c.counters()}")
    for b in range(20):
        c.submit([Sample("perfd_gpu_utilization_ratio", 0.5, 1.0, {"gpu": str(b * 2500 + k), "x": str(i)})
                  for k in range(2500)])
        await asyncio.sleep(0.05)
    await c.flush(120)
    t.cancel()

async def main(addr):
    await asyncio.gather(*(one(addr, i) for i in range(20)))

asyncio.run(main(sys.argv[1]))
'''


@pytest.mark.e2e
def test_sigterm_during_a_series_flood_exits_within_5_s(tmp_path: Path) -> None:
    g, h = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "agg.out"
    agg = subprocess.Popen([sys.executable, "-m", "perfd.app.cli", "aggregator", "--grpc-port", str(g),
                            "--http-port", str(h)], cwd=ROOT, env=env, stdout=out.open("wb"),
                           stderr=subprocess.STDOUT)
    flood = None
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{h}/healthz"), 30, "aggregator up")
        flood_out = tmp_path / "flood.out"  # its agents' warnings (a refused or ended stream)
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, f"127.0.0.1:{g}"], cwd=ROOT, env=env,
                                 stdout=flood_out.open("wb"), stderr=subprocess.STDOUT)

        def samples() -> float:
            m = re.search(rb"^perfd_aggregator_samples_total (\S+)",
                          http_get(f"http://127.0.0.1:{h}/metrics", 30), re.M)
            return float(m.group(1)) if m else 0.0

        # While the count moves (two suites at once on 2 CPUs: 100,000 took over 120 s).
        try:
            wait_for(lambda: samples() >= 100_000, 60, "the flood under way", interval=0.5, progress=samples)
        except WaitTimeout as exc:  # a fresh clone's run once stood at 0 for 60 s: say what each side saw
            raise WaitTimeout(f"{exc}\nflood (exit {flood.poll()}) ends:\n"
                              f"{flood_out.read_text(errors='replace')[-3000:]}\naggregator ends:\n"
                              f"{out.read_text(errors='replace')[-3000:]}") from exc
        t0 = time.monotonic()
        agg.send_signal(signal.SIGTERM)
        try:  # a failure's bound only: the 5 s promised is the aggregator's own deadline, below
            rc = agg.wait(60.0)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - t0
        text = out.read_text(errors="replace")
        assert rc == 0, f"not ended 60 s after SIGTERM (rc {rc}); output ends:\n{text[-4000:]}"
        # The stop ran its course: the aggregator's deadline's forced exit (SHUTDOWN_BUDGET_S after the
        # signal, "not stopped ...": also exit status 0) was not needed. The seconds are this machine's
        # (printed; `perfd bench shutdown` measures a stop's).
        assert "not stopped" not in text, text[-4000:]
        print(f"SIGTERM during a series flood: exited in {took:.2f} s")
    finally:
        for p in (agg, flood):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
