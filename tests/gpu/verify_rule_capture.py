"""The whole capture path on a real job: a rule fires on the aggregator → a capture command → the
agent that hosts the target rank → a Kineto trace of that rank only, for the requested steps.

    python3 tests/gpu/verify_rule_capture.py OUT_DIR [--cpu] [--tool kineto|nsys]

Runs `perfd aggregator` with a rule forced to fire (step time > 0 on the job), `perfd launch --kineto`
around a 2-rank torchrun job whose loop uses the perfd step hook (so the aggregator has step
records), and `perfd agent --launch-manifest` (hook collector; NVML for rank → pid, or /proc with
--cpu). Measures the time from the rule's firing to the capture start (the daemon answering the
rank's poll) and to the trace, and checks that only the target rank wrote a trace. --cpu runs the
same path without a GPU (gloo, CPU ops), to check the plumbing.

``--tool nsys`` (``source .gpu-libs/nsys-env.sh`` first): each rank runs under the prefix
`perfd nsys-prefix` prints (``torchrun --no-python``): with ``--nsys-mode session`` (default) each
rank in its own nsys session, armed per capture with ``nsys start -c cudaProfilerApi``; with
``--nsys-mode profile`` under ``nsys profile -c cudaProfilerApi --capture-range-end=repeat``
(reports under ``<capture dir>/nsys-ranges/<session>/rank<r>``, written when the rank exits). The
rule asks for an nsys range of 3 steps on rank 1, which the step hook opens and closes with
cudaProfilerStart/Stop at step boundaries. Checks: a report from rank 1 only, analysed by the agent
(devices, busy, NCCL time), the time from the firing to the range start and to the report, and each
rank's step times around the range (``rank<r>.steps``: nsys flushes inside cudaProfilerStop).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.procs import ROOT, Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

TRAIN = r'''
import os, time, torch, torch.distributed as dist
from perfd.hook import StepHook
cuda = os.environ.get("VRC_CPU") != "1"
# NCCL needs one GPU per rank; with a single GPU both ranks share it through gloo.
dist.init_process_group("nccl" if cuda and torch.cuda.device_count() >= 2 else "gloo")
rank = dist.get_rank()
dev = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)
n = 2048 if cuda else 256
model = torch.nn.Sequential(*[torch.nn.Linear(n, n) for _ in range(4)]).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, n, device=dev)
hook = StepHook(warmup_steps=2, cuda=cuda)
Path = __import__("pathlib").Path
ends = []
Path(os.environ["VRC_DIR"], f"rank{rank}.pid").write_text(str(os.getpid()))
deadline = time.time() + float(os.environ.get("VRC_SECONDS", "60"))
while time.time() < deadline:
    with hook.step():
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
    ends.append(time.time())
    if len(ends) % 25 == 0:  # as it goes: a rank can be left waiting in a collective at the end
        Path(os.environ["VRC_DIR"], f"rank{rank}.steps").write_text("\n".join(f"{t:.4f}" for t in ends))
    time.sleep(0.02)
hook.close()
dist.destroy_process_group()
'''

RULES = """
rules:
  - name: forced_capture
    expr: step_time > 0
    for: 0s
    severity: info
    action:
      type: capture
      tool: TOOL
      targets: {ranks: [1]}
      steps: 3
      cooldown: 1h
      max_per_hour: 1
