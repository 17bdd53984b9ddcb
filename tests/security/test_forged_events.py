"""Events about a job only from the agents that host it; capture results only from the agents the
capture was sent to. A real aggregator on loopback, in the test's process
(``perfd aggregator``'s configuration: tests/inproc.py; on the test's clock where the job's silence
matters: perfd.core.clock), two real gRPC agents (the transport's own AgentClient): the job's host, and a
stranger hosting another job.

The issue's probe: a gRPC client that does not host a job sent ``job_phase`` events for it, reported
one of its ranks "stopped" (the job read stalled in 2 s) and put its forged stack into that job's
incident; a stranger's ``capture_finished`` naming an existing capture's command id flipped it from
failed to finished with a forged result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.core import limits as L
from perfd.core.clock import ManualClock
from perfd.core.model import StepRecord
from perfd.transport.client import AgentClient
from perfd.transport.codec import Command
from tests.faults.streams import streaming
from tests.inproc import pipeline
from tests.procs import get_json, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
JOB = "victim"


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _refused(base: str) -> dict[str, int]:
    return {k[len("refused_"):]: v for k, v in get_json(f"{base}/api/stats")["transport"].items()
            if k.startswith("refused_") and isinstance(v, int)}


def _forged(cid: str, now: float) -> list[dict[str, Any]]:
    stopped = {"rank": 0, "pid": 4242, "source": "gpu", "state": "stopped", "state_since": now - 60,
               "observed_at": now, "cpu_cores": 0.0}
    return [
        {"kind": "job_phase", "job": JOB, "time": now, "text": "a save",
         "payload": {"job": JOB, "phase": "checkpoint", "state": "begin", "rank": 0}},
        {"kind": "rank_processes", "job": JOB, "time": now, "text": "rank 0 stopped",
         "payload": {"job": JOB, "interval_s": 1.0, "ranks": [stopped]}},
        # The payload names the victim under the stranger's own job: refused too (they must agree).
        {"kind": "rank_processes", "job": "theirs", "time": now, "text": "rank 0 stopped",
         "payload": {"job": JOB, "interval_s": 1.0, "ranks": [stopped]}},
        {"kind": "rank_stacks", "job": JOB, "time": now, "text": "stacks",
         "links": {"command_id": "guessed"},
         "payload": {"job": JOB, "command_id": "guessed", "ranks": {"0": {"pid": 4242, "stack": "FORGED"}}}},
        {"kind": "capture_finished", "job": JOB, "time": now, "text": "forged: finished",
         "labels": {"job": JOB, "tool": "kineto"}, "links": {"command_id": cid, "capture_id": cid},
         "payload": {"status": "ok", "forged": True}},
        # The same under its own job: past the guard, refused by the capture (not sent to it).
        {"kind": "capture_finished", "job": "theirs", "time": now, "text": "forged: finished",
         "labels": {"job": "theirs", "tool": "kineto"}, "links": {"command_id": cid},
         "payload": {"status": "ok", "forged": True}},
    ]


async def _scenario(target: str, base: str) -> tuple[dict[str, Any], dict[str, int], dict[str, int]]:
    got: list[Command] = []
    host = AgentClient(target, "host-agent", jobs=[JOB], on_command=got.append)
    stranger = AgentClient(target, "stranger", jobs=["theirs"])
    async with streaming(host) as h, streaming(stranger) as s:
        t0 = time.time()
        h.submit(steps=[StepRecord(job=JOB, iteration=i, rank="last", end_time=t0 - 3 + i * 0.1,
                                   step_time_ms=100.0) for i in range(1, 31)])
        s.submit(steps=[StepRecord(job="theirs", iteration=1, rank="last", end_time=t0, step_time_ms=1.0)])
        assert await h.flush(30) and await s.flush(30)
        # A capture of the victim's ranks: the command goes to its host, which reports it failed.
        cap = await asyncio.to_thread(_post, f"{base}/api/captures", {"job": JOB, "steps": 3})
        cid = cap["id"]
        await asyncio.to_thread(wait_for, lambda: got, 30, "the capture command at the host")
        h.submit(events=[{"kind": "capture_failed", "job": JOB, "time": time.time(),
                          "text": "no process known for rank 0", "labels": {"job": JOB, "tool": "auto"},
                          "links": {"command_id": cid}, "payload": {"status": "failed"}}])
        assert await h.flush(30)
        before = await asyncio.to_thread(_refused, base)
        s.submit(events=_forged(cid, time.time()))
        assert await s.flush(30)
        after = await asyncio.to_thread(_refused, base)
        rec = next(c for c in get_json(f"{base}/api/captures")["captures"] if c["id"] == cid)
        return rec, before, after


@contextlib.asynccontextmanager
async def _aggregator(clock: ManualClock) -> AsyncIterator[tuple[Aggregator, str, str]]:
    """An aggregator in process on loopback, as ``perfd aggregator --no-rules --rules-interval 0.5``
    runs, on the test's clock (perfd.core.clock): (it, its gRPC target, its HTTP base URL)."""
    agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], rules_interval_s=0.5),
                     clock=clock)
    await agg.start()
    try:
        assert agg.http is not None
        yield agg, f"127.0.0.1:{agg.grpc_port}", f"http://127.0.0.1:{agg.http.port}"
    finally:
        await agg.stop()


