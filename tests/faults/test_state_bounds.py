"""The aggregator's --state-dir stays bounded over a long life: a real
``perfd aggregator`` process with a state dir, real gRPC clients, kill -9 and restarts.

- Hellos: each agent's latest Hello is kept, not every one (a probe's: 4,232 Hellos in 30 s
  grew the state from 0.1 to 1,078 MB, and a restart replayed every one, 4.9 s);
- a pruned job stays pruned: its batches and job info leave the state, so a restart neither replays
  nor brings it back;
- ``--state-max-mib``: the whole state (journal, Hellos, job info, documents) is held under it, the
  oldest batches going first, and a restart replays no more than that.

The figures printed (``FIGURES``) are recorded in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from perfd.core.model import StepRecord
from perfd.transport.client import STREAM_METHOD
from perfd.transport.gen import perfd_pb2 as pb
from tests.faults.streams import send_batches
from tests.procs import NOT_YET, Procs, get_json, http_get, run_env, start_aggregator, wait_for

pytestmark = pytest.mark.slow


async def hellos(target: str, agents: list[str], rounds: int, job_of: Any) -> None:
    """Each agent opens a stream, says Hello (naming its job), waits for the Ack and goes, ``rounds``
    times: a reconnect storm."""

    async def one(agent: str) -> None:
        async with grpc.aio.insecure_channel(target) as ch:
            call = ch.stream_stream(STREAM_METHOD, request_serializer=pb.AgentMessage.SerializeToString,
                                    response_deserializer=pb.AggregatorMessage.FromString)()
            await call.write(pb.AgentMessage(hello=pb.Hello(agent_id=agent, jobs=[job_of(agent)],
                                                            spool_epoch="e1")))
            await call.read()  # the Ack answering the Hello: it is journalled
            call.cancel()

    for _ in range(rounds):
        await asyncio.gather(*(one(a) for a in agents))



def restored(procs: Procs) -> dict[str, int]:
    """The counts of the aggregator's last 'state restored' log line (-v)."""
    text = (procs.out / "aggregator.out").read_text(errors="replace")
    line = [ln for ln in text.splitlines() if "state restored from" in ln][-1]
    return {k: int(v) for k, v in re.findall(r"'(\w+)': (\d+)", line)}


def kill9_and_restart(procs: Procs, args: list[str]) -> tuple[int, str]:
    for name, _role, p in procs.procs:
        if name == "aggregator" and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(10)
    (procs.out / "agg.ready").unlink(missing_ok=True)
    grpc_port, _http, base = start_aggregator(procs, *args, name="aggregator", verbose=True)
    return grpc_port, base


@pytest.mark.e2e
def test_a_hello_storm_keeps_one_hello_per_agent_and_a_restart_replays_that_many(tmp_path: Path) -> None:
    agents, rounds = [f"node-{i:03d}" for i in range(50)], 12
    args = ["--no-rules", "--rules-interval", "0.5", "--state-dir", str(tmp_path / "state")]
    with Procs(tmp_path, run_env()) as procs:
        grpc_port, _http, base = start_aggregator(procs, *args, verbose=True)
        t0 = time.monotonic()
        asyncio.run(hellos(f"127.0.0.1:{grpc_port}", agents, rounds, lambda a: f"job-{a}"))
        took = time.monotonic() - t0
        size = sum(f.stat().st_size for f in (tmp_path / "state").iterdir())
        _grpc, base = kill9_and_restart(procs, args)
        got = restored(procs)
        st = get_json(base + "/api/stats")["transport"]
        print(f"FIGURES hello storm: {len(agents) * rounds} Hellos of {len(agents)} agents in {took:.1f} s; "
              f"state dir {size / 1e6:.2f} MB; the restart replayed {got['hellos']} Hellos "
              f"({got.get('ms', '?')} ms), {st.get('state_store_hellos')} kept")
        assert got["hellos"] == len(agents), got  # before: every Hello, 600
        assert st["state_store_hellos"] == len(agents)


def _steps(job: str, first: int, n: int, t0: float, field_kb: int = 0) -> list[StepRecord]:
    extra = {"note": "x" * (field_kb * 1000)} if field_kb else {}
    return [StepRecord(job=job, iteration=i, rank="last", end_time=t0 + i * 0.1, step_time_ms=100.0,
                       fields=dict(extra)) for i in range(first, first + n)]


