"""A hook job started with no launch flag is captured: a real CPU torch loop with the
step hook, no RANK and no KINETO_USE_DAEMON in its environment, a real agent (its hook socket, its
capture manager; the Kineto daemon off, as it would be useless here) and a real aggregator. Asked by
hand and by a rule, the agent asks the rank's hook for a trace of the steps, the hook traces them
with torch.profiler in its own process and writes the file into its own private folder, the agent
takes it into the capture's folder and analyses it as it does a Kineto daemon's trace. Before: "never
polled the Kineto daemon: start the job with KINETO_USE_DAEMON=1" (or "no capture mechanism" with the
daemon off)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent, default_registry
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.capture.chrome_trace import read_chrome_trace
from perfd.capture.hook_trace import HOOK_TRACE

# torch runs in the job's process only: looked up, not imported (its import, ~4 s of CPU, would be paid
# at collection by every pytest worker, in `make test-fast` too, where this module is deselected)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torch_processes"),
              pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")]
ROOT = Path(__file__).resolve().parents[2]

# `python3 train.py`: one process, no torchrun, no RANK, no KINETO_USE_DAEMON.
TRAIN = r'''
import os, sys, time
import torch
from perfd.hook.step import StepHook

torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
hook = StepHook(warmup_steps=0, cuda=False, flush_interval_s=0)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    hook.step_begin()
    time.sleep(0.02)  # the batch: the loop waits on its data
    x = torch.randn(32, 128)
    hook.data_ready()
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    hook.step_end()
hook.close()
'''

RULES = """
rules:
  - name: capture_the_hook_job
    expr: step_time > 0
    for: 0s
    severity: info
    action:
      type: capture
      tool: kineto
      targets: {ranks: [0]}
      steps: 3
      cooldown: 1h
      max_per_hour: 1
"""


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    (tmp_path / "train.py").write_text(TRAIN)
    sock = tmp_path / "hook.sock"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "KINETO_USE_DAEMON", "KINETO_CONFIG")}
    env.update(PYTHONPATH=str(ROOT), PERFD_HOOK_SOCKET=str(sock), PERFD_JOB="j",
               PERFD_HOOK_TRACE_DIR=str(tmp_path / "hook-traces"))
    proc = subprocess.Popen([sys.executable, str(tmp_path / "train.py"), "240"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "train.log").open("wb"))
    try:
        yield proc, sock
    finally:
        proc.kill()
        proc.wait(10)


def _capture(tmp_path: Path, sock: Path, rules: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run an aggregator and an agent until a capture of job j ends (asked by hand when ``rules`` is
    None, else by the rule): (the aggregator's capture record, the agent's manifest)."""
    caps = tmp_path / "captures"
    files = []
    if rules is not None:
        (tmp_path / "rules.yaml").write_text(rules)
        files = [str(tmp_path / "rules.yaml")]

    async def body() -> dict[str, Any]:
        agg = Aggregator(AggregatorConfig(grpc_host="127.0.0.1", grpc_port=0, http_host="127.0.0.1",
                                          http_port=0, rules_files=files, rules_interval_s=0.5))
        await agg.start()
        cfg = AgentConfig(job="j", aggregator=f"127.0.0.1:{agg.grpc_port}", metrics_port=None,
                          capture_dir=str(caps), kineto_daemon=False, batch_interval_s=0.2,
                          collectors={"hook": {"socket_path": str(sock), "interval_s": 0.1}}).finish()
        agent = Agent(cfg, default_registry())
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            rec_id = None
            # Under two suites at once on 2 CPUs a rules tick can take many seconds (one timed out,
            # seen): a deadline, not a count of polls.
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                hook = agent.scheduler.states.get("hook") if agent.scheduler is not None else None
                c: Any = hook.collector if hook is not None else None
                ready = (c is not None and 0 in c.peers and 0 in c.ranks and agg.server.connected_agents())
                if rules is None and rec_id is None and ready:
                    assert c.ranks[0].can_trace, c.ranks[0]  # the job record said so: no daemon, torch
                    rec = agg.captures.request("j", [0], "kineto", 3, "manual")
                    assert rec.status == "requested", rec
                    rec_id = rec.id
                listed = agg.captures.list()
                if rules is not None and listed:
                    rec_id = listed[0]["id"]
                cur = next((x for x in listed if x["id"] == rec_id), None)
                if cur is not None and cur["status"] in ("finished", "failed"):
                    return dict(cur)
                await asyncio.sleep(0.05)
            snap = agg.state.snapshot("j")
            engine = agg.captures.engine
            raise AssertionError(f"no capture ended: {agg.captures.list()}; rules ticks {agg.ticks}, alerts "
                                 f"{engine.states() if engine is not None else None}, job "
                                 f"{snap.state_at() if snap is not None else None}, agents "
                                 f"{agg.server.connected_agents()}")
        finally:
            stop.set()
            await task
            await agg.stop()

    cur = asyncio.run(body())
    (manifest,) = [json.loads(p.read_text()) for p in caps.glob("c*/manifest.json")]
    return cur, manifest


def _check(cur: dict[str, Any], m: dict[str, Any], pid: int) -> None:
    assert cur["status"] == "finished", (cur["reason"], m.get("reason"))
    assert m["status"] == "ok" and m["tool"] == "kineto" and m["mode"] == HOOK_TRACE
    assert m["pids"] == {"0": pid}  # the hook's pid, vouched for by its credentials
    (art,) = m["artifacts"]
    assert art["kind"] == "kineto_trace" and art["name"] == f"rank0_{pid}.json" and art["bytes"] > 0
    trace = read_chrome_trace(art["path"])
    assert trace.steps == 3 and trace.rank == 0
    assert {"aten::addmm", "aten::relu"} <= {r.name for r in trace.ranges}
    # Analysed as a Kineto daemon's trace is: the steps it marks, no device on a CPU (nothing invented).
    a = m["analysis"]["0"]
    assert "error" not in a and a["steps"] == 3 and a["devices"] == []
    assert m["steps"]["count"] == 3 and m["steps"]["start"] >= 1
    assert m["latency_s"] is not None and m["timings"]["trace_ready_at"] is not None
    assert cur["result"]["mode"] == HOOK_TRACE
    traces = Path(art["path"]).parents[2] / "hook-traces"  # <tmp>/captures/<id>/: the hook's folder beside
    assert traces.is_dir() and not list(traces.iterdir())  # taken: nothing left in the hook's folder


def test_a_hook_job_without_flags_is_captured_by_request(tmp_path: Path,
                                                         job: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, sock = job
    cur, m = _capture(tmp_path, sock, None)
    _check(cur, m, proc.pid)
    assert proc.poll() is None  # the loop goes on after its trace


def test_a_rule_captures_a_hook_job_without_flags(tmp_path: Path,
                                                  job: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, sock = job
    cur, m = _capture(tmp_path, sock, RULES)
    assert cur["origin"] == "rule:capture_the_hook_job"
    assert m["command_id"] == cur["id"]  # the rule's command, run by the agent
    _check(cur, m, proc.pid)
