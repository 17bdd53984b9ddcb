"""An ncu capture through every real piece but the GPU: the aggregator takes the request, the agent's
capture manager finds the rank under ncu (the record ``perfd ncu-exec`` wrote), asks the real step
hook in a real training process (started by ``perfd ncu-exec`` under a stand-in ncu) for one step's
range over the hook socket, the hook calls its profiler at that step's boundaries (here: as ncu
would, the stop writes the report, which replays the recorded H100 export), the agent imports and
parses the report, and the rows reach the aggregator's capture record. What the GPU run adds is
tests/gpu/ncu_megatron_rule.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent, default_registry
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.capture.ncu_exec import read_target
from tests.capture.test_ncu_capture import make_fake_ncu

ROOT = Path(__file__).resolve().parents[2]
DETAILS = ROOT / "tests" / "data" / "ncu" / "h100_mlp_sol_details_5.csv"

TRAIN = r'''
import json, os, sys, time
from perfd.hook.step import StepHook

report = os.environ.get("FAKE_NCU_REPORT")  # set by the stand-in ncu: where ncu writes its report
spec = json.dumps({"details": sys.argv[1], "raw": sys.argv[1]})

def stop():  # ncu has written what it profiled in the range by the time it closes
    if report:
        with open(report, "w") as f:
            f.write(spec)

hook = StepHook(os.environ["PERFD_HOOK_SOCKET"], warmup_steps=0, cuda=False, rank=0, flush_interval_s=0,
                profiler=(lambda: None, stop))
end = time.time() + float(sys.argv[2])
step = 0
while time.time() < end:
    step += 1
    hook.step_begin(step)
    time.sleep(0.05)
    hook.step_end()
hook.close()
'''

# The stand-in ncu of tests/capture, plus: in launch mode it tells the command where the report goes
# (the real ncu writes it itself), then becomes the command.
LAUNCH_PATCH = ('    i = args.index("-o")\n',
                '    i = args.index("-o")\n    os.environ["FAKE_NCU_REPORT"] = args[i + 1] + ".ncu-rep"\n')


@pytest.mark.slow
def test_ncu_capture_by_request_through_aggregator_agent_and_hook(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    exe, _ = make_fake_ncu(tmp_path)
    monkeypatch.setenv("PERFD_NCU", str(exe))  # the agent imports the report with it
    exe.write_text(exe.read_text().replace(*LAUNCH_PATCH))
    caps, sock = tmp_path / "captures", tmp_path / "hook.sock"
    (tmp_path / "train.py").write_text(TRAIN)

    jobs: list[subprocess.Popen[bytes]] = []

    async def body() -> dict[str, Any]:
        agg = Aggregator(AggregatorConfig(grpc_host="127.0.0.1", grpc_port=0, http_host="127.0.0.1",
                                          http_port=0, rules_files=[]))
        await agg.start()
        cfg = AgentConfig(job="j", aggregator=f"127.0.0.1:{agg.grpc_port}", metrics_port=None,
                          capture_dir=str(caps), kineto_daemon=False, batch_interval_s=0.2,
                          collectors={"hook": {"socket_path": str(sock), "interval_s": 0.1}}).finish()
        agent = Agent(cfg, default_registry())
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "PERFD_NCU": str(exe),
               "PERFD_HOOK_SOCKET": str(sock), "PERFD_JOB": "j"}
        argv = [sys.executable, "-m", "perfd.app.cli", "ncu-exec", "--job", "j", "--ranks", "0",
                "--capture-dir",
                str(caps), "--", sys.executable, str(tmp_path / "train.py"), str(DETAILS), "60"]
        jobs.append(subprocess.Popen(argv, env=env, cwd=ROOT))
        try:
            for _ in range(400):  # the agent connected, and the hook's first steps reached it
                hook = agent.scheduler.states.get("hook") if agent.scheduler is not None else None
                peer = hook.collector.peers.get(0) if hook is not None else None  # type: ignore[attr-defined]
                if agg.server.connected_agents() and peer is not None and peer.last_step is not None:
                    break
                await asyncio.sleep(0.05)
            rec = agg.captures.request("j", [0], "ncu", 1, "manual")
            assert rec.status == "requested", rec
            for _ in range(600):
                cur = next(c for c in agg.captures.list() if c["id"] == rec.id)
                if cur["status"] in ("finished", "failed"):
                    return cur
                await asyncio.sleep(0.05)
            return next(c for c in agg.captures.list() if c["id"] == rec.id)
        finally:
            stop.set()
            await task
            await agg.stop()

    try:
        cur = asyncio.run(body())
    finally:
        for p in jobs:
            p.kill()
            p.wait(10)
    target = read_target(caps, "j", 0)
    assert target is not None
    assert cur["status"] == "finished", (cur["reason"], cur.get("result"))
    assert cur["tool"] == "ncu" and cur["ranks"] == [0]
    rows = cur["result"]["ranks"]["0"]["ncu_kernels"]
    assert len(rows) == 5 and {r["bound"] for r in rows} >= {"compute-bound", "memory-bound"}
    assert cur["result"]["range_overran"] is False
    manifest = next(json.loads(p.read_text()) for p in caps.glob("c*/manifest.json"))
    assert manifest["tool"] == "ncu" and manifest["steps"]["count"] == 1
    assert manifest["pids"] == {"0": target.pid}  # the hook's pid: the process ncu-exec became