@pytest.mark.e2e
def test_a_pruned_job_stays_pruned_across_a_restart(tmp_path: Path) -> None:
    args = ["--no-rules", "--rules-interval", "0.5", "--job-stale-after", "1", "--job-retention", "2",
            "--state-dir", str(tmp_path / "state")]
    with Procs(tmp_path, run_env()) as procs:
        grpc_port, _http, base = start_aggregator(procs, *args, verbose=True)
        target = f"127.0.0.1:{grpc_port}"
        t0 = time.time()
        info = {"old": '{"framework": "megatron", "arguments": {"num_layers": "2"}}'}
        # Its job info too (kept apart from the journal before), in the same stream as its steps: from a
        # second stream it came after the job had ended and been pruned where the load slowed the first
        # past --job-stale-after + --job-retention, and made the job anew.
        batches: list[dict[str, Any]] = [{"steps": _steps("old", 1 + 20 * k, 20, t0)} for k in range(10)]
        asyncio.run(send_batches(target, "node-old", [*batches, {"job_info_json": info}], ["old"]))
        st = wait_for(lambda: (s := get_json(base + "/api/stats")["transport"])["jobs_pruned"] >= 1 and s, 30,
                      "the ended job pruned", ignore=NOT_YET)
        # The pruning is durable once a later tick committed (a kill -9 before it replays the job: on a
        # loaded machine the next commit came after the kill).
        commits = st["state_store_commits"]
        wait_for(lambda: get_json(base + "/api/stats")["transport"]["state_store_commits"] > commits + 1, 30,
                 "a commit after the pruning", ignore=NOT_YET)
        # A live job meanwhile, so the restart has something to replay.
        asyncio.run(send_batches(target, "node-new", [{"steps": _steps("new", 1, 20, time.time())}], ["new"]))
        # Restarted with a long retention: the live job, silent from here, must not be pruned by the
        # time it is looked for (a restart slowed by load took longer than the 1 + 2 s above), while a
        # replayed "old" would be held (ended) and seen.
        _grpc, base = kill9_and_restart(procs, [*args[:-4], "--job-retention", "3600", *args[-2:]])
        got = restored(procs)
        jobs = [j["job"] for j in get_json(base + "/api/jobs")["jobs"]]
        st = get_json(base + "/api/stats")["transport"]
        print(f"FIGURES pruned job: after its pruning and a kill -9 the restart replayed {got['batches']} "
              f"batch(es) and {got['job_infos']} job info(s); jobs held {jobs}")
        assert "old" not in jobs and got["job_infos"] == 0, (jobs, got)  # before: 11 batches, 1 job info
        # The live job's one batch replayed, and the job held; or none, where the load made its send
        # take longer than --job-stale-after + --job-retention, and it ended and was pruned before the
        # kill (seen with two suites at once: 0 batches, no job).
        assert (got["batches"], "new" in jobs) in ((1, True), (0, False)), (got, jobs)
        assert st["jobs_pruned"] == 0  # nothing came back to prune again


@pytest.mark.e2e
def test_the_state_stays_under_state_max_mib_and_a_restart_replays_no_more(tmp_path: Path) -> None:
    args = ["--no-rules", "--rules-interval", "0.5", "--state-max-mib", "4",
            "--state-dir", str(tmp_path / "state")]
    with Procs(tmp_path, run_env()) as procs:
        grpc_port, _http, base = start_aggregator(procs, *args, verbose=True)
        t0 = time.time()
        # 300 batches of two 50 KB-field records: ~30 MB journalled in all.
        big = [{"steps": _steps("big", 1 + 2 * k, 2, t0, field_kb=50)} for k in range(300)]
        asyncio.run(send_batches(f"127.0.0.1:{grpc_port}", "node-a", big, ["big"]))
        st = wait_for(lambda: (s := get_json(base + "/api/stats")["transport"])["state_store_held_bytes"]
                      <= 4 << 20 and s, 30, "the state under its cap", ignore=NOT_YET)
        commits = st["state_store_commits"]  # the pruning is durable once a later tick committed
        wait_for(lambda: get_json(base + "/api/stats")["transport"]["state_store_commits"] > commits + 1, 30,
                 "two more commits", ignore=NOT_YET)
        files = {f.name: f.stat().st_size for f in (tmp_path / "state").iterdir()}
        size = sum(files.values())
        _grpc, base = kill9_and_restart(procs, args)
        got = restored(procs)
        after = {f.name: f.stat().st_size for f in (tmp_path / "state").iterdir()}
        print(f"FIGURES state cap: --state-max-mib 4 after ~30 MB of batches: "
              f"{st['state_store_held_bytes'] / 1e6:.1f} MB held ({st['state_store_pruned_for_bytes']} "
              f"batches pruned for bytes), files "
              f"{size / 1e6:.1f} MB {files}; the restart replayed {got['batches']} batches in "
              f"{got.get('ms')} ms, "
              f"files then {after}")
        assert st["state_store_pruned_for_bytes"] > 200
        # The same on /metrics (the restarted aggregator's), for an alert on how full the journal is.
        text = http_get(base + "/metrics").decode()
        gauges = dict(re.findall(r"^(perfd_aggregator_state_(?:held|max)_bytes) (\S+)$", text, re.M))
        assert float(gauges["perfd_aggregator_state_max_bytes"]) == 4 << 20
        # The restart cuts back what the kill left (its write-ahead log, a pruning's free pages): a CI run
        # read 5.1 MB of files for the 30 batches (3 MB) it replayed until the next checkpoint.
        assert 0 < float(gauges["perfd_aggregator_state_held_bytes"]) <= 4 << 20, (files, after)
        assert got["batches"] <= 45  # ~4 MB of ~100 KB batches