async def _past_the_stall_limit(agg: Aggregator, clock: ManualClock) -> None:
    """The job silent past the stall limit (5 s of silence: 8 s here) on the aggregator's clock, and
    its tick after: what the stall watch, the job's liveness and its incidents make of the silence."""
    clock.advance(8.0)
    await asyncio.to_thread(agg.tick)


async def _read(url: str) -> Any:
    return await asyncio.to_thread(get_json, url)


def test_a_stranger_cannot_speak_for_a_job_it_does_not_host() -> None:
    clock = ManualClock(time.time())

    async def main() -> tuple[Any, ...]:
        async with _aggregator(clock) as (agg, target, base):
            rec, before, after = await _scenario(target, base)
            # The job's state: no stall from the forged "stopped" rank. Past the stall limit (the
            # forged observation, 15 s fresh, would have corroborated one; the previous build: stalled).
            await _past_the_stall_limit(agg, clock)
            jobs = (await _read(f"{base}/api/jobs"))["jobs"]
            incidents = (await _read(f"{base}/api/jobs/{JOB}/incidents"))["incidents"]
            events = (await _read(f"{base}/api/events?limit=1000"))["events"]
        return rec, before, after, next(j for j in jobs if j["job"] == JOB), incidents, events

    rec, before, after, job, incidents, events = asyncio.run(main())
    assert rec["status"] == "failed" and not (rec.get("result") or {}).get("forged"), rec
    assert after.get("not_target", 0) - before.get("not_target", 0) == 1  # the capture result
    # phase, stopped (twice), stacks, the capture under the victim's name
    assert after.get("not_host", 0) - before.get("not_host", 0) == 5
    assert "stall" not in job and job["state"] != "stalled", job
    assert job["last_step_age_s"] >= 8.0, job  # the clock's silence: past the limit
    assert not any("stall" in i["kinds"] for i in incidents)
    assert not any(e.get("agent") == "stranger" and e.get("job") == JOB for e in events)


