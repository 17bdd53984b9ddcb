"""A capture rule firing on a restarted job before its target can take the capture,
through every real piece but the GPU: a real aggregator with a rule pack (``for:`` short, an hour's
cooldown, tool ncu), a real agent with the step-hook collector, and a job's two runs as real processes
under ``perfd ncu-exec`` (the stand-in ncu of tests/capture, as tests/captures/test_ncu_live_loop.py).
Run 1 steps and exits; run 2 starts at once but, like a rank loading under ncu on the H100 (42 s),
takes seconds before its hook's first step. The rule fires in that gap. On the H100 this was
"capture failed: rank 0: the step hook is unreachable" with the hour's cooldown taken and the next
firing suppressed; here the capture that finds its target not ready says so (a typed cause), takes no
cooldown, and the rule's capture runs once run 2's hook steps."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent, default_registry
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from tests.capture.test_ncu_capture import make_fake_ncu
from tests.captures.test_ncu_live_loop import DETAILS, LAUNCH_PATCH

ROOT = Path(__file__).resolve().parents[2]

# A training run with the step hook: it loads for argv[3] seconds before its first step (a rank under
# ncu loads slowly), then steps for argv[2] seconds.
TRAIN = r'''
import json, os, sys, time
from perfd.hook.step import StepHook

report = os.environ.get("FAKE_NCU_REPORT")
spec = json.dumps({"details": sys.argv[1], "raw": sys.argv[1]})

def stop():
    if report:
        with open(report, "w") as f:
            f.write(spec)

time.sleep(float(sys.argv[3]))
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

RULES = """
rules:
  - name: deep_dive
    expr: step_time > 0
    for: 1s
    severity: info
    action:
      type: capture
      tool: ncu
      targets: {ranks: [0]}
      steps: 1
      cooldown: 1h
      max_per_hour: 2
"""


@pytest.mark.slow
def test_a_rule_firing_before_the_restarted_ranks_hook_is_up_still_captures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe, _ = make_fake_ncu(tmp_path)
    monkeypatch.setenv("PERFD_NCU", str(exe))
    exe.write_text(exe.read_text().replace(*LAUNCH_PATCH))
    caps, sock = tmp_path / "captures", tmp_path / "hook.sock"
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "rules.yaml").write_text(RULES)
    jobs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "PERFD_NCU": str(exe),
           "PERFD_HOOK_SOCKET": str(sock), "PERFD_JOB": "j"}

    def run(seconds: float, load_s: float) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "perfd.app.cli", "ncu-exec", "--job", "j", "--ranks", "0",
                "--capture-dir",
                str(caps), "--", sys.executable, str(tmp_path / "train.py"), str(DETAILS), str(seconds),
                str(load_s)]
        p = subprocess.Popen(argv, env=env, cwd=ROOT)
        jobs.append(p)
        return p

    async def body() -> tuple[list[dict[str, Any]], list[object], Any]:
        agg = Aggregator(AggregatorConfig(grpc_host="127.0.0.1", grpc_port=0, http_host="127.0.0.1",
                                          http_port=0, rules_files=[str(tmp_path / "rules.yaml")],
                                          rules_interval_s=0.5))
        await agg.start()
        cfg = AgentConfig(job="j", aggregator=f"127.0.0.1:{agg.grpc_port}", metrics_port=None,
                          capture_dir=str(caps), kineto_daemon=False, batch_interval_s=0.2,
                          collectors={"hook": {"socket_path": str(sock), "interval_s": 0.1}}).finish()
        agent = Agent(cfg, default_registry())
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        firings: list[object] = []
        try:
            first = run(0.6, 0.0)  # run 1: steps briefly, before the rule's for: has passed
            while first.poll() is None:
                await asyncio.sleep(0.05)
            run(60.0, 6.0)  # run 2: the restart, its hook up only after 6 s of loading
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                caps_now = agg.captures.list()
                if any(c["status"] == "finished" for c in caps_now):
                    break
                await asyncio.sleep(0.1)
            firings = [e["payload"] for e in agg.state.recent_events() if e.get("kind") == "rule_firing"]
            assert agg.captures.engine is not None
            budget = agg.captures.engine.captures_in_last_hour("deep_dive", "j", time.time())
            return agg.captures.list(), firings, budget
        finally:
            stop.set()
            await task
            await agg.stop()

    try:
        captures, firings, budget = asyncio.run(body())
    finally:
        for p in jobs:
            p.kill()
            p.wait(10)
    assert firings, "the rule never fired"
    done = [c for c in captures if c["status"] == "finished"]
    assert len(done) == 1, [(c["status"], c.get("cause"), c["reason"]) for c in captures]
    early = [c for c in captures if c["status"] == "failed"]
    # each earlier try found the target not ready (typed), and none took the rule's budget
    assert all(c["cause"] == "not_ready" for c in early), [(c["cause"], c["reason"]) for c in early]
    assert budget == 1  # the capture that ran, only
    assert done[0]["result"]["ranks"]["0"]["ncu_kernels"]
