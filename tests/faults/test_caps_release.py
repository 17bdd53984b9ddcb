"""The caps count what is held now, over the aggregator's life and across a kill -9 (issue: "a daemon
that lives for months", item 1). Before, the set of held job names only grew and was restored at a
restart: with ``--max-jobs 3`` the fourth job was refused although the first three had ended; one
Hello naming 1,000 jobs took the default cap for good; 5,000 junk series of one stream left no room
for a real agent's.

A real ``perfd aggregator`` process with a state dir; the agents are real gRPC clients (the
transport's own AgentClient) that connect, send and go away. The figures printed are recorded in
docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from perfd.core import limits as L
from perfd.core.model import Sample, StepRecord
from perfd.transport.client import AgentClient
from tests.faults.streams import streaming
from tests.inproc import pipeline
from tests.procs import NOT_YET, Procs, get_json, run_env, start_aggregator, wait_for

pytestmark = pytest.mark.slow


async def _send(target: str, agent: str, *, jobs: Iterable[str] = (), steps: Iterable[StepRecord] = (),
                samples: Iterable[Sample] = (), stay_s: float = 0.0) -> None:
    """One agent: Hello (naming ``jobs``), one batch, flushed; its stream stays open ``stay_s``,
    then closes (the agent is gone)."""
    c = AgentClient(target, agent, jobs=list(jobs))
    steps, samples = list(steps), list(samples)
    if steps or samples:
        c.submit(samples=samples, steps=steps)
    async with streaming(c):
        assert await c.flush(30)
        await asyncio.sleep(stay_s)


def _steps(job: str) -> list[StepRecord]:
    now = time.time()
    return [StepRecord(job=job, iteration=i, rank="last", end_time=now, step_time_ms=100.0) for i in (1, 2)]


def _stats(base: str) -> dict[str, Any]:
    got: dict[str, Any] = get_json(base + "/api/stats")
    return got


def _held(base: str) -> int:
    return int(_stats(base)["transport"]["jobs_held"])


def _jobs(base: str) -> dict[str, str]:
    return {j["job"]: j["state"] for j in get_json(base + "/api/jobs")["jobs"]}


def _kill9_and_restart(procs: Procs, args: list[str]) -> str:
    for name, _role, p in procs.procs:
        if name == "aggregator" and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(10)
    (procs.out / "agg.ready").unlink(missing_ok=True)
    return start_aggregator(procs, *args, name="aggregator")[2]


@pytest.mark.e2e
def test_the_jobs_cap_frees_as_jobs_end_and_after_a_kill9(tmp_path: Path) -> None:
    args = ["--max-jobs", "3", "--job-stale-after", "2", "--no-rules", "--rules-interval", "0.5",
            "--state-dir", str(tmp_path / "state")]
    with Procs(tmp_path, run_env()) as procs:
        grpc, _http, base = start_aggregator(procs, *args)
        target = f"127.0.0.1:{grpc}"
        for k in (1, 2, 3):
            asyncio.run(_send(target, f"node-{k}", jobs=[f"job-{k}"], steps=_steps(f"job-{k}")))
        wait_for(lambda: set(_jobs(base).values()) == {"ended"} and len(_jobs(base)) == 3, 30,
                 "three jobs ended", ignore=NOT_YET)
        asyncio.run(_send(target, "node-4", jobs=["job-4"], steps=_steps("job-4")))
        jobs = wait_for(lambda: "job-4" in (j := _jobs(base)) and j, 30, "job-4 held", ignore=NOT_YET)
        st = _stats(base)["transport"]
        assert st.get("refused_jobs_cap", 0) == 0
        assert len(jobs) == 3 and "job-1" not in jobs  # the job that ended first made room
        assert st["jobs_held"] == 3 and st["jobs_pruned"] >= 1

        # kill -9, restart on the same state: the replay holds what was held (each row at the time it
        # first arrived, so the ended jobs are still ended), and a fifth job gets in.
        base = _kill9_and_restart(procs, args)
        assert _held(base) <= 3
        grpc = int((tmp_path / "agg.ready").read_text().split()[0])
        asyncio.run(_send(f"127.0.0.1:{grpc}", "node-5", jobs=["job-5"], steps=_steps("job-5")))
        jobs = wait_for(lambda: "job-5" in (j := _jobs(base)) and j, 30, "job-5 held after the restart",
                        ignore=NOT_YET)
        st = _stats(base)["transport"]
        print(f"FIGURES jobs cap: --max-jobs 3, jobs held after 5 jobs and a kill -9: {sorted(jobs)}; "
              f"refused at the cap: {st.get('refused_jobs_cap', 0)}")
        assert st.get("refused_jobs_cap", 0) == 0 and len(jobs) <= 3


@pytest.mark.e2e
def test_a_hello_naming_1000_jobs_holds_its_quota_and_only_while_its_stream_is_open(tmp_path: Path) -> None:
    args = ["--no-rules", "--rules-interval", "0.5", "--state-dir", str(tmp_path / "state")]
    with Procs(tmp_path, run_env()) as procs:
        grpc, _http, base = start_aggregator(procs, *args)
        target = f"127.0.0.1:{grpc}"

        async def flood_then_real() -> tuple[int, dict[str, Any]]:
            flood = asyncio.create_task(_send(target, "flooder", jobs=[f"junk-{i:04d}" for i in range(1000)],
                                              stay_s=3.0))
            held = await asyncio.to_thread(wait_for, lambda: _held(base) == L.MAX_JOBS_PER_AGENT, 15,
                                           "the flooder's quota held", ignore=NOT_YET)
            await _send(target, "real", jobs=["train"], steps=_steps("train"))
            during = _stats(base)
            await flood
            return held, during

        asyncio.run(flood_then_real())
        during = _stats(base)
        # While the flooder's stream was open it held its quota of the cap, no more: the real job got in.
        assert "train" in _jobs(base)
        assert during["transport"]["refused_jobs_quota"] == 1000 - L.MAX_JOBS_PER_AGENT
        assert during["refused_by_agent"]["flooder"]["jobs_quota"] == 1000 - L.MAX_JOBS_PER_AGENT
        # Its stream closed: the jobs it only named are released.
        wait_for(lambda: _held(base) == 1, 30, "the flooder's jobs released", ignore=NOT_YET)
        assert set(_jobs(base)) == {"train"}
        # ... and they stay released after a kill -9 and a restart (its Hello is in the journal).
        base = _kill9_and_restart(procs, args)
        held = wait_for(lambda: _held(base) == 1 and _held(base), 30, "one job held after the restart",
                        ignore=NOT_YET)
        print(f"FIGURES hello flood: 1,000 jobs named by one Hello: {L.MAX_JOBS_PER_AGENT} held while its "
              f"stream was open, {held} job held after it closed and after a kill -9")
        assert set(_jobs(base)) == {"train"}


def _series(agent: str, n: int) -> list[Sample]:
    t = time.time()
    return [Sample("perfd_gpu_power_watts", float(i), t, {"node": agent, "gpu": str(i % 8),
                                                          "uuid": f"GPU-{agent}-{i:06d}"}) for i in range(n)]


def test_one_agent_cannot_take_the_series_cap_and_a_gone_agent_releases_it(tmp_path: Path) -> None:
    args = ["--max-series", "5000", "--max-series-per-agent", "1000", "--agent-retention", "2",
            "--no-rules", "--rules-interval", "0.5"]
    with pipeline(tmp_path, *args) as p:  # in the test's process (tests/inproc.py)
        base, target = p.base, p.target

        async def agents() -> dict[str, Any]:
            junk = asyncio.create_task(_send(target, "junk", samples=_series("junk", 5000)))
            await asyncio.to_thread(wait_for, lambda: _stats(base)["transport"].get("refused_series_cap", 0),
                                    10, "the 5,000-series agent refused", ignore=NOT_YET)
            junk.cancel()
            # junk2 stays connected until real's series are held beside its own (gone before, it could
            # be forgotten before real's stream came up on a loaded machine: 1,050 never held at once).
            junk2 = asyncio.create_task(_send(target, "junk2", samples=_series("junk2", 1000), stay_s=120.0))
            real = asyncio.create_task(_send(target, "real", samples=_series("real", 50), stay_s=120.0))
            held = lambda: _stats(base)["transport"]["series_held"]  # noqa: E731
            await asyncio.to_thread(wait_for, lambda: held() == 1050, 60,
                                    "junk2's 1,000 and real's 50 series held", ignore=NOT_YET, progress=held)
            # junk2 goes: 2 s later (--agent-retention) it is forgotten and its series leave the cap.
            junk2.cancel()
            await asyncio.to_thread(wait_for, lambda: held() == 50, 60, "junk2's series released",
                                    ignore=NOT_YET)
            out = _stats(base)
            real.cancel()
            return out

        try:
            st = p.call(agents(), "the three agents' series held and released", 180)
        except asyncio.CancelledError:
            pytest.fail("an agent task was cancelled")
        t = st["transport"]
        print(f"FIGURES series: --max-series 5000 --max-series-per-agent 1000: an agent defining 5,000 "
              f"series refused ({t['refused_series_cap']} refusals), one of 1,000 held; 2 s after it left, "
              f"{t['series_held']} series held (the real agent's), {t['agents_forgotten']} agent(s) "
              "forgotten")
        assert t["agents_forgotten"] >= 1 and "real" in st["agents_seen"] and "junk2" not in st["agents_seen"]