def _as_node_agent(now: float) -> list[dict[str, Any]]:
    """The attack's sequence: the victim's rank 1 on one of the stranger's GPUs (with a pid),
    then a save announcement, the rank "stopped" and a stack, as a node agent of the job would send."""
    stopped = {"rank": 1, "pid": 4243, "source": "gpu", "state": "stopped", "state_since": now - 60,
               "observed_at": now, "cpu_cores": 0.0}
    return [
        {"kind": "gpu_processes", "time": now, "labels": {"node": "n", "gpu": "0"},
         "payload": [{"pid": 4243, "rank": 1, "job": JOB, "name": "python"}]},
        {"kind": "job_phase", "job": JOB, "time": now, "text": "a save",
         "payload": {"job": JOB, "phase": "checkpoint", "state": "begin", "rank": 1}},
        {"kind": "rank_processes", "job": JOB, "time": now, "text": "rank 1 stopped",
         "payload": {"job": JOB, "interval_s": 1.0, "ranks": [stopped]}},
        {"kind": "rank_stacks", "job": JOB, "time": now, "text": "stacks", "links": {"command_id": "guessed"},
         "payload": {"job": JOB, "command_id": "guessed", "ranks": {"1": {"pid": 4243, "stack": "FORGED"}}}},
    ]


def test_a_stranger_cannot_make_itself_a_node_agent_of_a_job() -> None:
    """A client hosting another job (on another node) reports the victim's rank on its GPU, then speaks
    for the victim as a node agent would: all four refused (``not_host``), the job never stalled, its
    rank never placed on the stranger's GPU, no command to the stranger. The node's own agent (no job,
    the host's node) still places the job's rank 0 and reports its processes."""
    clock = ManualClock(time.time())
    to_stranger: list[Command] = []

    async def main() -> tuple[Any, ...]:
        async with _aggregator(clock) as (agg, target, base):
            host = AgentClient(target, "host-agent", node="node-a", jobs=[JOB])
            node_agent = AgentClient(target, "node-a/node", node="node-a")
            stranger = AgentClient(target, "stranger", node="node-b", jobs=["theirs"],
                                   on_command=to_stranger.append)
            async with streaming(host) as h, streaming(node_agent) as n, streaming(stranger) as s:
                t0 = time.time()
                h.submit(steps=[StepRecord(job=JOB, iteration=i, rank="last", end_time=t0 - 3 + i * 0.1,
                                           step_time_ms=100.0) for i in range(1, 31)])
                s.submit(steps=[StepRecord(job="theirs", iteration=1, rank="last", end_time=t0,
                                           step_time_ms=1.0)])
                assert await h.flush(30) and await s.flush(30)
                n.submit(events=[{"kind": "gpu_processes", "time": t0,
                                  "labels": {"node": "node-a", "gpu": "0"},
                                  "payload": [{"pid": 4242, "rank": 0, "job": JOB, "name": "python"}]}])
                assert await n.flush(30)
                before = await asyncio.to_thread(_refused, base)
                first, *rest = _as_node_agent(time.time())
                for batch in ([first], rest):  # in turn, as the issue sent them: the GPU first
                    s.submit(events=batch)
                    assert await s.flush(30)
                after = await asyncio.to_thread(_refused, base)
                await _past_the_stall_limit(agg, clock)  # with the job silent
            jobs = (await _read(f"{base}/api/jobs"))["jobs"]
            summary = await _read(f"{base}/api/jobs/{JOB}/summary")
            incidents = (await _read(f"{base}/api/jobs/{JOB}/incidents"))["incidents"]
            gpus = await _read(f"{base}/api/jobs/{JOB}/gpus")
            events = (await _read(f"{base}/api/events?limit=1000"))["events"]
        return before, after, next(j for j in jobs if j["job"] == JOB), summary, incidents, gpus, events

    before, after, job, summary, incidents, gpus, events = asyncio.run(main())
    assert after.get("not_host", 0) - before.get("not_host", 0) == 4, (before, after)
    assert "stall" not in job and job["state"] != "stalled", job
    assert not any("stall" in i["kinds"] for i in incidents)
    assert [(r["rank"], r["node"], r["gpu"]) for r in summary["ranks"]] == [(0, "node-a", "0")]
    assert all(g["node"] == "node-a" for g in gpus["gpus"]), gpus
    assert not to_stranger
    assert not any(e.get("agent") == "stranger" and e.get("job") == JOB for e in events)


