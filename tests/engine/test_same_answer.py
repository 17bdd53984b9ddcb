"""The distributed path gives the job the analysis one aggregator gives, byte for byte: the same
records (each rank's clock a real recorded H100 loop, tests/engine/records.py) sent by 4 nodes x 8
ranks to one aggregator's state, and through a real nats-server (JetStream), two shards and a root
into another; the analysis JSON (what /api/jobs/<job>/summary and /iterations serve) is compared
whole, and every node message is folded in exactly once."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.http import job_iterations
from perfd.aggregator.state import AggregatorState
from perfd.collectors.megatron import ParsedLog, parse_file
from perfd.core.jobinfo_json import job_info_to_json
from perfd.core.limits import Limits
from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, Provenance, StepRecord
from perfd.core.refusals import Refusals
from perfd.engine import subjects as S
from perfd.engine.natsd import NatsCluster
from perfd.engine.publisher import EngineClient
from perfd.engine.root import Root
from perfd.engine.shard import Shard
from perfd.report import analysis_json
from tests.engine.records import T0, job_records
from tests.engine.test_natsd import _need_nats_server

JOB = "llm pretrain/8k"  # a name with a space and a slash: subject syntax it must not become
# Iterations a test publishes past what the root has folded: well inside the 16 it keeps in memory
# (perfd.engine.rootfold.KEEP_ITERATIONS), so none arrives late.
AHEAD = 6
STALLED_S = 30.0  # the root folding nothing for this long: the pacing gives up (the checks then say why)
NODES, ITERATIONS = 4, 40


def _answer(state: AggregatorState) -> str:
    a = state.analysis(JOB, force=True)
    assert a is not None and a.iterations
    return json.dumps({"analysis": analysis_json(a, []), "iterations": job_iterations(state, JOB)},
                      sort_keys=True)


async def _through_the_engine(urls: list[str], rooted: AggregatorState, info: JobInfo,
                              by_node: dict[int, list[list[StepRecord]]],
                              events: dict[int, list[dict[str, Any]]] | None = None
                              ) -> tuple[dict[str, int], Root]:
    """Each node's records, an iteration at a time, through a real nats-server, two shards and a
    root into ``rooted`` (``events``: what each node's agent sends first, on the records stream);
    returns what was published and folded, and the root."""
    cfg = S.EngineConfig(tuple(urls), partitions=4)
    stop = asyncio.Event()
    shards = [Shard(cfg, f"shard-{i}") for i in range(2)]
    root = Root(cfg, EngineSink(rooted, Guard(Limits(), Refusals())), "root-a")
    nodes = len(by_node)
    clients = [EngineClient(cfg, f"node-{n}/{JOB}", node=f"node-{n}") for n in range(nodes)]
    tasks = [asyncio.create_task(s.run(stop)) for s in shards] + [asyncio.create_task(root.run(stop))]
    senders = [asyncio.create_task(c.run()) for c in clients]
    clients[0].submit(job_info_json={JOB: job_info_to_json(info)})
    for n, evs in (events or {}).items():
        clients[n].submit(events=evs)
    messages = sum(len(its) for its in by_node.values())
    for it in range(len(by_node[0])):
        # At most AHEAD iterations past what the root has folded of every node's: 20 iterations a second
        # (100x a real job's pace) alone let a shard starved under load (a full suite, 8 workers on 2
        # cores) fall past the 16 the root keeps in memory, and 3 of 40 iterations read otherwise. With
        # two nodes, one shard stalled at iteration k holds the other to k + 2 AHEAD, inside the 16.
        # Paced for as long as the root makes progress (a pause of STALLED_S ends it): one deadline for
        # the whole run, once spent under load, let the rest go unpaced (37 of 40 iterations read once).
        seen, since = root.stats.node_messages, time.monotonic()
        while root.stats.node_messages < nodes * (it - AHEAD) and time.monotonic() - since < STALLED_S:
            if root.stats.node_messages != seen:
                seen, since = root.stats.node_messages, time.monotonic()
            await asyncio.sleep(0.02)
        for n, c in enumerate(clients):
            c.submit(steps=by_node[n][it])
        await asyncio.sleep(0.05)
    deadline = time.monotonic() + 60
    while root.stats.node_messages < messages and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    stop.set()
    for t in senders:
        t.cancel()
    await asyncio.wait_for(asyncio.gather(*tasks, *senders, return_exceptions=True), 30)
    assert all(c.spool.pending_count() == 0 for c in clients)
    return {"published": sum(c.published - c.duplicates for c in clients),
            "shard_messages": sum(s.stats.node_messages for s in shards)}, root


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_engine_path_gives_one_aggregators_analysis_byte_for_byte(tmp_path: Path):
    _need_nats_server()
    by_node = job_records(JOB, NODES, ITERATIONS)
    single, rooted = _states_with_info()
    for it in range(ITERATIONS):  # one aggregator: each node's agent sends its ranks' records
        for n in range(NODES):
            single.ingest_steps(f"node-{n}/{JOB}", by_node[n][it])

    with NatsCluster(tmp_path / "nats", 1) as cluster:
        counts, root = asyncio.run(_through_the_engine(cluster.urls, rooted, INFO, by_node))
    # Every node message folded in once (the job info went in a message of its own, with no records).
    assert counts["published"] == NODES * ITERATIONS + 1
    assert root.stats.node_messages == NODES * ITERATIONS == counts["shard_messages"] - 1
    assert root.stats.redelivered == 0 and root.stats.undecodable == 0 and root.stats.late == 0
    assert root.stats.new_runs == 0
    # Whole at the root: every iteration but perhaps the first (not counted while it was all the
    # job had shown, perfd.engine.rootfold.RootFold).
    assert root.stats.complete >= ITERATIONS - 1
    assert _answer(rooted) == _answer(single)
    # What the comparison holds: 40 iterations of 32 ranks, each its slowest rank's step.
    its = job_iterations(rooted, JOB)
    assert its is not None and len(its["iterations"]) == ITERATIONS
    steady = [i for i in its["iterations"] if i.get("steady_state")]
    assert len(steady) > ITERATIONS // 2 and all(isinstance(i.get("mfu"), float) for i in steady), steady[:1]
    world = rooted.analysis(JOB)
    assert world is not None and world.job.layout.world_size == NODES * 8


GPU = "NVIDIA H100 80GB HBM3"  # the recordings' GPU: MFU is in the answer compared
# The job as its hooks describe it (the dtype: MFU is then in the answer), sent by node 0's agent.
INFO = JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"))


def _states_with_info() -> tuple[AggregatorState, AggregatorState]:
    single, rooted = AggregatorState(gpu_override=GPU), AggregatorState(gpu_override=GPU)
    single.ingest_job_info(f"node-0/{JOB}", JOB, INFO)
    return single, rooted


def _restarted(recs: list[StepRecord], shift_s: float) -> list[StepRecord]:
    """The same ranks' steps from new processes (pid + 1000), ``shift_s`` later."""
    out = []
    for r in recs:
        pid = str(int(r.fields["pid"]) + 1000)
        assert r.source is not None and r.end_time is not None
        out.append(dataclasses.replace(r, end_time=r.end_time + shift_s, fields={**r.fields, "pid": pid},
                                       source=Provenance(r.source.collector, f"rank{r.rank}:pid{pid}")))
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_restart_seen_only_through_the_engine_is_a_new_run_as_one_aggregator_sees_it(tmp_path: Path):
    """The job's ranks die after iteration 24 and resume from the checkpoint of iteration 12 in new
    processes, 60 s later: one aggregator sees each rank's hook report another pid; on the engine,
    each node's agent marks the partial where its ranks' processes changed, and the root counts the
    job's run on. Both cut the job into the same two runs and give the same analysis."""
    _need_nats_server()
    first, resumed_at, last = 24, 12, 36
    recs = job_records(JOB, NODES, last)
    by_node = {n: recs[n][:first] + [_restarted(its, 60.0) for its in recs[n][resumed_at - 1:last]]
               for n in range(NODES)}
    single, rooted = _states_with_info()
    for it in range(len(by_node[0])):
        for n in range(NODES):
            single.ingest_steps(f"node-{n}/{JOB}", by_node[n][it])

    with NatsCluster(tmp_path / "nats", 1) as cluster:
        _, root = asyncio.run(_through_the_engine(cluster.urls, rooted, INFO, by_node))
    assert root.stats.node_messages == NODES * len(by_node[0]) and root.stats.redelivered == 0
    assert root.stats.new_runs == 1  # every node marked the restart, at the same iteration: one
    assert single.job_stats.new_runs == rooted.job_stats.new_runs == 1
    runs = [a.summary.runs.current for st in (rooted, single) if (a := st.analysis(JOB)) is not None]
    assert runs == [2, 2]
    assert _answer(rooted) == _answer(single)
    its = job_iterations(rooted, JOB)
    assert its is not None
    assert [i["iteration"] for i in its["iterations"]] == list(range(resumed_at, last + 1))



def _gpu_lists(node: int) -> list[dict[str, Any]]:
    """A node's NVML process lists as its agent sends them (collectors/nvml: the device's labels name
    its model; the hook attributed each GPU's process to its rank and job, perfd.agent.hook_gpus)."""
    out = []
    for lr in range(8):
        r = node * 8 + lr
        out.append({"kind": "gpu_processes", "severity": "info", "time": T0, "text": "1 compute process(es)",
                    "labels": {"node": f"node-{node}", "gpu": str(lr), "uuid": f"GPU-{node:04d}{lr:04d}",
                               "model": GPU},
                    "payload": [{"pid": 4000 + r, "name": "python", "rank": r, "local_rank": lr,
                                 "world_size": NODES * 8, "job": JOB, "rank_from": "hook pid"}]})
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_gpu_model_reaches_the_root_in_the_process_lists_and_mfu_with_it(tmp_path: Path):
    """No --gpu, and the GPUs' series stay on the agents on the engine path: what names the job's GPU
    model at the root is the process lists the agents send on the records stream. With them, the root
    and one aggregator given the same lists (and no series) both have MFU, and the same answer;
    without them MFU is absent (no peak), not invented."""
    _need_nats_server()
    iterations = 12
    by_node = job_records(JOB, NODES, iterations)
    events = {n: _gpu_lists(n) for n in range(NODES)}
    single, rooted, bare = AggregatorState(), AggregatorState(), AggregatorState()
    for st in (single, bare):
        st.ingest_job_info(f"node-0/{JOB}", JOB, INFO)
    for n in range(NODES):
        single.ingest_events(f"node-{n}/{JOB}", events[n])
    for it in range(iterations):
        for n in range(NODES):
            single.ingest_steps(f"node-{n}/{JOB}", by_node[n][it])
            bare.ingest_steps(f"node-{n}/{JOB}", by_node[n][it])

    with NatsCluster(tmp_path / "nats", 1) as cluster:
        _, root = asyncio.run(_through_the_engine(cluster.urls, rooted, INFO, by_node, events))
    assert root.stats.node_messages == NODES * iterations and root.stats.undecodable == 0
    assert _answer(rooted) == _answer(single)
    for st, has in ((rooted, True), (single, True), (bare, False)):
        its = job_iterations(st, JOB)
        assert its is not None
        steady = [i for i in its["iterations"] if i.get("steady_state")]
        assert steady and all(isinstance(i.get("mfu"), float) == has for i in steady), (has, steady[:1])
    gpus = [(st.records_and_layout(JOB) or ([], None, None))[2] for st in (rooted, bare)]
    assert gpus == [GPU, None]


def _hooked(log: list[StepRecord], world: int) -> dict[int, list[list[StepRecord]]]:
    """Each rank's step-hook record of each logged iteration, one node a rank: rank r's step ends r ms
    after the log's and lasts r ms longer (the recorded log's clocks; the hook's shape as
    tests/engine/records.py makes it)."""
    from perfd.core.model import HOOK_COMPUTE, HOOK_DATA_WAIT, TimerValue

    out: dict[int, list[list[StepRecord]]] = {r: [] for r in range(world)}
    for rec in log:
        assert rec.end_time is not None and rec.step_time_ms is not None
        for r in range(world):
            s, d = rec.step_time_ms + r, 2.0 + r
            timers = {HOOK_DATA_WAIT: TimerValue(d, d, {r: d}),
                      HOOK_COMPUTE: TimerValue(s - d, s - d, {r: s - d})}
            pid = str(500 + r)
            out[r].append([StepRecord(
                job=rec.job, iteration=rec.iteration, rank=r, end_time=rec.end_time + r / 1e3, step_time_ms=s,
                interval=1, timers=timers, source=Provenance("hook", f"rank{r}:pid{pid}"),
                fields={"timing": "cuda", "pid": pid})])
    return out


def logged_job() -> tuple[ParsedLog, dict[int, list[list[StepRecord]]], AggregatorState]:
    """The recorded H200 Megatron-LM log (2 ranks, pipeline-parallel) with the step hook on each rank,
    one node a rank: the parsed log, each node's records an iteration (node 0's: the log's and rank
    0's), and one aggregator that took them in order."""
    log = (Path(__file__).resolve().parents[2] / "perfd" / "app" / "demo" / "data"
           / "megatron_h200x2_tp1_pp2.log")
    parsed = parse_file(log, job=JOB)
    hooked = _hooked(parsed.records, 2)
    by_node = {0: [[lr, *h] for lr, h in zip(parsed.records, hooked[0], strict=True)], 1: hooked[1]}
    single = AggregatorState(gpu_override="NVIDIA H200")
    single.ingest_job_info(f"node-0/{JOB}", JOB, parsed.job_info)
    for it in range(len(parsed.records)):
        for n in (0, 1):
            single.ingest_steps(f"node-{n}/{JOB}", by_node[n][it])
    return parsed, by_node, single


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_megatron_job_with_the_step_hook_is_read_from_its_log_as_one_aggregator_reads_it(tmp_path: Path):
    """A Megatron-LM job (the recorded H200 log, 2 ranks, pipeline-parallel) whose ranks also run the
    step hook: one aggregator reads its iterations from the log (the hook's records serve the windows
    and the stalls). The root held two records an iteration, the log's and the hook's fold, and served
    two rows of each (the fold's last: no exposed communication, a third of the MFU); now the same
    answer, byte for byte, with the log's figures."""
    _need_nats_server()
    parsed, by_node, single = logged_job()
    rooted = AggregatorState(gpu_override="NVIDIA H200")
    with NatsCluster(tmp_path / "nats", 1) as cluster:
        _, root = asyncio.run(_through_the_engine(cluster.urls, rooted, parsed.job_info, by_node))
    assert root.stats.node_messages == 2 * len(parsed.records) and root.stats.undecodable == 0
    got, want = job_iterations(rooted, JOB), job_iterations(single, JOB)
    assert got is not None and want is not None
    differ = [(a, b) for a, b in itertools.zip_longest(got["iterations"], want["iterations"]) if a != b]
    assert not differ, (len(got["iterations"]), len(want["iterations"]), differ[:2])
    assert _answer(rooted) == _answer(single)
    its = job_iterations(rooted, JOB)
    assert its is not None
    assert [i["iteration"] for i in its["iterations"]] == [r.iteration for r in parsed.records]
    last = its["iterations"][-1]
    assert isinstance(last.get("comm_exposed_share"), float) and last.get("logged_tflops_per_gpu") == 83.5