"""


def job_argv(tool: str, out: Path, capture_dir: Path, nsys_mode: str, env: dict[str, str]) -> list[str]:
    """The torchrun command; for nsys each rank is wrapped in what ``perfd nsys-prefix`` prints."""
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    if tool != "nsys":
        return [*run, str(out / "train.py")]
    res = subprocess.run([sys.executable, "-m", "perfd.app.cli", "nsys-prefix", "--job", "rc", "--mode",
                          nsys_mode, "--capture-dir", str(capture_dir)], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True, timeout=60)
    return [*run, "--no-python", *res.stdout.split(), sys.executable, str(out / "train.py")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--tool", choices=("kineto", "nsys"), default="kineto")
    ap.add_argument("--nsys-mode", choices=("session", "profile"), default="session")
    a = ap.parse_args()
    out: Path = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.py").write_text(TRAIN)
    rules = RULES.replace("TOOL", a.tool)
    # nsys: no mode in the rule; the agent takes a range because each rank runs under the prefix
    # (its own session, or a range profile), as a user's job would.
    (out / "rules.yaml").write_text(rules)
    capture_dir = out / "captures"
    agent_cfg = out / "agent.yaml"
    agent_cfg.write_text(f"capture_dir: {capture_dir}\n")
    env = run_env(VRC_DIR=str(out), VRC_SECONDS=str(a.seconds))
    if a.cpu:
        env["VRC_CPU"] = "1"
    procs = Procs(out, env)
    result: dict[str, Any] = {"cpu": a.cpu}
    try:
        grpc_port, _, base = start_aggregator(procs, "--rules", out / "rules.yaml", "--rules-interval", "1")
        sock = str(out / "hook.sock")
        manifest = out / "launch.json"
        launch = procs.perfd("launch", "launch", "--job", "rc", "--kineto", "--agent-socket", sock,
                             "--manifest", str(manifest), "--log", str(out / "job.log"), "--",
                             *job_argv(a.tool, out, capture_dir, a.nsys_mode, env))
        wait_manifest(manifest, launch)
        start_agent(procs, grpc_port, "--host", "off", manifest=manifest, nvml="off" if a.cpu else "real",
                    config=agent_cfg)
        t0 = time.time()
        capture: dict[str, Any] | None = None
        while time.time() - t0 < a.seconds - 5:
            caps = get_json(f"{base}/api/captures")["captures"]
            if caps and caps[0]["status"] in ("finished", "failed", "undeliverable"):
                capture = caps[0]
                break
            time.sleep(0.5)
        while time.time() - t0 < a.seconds + 3:
            time.sleep(0.5)  # the job runs to its end, writing its step times
        events = get_json(f"{base}/api/events")["events"]
        firing = next((e for e in events if e.get("kind") == "rule_firing"), None)
        result["capture"] = capture
        result["rule_fired_at"] = firing.get("time") if firing else None
        result["events"] = [{k: e.get(k) for k in ("kind", "time", "text")} for e in events][-10:]
        store = capture_dir
        if a.tool == "nsys":  # every report, wherever nsys wrote it (a capture's dir, or nsys-ranges/)
            traces = sorted(p.name for p in store.rglob("*.nsys-rep"))
        else:
            traces = sorted(p.name for p in store.rglob("*.json") if not p.name.startswith("manifest"))
        result["trace_files"] = traces
        pids = {r: (out / f"rank{r}.pid").read_text().strip() for r in (0, 1)
                if (out / f"rank{r}.pid").exists()}
        result["rank_pids"] = pids
        payload = (capture or {}).get("result") or {}
        result["latency_s"] = payload.get("latency_s")
        if firing and capture:
            result["firing_to_request_s"] = round(capture["requested_at"] - firing["time"], 3)
        if capture:
            result["capture_record"] = capture
            if capture.get("finished_at") and firing:
                result["firing_to_finished_s"] = round(capture["finished_at"] - firing["time"], 3)
        result["step_s"] = {}
        for r in (0, 1):
            f = out / f"rank{r}.steps"
            if f.exists():
                ends = [float(x) for x in f.read_text().split()]
                steps = [b - a for a, b in itertools.pairwise(ends)]
                d = sorted(steps)
                if d:  # the slow steps with their end times (the range's steps are in the capture)
                    slow = [(i + 1, round(v, 3), round(ends[i + 1], 3)) for i, v in enumerate(steps)
                            if v > 5 * d[len(d) // 2]]
                    result["step_s"][r] = {"n": len(d), "median": round(d[len(d) // 2], 4),
                                           "max": round(d[-1], 4), "slow": slow[:10]}
        if a.tool == "nsys":  # rank 1's reports only (rank1.nsys-rep, or rank1.<n>.nsys-rep)
            ok = bool(capture and capture["status"] == "finished" and capture["ranks"] == [1]
                      and traces and all(t.startswith("rank1") for t in traces))
        else:
            ok = bool(capture and capture["status"] == "finished" and capture["ranks"] == [1]
                      and traces and all(f"_{pids.get(1)}" in t or "rank1" in t for t in traces))
        result["ok"] = ok
    except Exception as exc:
        result["error"] = repr(exc)
        result["ok"] = False
    finally:
        procs.stop(grace_s=20)
    (out / "rule_capture.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