async def _flood(target: str) -> None:
    """The host writes 20 events of its job (10 naming it, 10 job-less), the node's
    agent (no job) 5, then a stranger (no job, loopback like them) 1,250 job-less ones, every other
    one labelled with the victim job."""
    host = AgentClient(target, "host-agent", node="node-a", jobs=[JOB])
    node_agent = AgentClient(target, "node-a/node", node="node-a")
    stranger = AgentClient(target, "stranger", node="node-b")
    async with streaming(host) as h, streaming(node_agent) as n, streaming(stranger) as s:
        now = time.time()
        h.submit(steps=[StepRecord(job=JOB, iteration=i, rank="last", end_time=now - 3 + i * 0.1,
                                   step_time_ms=100.0) for i in range(1, 11)],
                 events=[{"kind": "xid", "severity": "warning", "job": JOB if i < 10 else "", "time": now,
                          "text": f"host {i}", "payload": {"i": i}} for i in range(20)])
        n.submit(events=[{"kind": "xid", "severity": "warning", "time": now, "text": f"node {i}",
                          "labels": {"node": "node-a", "gpu": "0"}, "payload": {"i": i}} for i in range(5)])
        assert await h.flush(30) and await n.flush(30)
        for k in range(0, 1250, 50):
            s.submit(events=[{"kind": "xid", "severity": "warning", "time": now, "text": f"stranger {i}",
                              "labels": {"job": JOB} if i % 2 else {}, "payload": {"i": i}}
                             for i in range(k, k + 50)])
            assert await s.flush(30)


def _texts_of(base: str, query: str = "") -> dict[str, list[str]]:
    """The event log's texts by sender (``query``: e.g. ``&job=victim``)."""
    out: dict[str, list[str]] = {}
    for e in get_json(f"{base}/api/events?limit=1000{query}")["events"]:
        out.setdefault(e["agent"], []).append(e["text"])
    return out


def test_a_strangers_job_less_flood_evicts_no_jobs_events_and_is_never_the_jobs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The issue's probe (loopback, no token): 1,250 job-less events from an agent whose Hello
    names no job evicted all 20 of the host's, and ``/api/events?job=victim`` then listed the
    stranger's. Now the stranger holds its share (its newest 100; 1,150 counted ``event_share`` under
    it, logged once), the job lists exactly its host's 20, the node agent's 5 stay, and a restart on
    the same state (a second aggregator on it: its own restore) rebuilds the same log."""
    state = tmp_path / "state"
    caplog.set_level(logging.WARNING, logger="perfd")  # the aggregator's log, as `perfd aggregator` writes it
    args = ("--no-rules", "--rules-interval", "0.5", "--state-dir", state)
    with pipeline(tmp_path, *args) as p:
        base = p.base
        flood_started = time.monotonic()
        p.call(_flood(p.target), "the three agents' events acknowledged", 120)
        flood_s = time.monotonic() - flood_started
        victim, held = _texts_of(base, f"&job={JOB}"), _texts_of(base)
        refused = _refused(base)
        by_agent = get_json(f"{base}/api/stats")["refused_by_agent"]
    out = "".join(f"{caplog.handler.format(r)}\n" for r in caplog.records)
    with pipeline(tmp_path, *args) as p:
        base = p.base
        victim_again, held_again = _texts_of(base, f"&job={JOB}"), _texts_of(base)
    assert victim == {"host-agent": [f"host {i}" for i in range(20)]}, victim
    assert held["node-a/node"] == [f"node {i}" for i in range(5)]
    assert held["stranger"] == [f"stranger {i}" for i in range(1150, 1250)]
    assert refused.get("event_share") == 1150 and by_agent["stranger"] == {"event_share": 1150}, refused
    # Logged once a REFUSAL_LOG_INTERVAL_S at most: once, unless the flood itself took longer (a loaded
    # machine), then once more each such interval it lasted.
    lines = out.count("refused (event_share)")
    assert 1 <= lines <= 1 + int(flood_s // L.REFUSAL_LOG_INTERVAL_S), out[-3000:]
    assert (victim_again, held_again) == (victim, held)
