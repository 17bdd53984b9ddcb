"""A node's events and collective records on the distributed path: published by the agent's
:class:`EngineClient` (the events as sent, the collective records reduced to a partial:
perfd.core.collfold), read by the root beside the partials, and held by a real
``Aggregator --engine`` as one aggregator holds them — the job's collective analysis (the recorded
H200 Flight Recorder dumps of collectors/nccl) byte for byte the analysis of one aggregator fed the
records as sent, the events under the agent that sent each, a malformed one refused and counted. A
standby root that takes over replays the records stream and holds the same, nothing doubled."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator import forward as fwd
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.state import AggregatorState
from perfd.core import events as E
from perfd.core.model import CollectiveRecord
from perfd.engine import subjects as S
from perfd.engine.connect import connect
from perfd.engine.natsd import NatsCluster
from perfd.engine.publisher import EngineClient
from perfd.report.collective_text import collectives_json
from tests.collectives.collective_helpers import load_fixture_records
from tests.engine.test_natsd import _need_nats_server
from tests.procs import free_port

pytestmark = pytest.mark.timeout(120)

JOB = "llm pretrain/fr"
NODES = 2  # the dumps' ranks 0 and 1, one per node


def _node_events(n: int) -> list[dict[str, Any]]:
    t = time.time()
    return [
        {"kind": E.XID.name, "job": JOB, "severity": "critical", "text": f"XID 79 on node-{n} GPU 0",
         "time": t, "labels": {"node": f"node-{n}", "gpu": "0"}, "payload": {"xid": 79, "gpu": 0}},
        {"kind": E.GPU_LOST.name, "severity": "critical", "text": f"GPU 3 of node-{n} fell off the bus",
         "time": t, "labels": {"node": f"node-{n}", "gpu": "3"}},  # a node's own: no job
        # Not of its kind's declared type (an XID's payload is a mapping): refused and counted
        {"kind": E.XID.name, "job": JOB, "text": "a bad one", "time": t, "payload": [79]},
    ]


def _held_events(state: AggregatorState) -> list[tuple[str, str, str]]:
    return sorted((str(e.get("agent")), str(e.get("kind")), str(e.get("text")))
                  for e in state.log.recent(None, 1000) if e.get("kind") in (E.XID.name, E.GPU_LOST.name))


def _collective_answer(state: AggregatorState) -> str:
    """The job's collective analysis as the API serves it, made now from what is held (the API's
    is the last one made, rate-limited: it may predate the last records)."""
    got = state.collective_analysis(JOB, force=True)
    assert got is not None
    return json.dumps(collectives_json(got), sort_keys=True)  # as served: findings worded


@pytest.mark.slow
def test_events_and_collectives_reach_the_root_as_one_aggregator_holds_them(tmp_path: Path) -> None:
    _need_nats_server()
    recs = load_fixture_records("timing", JOB)
    by_node: dict[int, list[CollectiveRecord]] = {n: [r for r in recs if r.rank == n] for n in range(NODES)}
    assert all(len(v) > 10 for v in by_node.values())
    evs = {n: _node_events(n) for n in range(NODES)}

    # One aggregator, as the stream path leaves it after the guard: each agent's records, typed events.
    single = AggregatorState()
    for n in range(NODES):
        agent = f"node-{n}/{JOB}"
        single.ingest_collectives(agent, by_node[n])
        single.ingest_events(agent, [ev for ev in (E.checked(e)[0] for e in evs[n]) if ev is not None])

    async def main(urls: list[str]) -> dict[str, Any]:
        cfg = S.EngineConfig(tuple(urls), partitions=4)

        def aggregator(root_id: str) -> Aggregator:
            return Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], engine=cfg,
                                               engine_root_id=root_id))

        a = aggregator("root-a")
        await a.start()
        clients = [EngineClient(cfg, f"node-{n}/{JOB}", node=f"node-{n}") for n in range(NODES)]
        senders = [asyncio.create_task(c.run()) for c in clients]
        b: Aggregator | None = None
        try:
            for n, c in enumerate(clients):  # in pieces, as the agent's collectors hand them over
                half = len(by_node[n]) // 2
                c.submit(collectives=by_node[n][:half], events=evs[n][:1])
                c.submit(collectives=by_node[n][half:], events=evs[n][1:])
            for c in clients:
                assert await c.flush(30), c.stats()
            root = a.engine_root
            assert root is not None  # started with --engine
            # (the events come on a stream of their own, read beside the records)
            await _until(lambda: root.stats.collectives == len(recs) and root.stats.events == 3 * NODES, 30,
                         lambda: root.stats.to_json())
            out: dict[str, Any] = {"a": _collective_answer(a.state), "a_events": _held_events(a.state),
                                   "a_stats": root.stats.to_json(),
                                   "a_refused": a.refusals.snapshot().get("malformed_event", 0),
                                   "published": [c.stats() for c in clients]}
            # A standby takes over when the leader stops; it rebuilds from the streams kept.
            b = aggregator("root-b")
            await b.start()
            await a.stop()
            broot = b.engine_root
            assert broot is not None
            await _until(lambda: broot.stats.leader and broot.stats.collectives == len(recs)
                         and broot.stats.events == 3 * NODES, 40, lambda: broot.stats.to_json())
            # ... and it has read each stream to its last message: its counts are of every message
            # once (a double of one would be counted above them), and none is left to come
            nc = await connect(cfg, "check")
            try:
                js: Any = nc.jetstream()  # nats-py's, beyond the engine's own calls (perfd.engine.nats_api)
                last = {name: (await js.stream_info(stream)).state.last_seq
                        for name, stream in (("records", S.RECORDS_STREAM), ("events", S.EVENTS_STREAM))}
            finally:
                await nc.close()
            await _until(lambda: all(broot._records_read_to.get(k, 0) >= seq for k, seq in last.items()),
                         30, lambda: (broot._records_read_to, last))
            out.update(b=_collective_answer(b.state), b_events=_held_events(b.state),
                       b_stats=broot.stats.to_json())
            return out
        finally:
            for t in senders:
                t.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            for c in clients:
                c.close()
            for agg in (a, b):
                if agg is not None:
                    await agg.stop()

    with NatsCluster(tmp_path / "nats", 1) as cluster:
        got = asyncio.run(main(cluster.urls))

    # Every message once: 2 submits per node, each split by job (the node's GPU-lost event has none)
    # and, within a job, its events (the events stream) from its collective records (the records
    # stream): the job's events and records of each submit, and the GPU lost. Stored once each: a
    # publish that failed (a stream the root had not made yet, on a loaded machine) sends its window's
    # later messages again, and those that had landed come back as duplicates of an unanswered publish
    # (perfd.engine.publisher: ``distinct_published``); no other duplicate.
    assert [p["distinct_published"] for p in got["published"]] == [5, 5], got["published"]
    assert all(p["duplicates"] == p["duplicates_unanswered"] for p in got["published"]), got["published"]
    assert all(p["pending"] == 0 and p["records_submitted"] == len(by_node[n]) + 3
               for n, p in enumerate(got["published"]))
    for side in ("a", "b"):
        st = got[f"{side}_stats"]
        assert st["node_records_messages"] == 5 * NODES and st["undecodable"] == 0, st
        assert st["collectives"] == len(recs) and st["events"] == 3 * NODES, st
        assert st["collective_partials"] == 2 * NODES, st  # every node's records came reduced
        assert got[side] == _collective_answer(single), side
        assert got[f"{side}_events"] == _held_events(single), side
    assert len(got["a_events"]) == 2 * NODES  # the XID and the GPU lost of each node, as its agent's
    assert got["a_refused"] == NODES  # each node's malformed XID, counted


async def _until(pred: Any, timeout: float, show: Any) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout} s: {show()}")
        await asyncio.sleep(0.1)


@pytest.mark.slow
def test_a_capture_reaches_an_agent_on_the_engine_and_its_progress_comes_back(tmp_path: Path) -> None:
    """The root sends a capture command to the agent whose records of the job came through the engine
    (no Hello names it to the aggregator), as a request the agent answers; the agent's progress event
    comes back on the records stream and moves the capture on, taken from it as the capture's target.
    A command to an agent that is not listening is counted undeliverable."""
    _need_nats_server()
    recs = [r for r in load_fixture_records("timing", JOB) if r.rank == 0]
    agent = f"node-0/{JOB}"

    async def main(urls: list[str]) -> dict[str, Any]:
        cfg = S.EngineConfig(tuple(urls), partitions=4)
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], engine=cfg,
                                          engine_root_id="root-a"))
        await agg.start()
        got: list[Any] = []
        client = EngineClient(cfg, agent, node="node-0", on_command=got.append)
        sender = asyncio.create_task(client.run())
        try:
            client.submit(collectives=recs)  # what makes the agent one of the job's, on this path
            root = agg.engine_root
            assert root is not None
            await _until(lambda: root.stats.leader and root.stats.collectives == len(recs), 30,
                         lambda: root.stats.to_json())
            await _until(lambda: client.connected, 30, client.stats)
            # From the rules' thread, as a firing rule would.
            rec = await asyncio.to_thread(agg.captures.request, JOB, [0], "kineto", 2, "test")
            await _until(lambda: got, 15, lambda: (root.stats.to_json(), client.stats()))
            client.submit(events=[{"kind": E.CAPTURE_FAILED.name, "job": JOB, "time": time.time(),
                                   "text": "no profiler on this node", "links": {"command_id": rec.id}}])
            await _until(lambda: agg.captures.captures[rec.id].status == "failed", 15,
                         lambda: agg.captures.list())
            out = {"command": got[0], "record": rec, "sent": root.stats.commands_sent,
                   "reason": agg.captures.captures[rec.id].reason}
            # The agent gone: the next command finds nobody listening.
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            assert agg.send_command(agent, got[0])
            await _until(lambda: root.stats.commands_undeliverable == 1, 15, lambda: root.stats.to_json())
            out["undeliverable"] = root.stats.commands_undeliverable
            return out
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            client.close()
            await agg.stop()

    with NatsCluster(tmp_path / "nats", 1) as cluster:
        out = asyncio.run(main(cluster.urls))
    cmd, rec = out["command"], out["record"]
    assert rec.agents == [agent] and rec.status in ("requested", "failed")
    assert (cmd.id, cmd.job, tuple(cmd.ranks), cmd.args.get("tool")) == (rec.id, JOB, (0,), "kineto"), cmd
    assert out["sent"] == 1 and out["reason"] == "no profiler on this node" and out["undeliverable"] == 1


@pytest.mark.slow
def test_a_standby_root_answers_the_api_with_the_leaders_jobs(tmp_path: Path) -> None:
    """Two aggregators on the engine behind one Service: the standby forwards what it is asked of
    the jobs (GET and POST, with the caller's token) to the leader's advertised HTTP and relays the
    answer, saying so; its own health and stats stay its own. Once the leader is gone the standby
    leads and answers for itself, from the streams."""
    _need_nats_server()
    recs = [r for r in load_fixture_records("timing", JOB) if r.rank == 0]
    token = tmp_path / "token"
    token.write_text("s3cret-s3cret-s3cret\n")
    token.chmod(0o600)  # a token others may read is refused
    auth = {"Authorization": "Bearer s3cret-s3cret-s3cret"}

    def get(base: str, path: str, headers: dict[str, str] | None = None,
            body: bytes | None = None) -> tuple[int, dict[str, Any], str]:
        req = urllib.request.Request(base + path, data=body, headers=headers or {},
                                     method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read()), resp.headers.get(fwd.SERVED_BY) or ""
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read()), exc.headers.get(fwd.SERVED_BY) or ""

    async def main(urls: list[str]) -> dict[str, Any]:
        cfg = S.EngineConfig(tuple(urls), partitions=4)
        ports = {"a": free_port(), "b": free_port()}

        def aggregator(name: str) -> Aggregator:
            return Aggregator(AggregatorConfig(
                grpc_port=0, http_port=ports[name], rules_files=[], engine=cfg, engine_root_id=f"root-{name}",
                auth_token_file=str(token), engine_advertise_http=f"http://127.0.0.1:{ports[name]}"))

        a, b = aggregator("a"), aggregator("b")
        await a.start()
        ra = a.engine_root  # started with its engine root
        assert ra is not None
        await _until(lambda: ra.stats.leader, 30, lambda: ra.stats.to_json())
        await b.start()
        rb = b.engine_root
        assert rb is not None
        client = EngineClient(cfg, f"node-0/{JOB}", node="node-0")
        sender = asyncio.create_task(client.run())
        out: dict[str, Any] = {}
        try:
            client.submit(collectives=recs)
            await _until(lambda: ra.stats.collectives == len(recs), 30, lambda: ra.stats)
            await _until(lambda: rb.leader_http is not None, 15, lambda: rb.leader_http)
            base_a, base_b = (f"http://127.0.0.1:{ports[n]}" for n in "ab")
            path = f"/api/jobs/{urllib.parse.quote(JOB, safe='')}/summary"
            out["leader"] = await asyncio.to_thread(get, base_a, path, auth)
            out["standby"] = await asyncio.to_thread(get, base_b, path, auth)
            out["standby_no_token"] = await asyncio.to_thread(get, base_b, path)
            out["standby_stats"] = await asyncio.to_thread(get, base_b, "/api/stats", auth)
            capture = json.dumps({"job": JOB, "tool": "kineto", "steps": 2}).encode()
            out["standby_post"] = await asyncio.to_thread(
                get, base_b, "/api/captures", {**auth, "Content-Type": "application/json"}, capture)
            out["leader_captures"] = await asyncio.to_thread(get, base_a, "/api/captures", auth)
            await a.stop()
            await _until(lambda: rb.stats.leader and rb.stats.collectives == len(recs), 40,
                         lambda: rb.stats.to_json())
            out["after"] = await asyncio.to_thread(get, base_b, path, auth)
            return out
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            client.close()
            await a.stop()
            await b.stop()

    with NatsCluster(tmp_path / "nats", 1) as cluster:
        out = asyncio.run(main(cluster.urls))
    code, leader, _ = out["leader"]
    assert code == 200 and leader["collectives"] is not None, leader
    code, standby, served = out["standby"]
    assert (code, served) == (200, f"leader http://127.0.0.1:{_port(out)}"), (code, served, standby)
    assert standby["collectives"] == leader["collectives"]
    assert out["standby_no_token"][0] == 401 and out["standby_no_token"][2] == ""  # refused before forwarding
    code, stats, served = out["standby_stats"]
    assert code == 200 and served == "" and stats["engine"]["leader"] is False
    code, made, served = out["standby_post"]
    assert code == 202 and served.startswith("leader "), (code, made)
    # made by the leader, which holds the job (and sent it to the job's agent there)
    assert made["id"] in {c["id"] for c in out["leader_captures"][1]["captures"]}
    code, after, served = out["after"]
    assert (code, served) == (200, "") and after["collectives"] == leader["collectives"]


def _port(out: dict[str, Any]) -> str:
    return str(out["standby"][2]).rsplit(":", 1)[-1]


def test_jobs_past_the_aggregators_cap_are_refused_on_the_engine_path_too() -> None:
    """The jobs cap holds for what the engine brings: a third job's partials, job info and collectives
    are refused and counted (the root folds nothing of it), the two held go on."""
    from perfd.core.jobinfo_json import job_info_to_json
    from perfd.core.limits import Limits
    from perfd.core.model import JobInfo
    from perfd.engine.partial import encode, partials_of
    from perfd.engine.root import Root
    from tests.engine.records import job_records

    agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[],
                                      limits=Limits(max_jobs=2)))
    sink = EngineSink(agg.state, agg.guard)
    root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), sink, "root-a")
    msgs = []
    for k, job in enumerate(("a", "b", "c")):
        recs = job_records(job, 1, 2)[0]
        for it, its in enumerate(recs, 1):
            mid = f"node-0/{job}:e:{it}"
            msgs.append(encode(mid, "node-0", 1, partials_of(its, mid),
                               {job: job_info_to_json(JobInfo())} if it == 1 else None))
        sink.ingest_records(f"node-{k}/{job}", [], [dataclasses.replace(r, job=job) for r in
                                                    load_fixture_records("timing", job)[:3]])
    root.handle(msgs)
    asked: list[str] = []
    admit = sink.admit_job

    def asking(job: str) -> bool:
        asked.append(job)
        return admit(job)

    sink.admit_job = asking  # type: ignore[method-assign]
    root.handle(msgs)  # again: c refused without asking the aggregator for each partial
    assert asked.count("c") == 1  # its job info (the root's memo covers the partials)
    sink.admit_job = admit  # type: ignore[method-assign]
    assert sorted(agg.state.job_names()) == ["a", "b"]
    assert root.stats.refused == 6  # c's two partials and its job info, twice
    assert sorted(root.fold.jobs) == ["a", "b"]
    refused = agg.refusals.snapshot()
    assert refused.get("jobs_cap", 0) >= 4, refused  # and c's collectives
    assert not agg.state.collectives.has_job("c") and agg.state.collectives.has_job("a")
