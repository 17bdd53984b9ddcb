"""50,000 job names from one client (the issue's probe grew the aggregator to 721 MB with a 22.7 s
/metrics): past the client's quota of the job cap every new name is refused and counted, and a
scrape stays small. Real gRPC and HTTP servers on loopback; the figures printed are recorded in
docs/reliability.md. What the process's RSS does through the flood is the machine's: `perfd bench
memory --scenario job-flood`."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.core import limits as L
from perfd.core.model import StepRecord
from perfd.transport.client import AgentClient

pytestmark = pytest.mark.slow
N_JOBS = 50_000


def test_fifty_thousand_job_names_are_refused_past_the_cap() -> None:
    async def main() -> tuple[float, int, int]:
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[]))
        await agg.start()
        try:
            c = AgentClient(f"127.0.0.1:{agg.grpc_port}", "flooder", jobs=[])
            for i in range(0, N_JOBS, 1000):
                c.submit(steps=[StepRecord(job=f"job-{j:06d}", iteration=1, step_time_ms=1.0)
                                for j in range(i, i + 1000)])
            task = asyncio.create_task(c.run())
            assert await c.flush(120)
            task.cancel()
            assert agg.http is not None
            t0 = time.monotonic()
            body = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{agg.http.port}/metrics",  # type: ignore[union-attr]
                                               timeout=60).read())
            scrape_s = time.monotonic() - t0
            return scrape_s, len(agg.state.job_names()), len(body)
        finally:
            await agg.stop()

    scrape_s, jobs, metrics_bytes = asyncio.run(main())
    print(f"FIGURES job flood: {N_JOBS} names sent, {jobs} held, {N_JOBS - jobs} refused; "
          f"/metrics {metrics_bytes} bytes in {scrape_s:.2f} s")
    # One client holds at most its own quota of the cap (perfd.aggregator.guard): the rest of the cap
    # stays for the other agents.
    assert jobs == L.MAX_JOBS_PER_AGENT
