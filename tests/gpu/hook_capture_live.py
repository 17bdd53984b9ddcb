"""On 1 GPU: a plain PyTorch loop under the step hook whose input pipeline is the bottleneck, with a
steady-state Kineto capture taken by a perfd rule — the recording of a data-bound hook job.

    python3 tests/gpu/hook_capture_live.py OUT_DIR

A small transformer (4 encoder layers, h=1024, bf16) whose loader sleeps LOADER_MS before each batch
(the model steps in ~20 ms: data is most of the step). ``StepHook(..., dtype="bf16")`` with
``data_ready()`` after the batch; the job runs under ``perfd launch --kineto`` with ``perfd agent
--launch-manifest --nvml real`` streaming to ``perfd aggregator`` holding one rule that captures rank 0
with Kineto for 3 steps once the job has stepped CAPTURE_AFTER_S seconds. After the job the script
reads the aggregator's summary and captures, keeps the trace cut to its GPU events
(OUT_DIR/raw_hook/trace_hook_data_0.json.gz) and the job's own step times, and runs
``perfd analyze trace`` on it. Writes OUT_DIR/hook_capture.json; exit 0 when a trace with steps came
back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.gpu.verdict_live import RULES, cut_trace, union_idle, view
from tests.procs import ROOT, Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

JOB = "hook-data"
STEPS = int(os.environ.get("HOOK_STEPS", "500"))
LOADER_MS = float(os.environ.get("LOADER_MS", "30"))
CAPTURE_AFTER_S = float(os.environ.get("CAPTURE_AFTER_S", "12"))
TRAIN = r'''
import json, sys, time
import torch
from perfd.hook import StepHook

STEPS, LOADER_S, OUT = int(sys.argv[1]), float(sys.argv[2]) / 1e3, sys.argv[3]
B, S, H, L = 8, 512, 1024, 4
layer = torch.nn.TransformerEncoderLayer(H, 16, 4 * H, batch_first=True, dtype=torch.bfloat16)
model = torch.nn.TransformerEncoder(layer, L).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
params = sum(p.numel() for p in model.parameters())
flops = 6 * params * B * S + 12 * L * H * S * S * B  # dense + attention, forward and backward
hook = StepHook(tokens_per_step=B * S, flops_per_step=flops, dtype="bf16", warmup_steps=5)
times = []
for i in range(1, STEPS + 1):
    t0 = time.perf_counter()
    with hook.step(step=i):
        time.sleep(LOADER_S)  # the input pipeline: a slow loader (decode, augment, read)
        x = torch.randn(B, S, H, dtype=torch.bfloat16).pin_memory().cuda(non_blocking=True)
        hook.data_ready()
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    times.append((i, (time.perf_counter() - t0) * 1e3))
json.dump({"steps": times, "loader_ms": LOADER_S * 1e3}, open(OUT, "w"))
'''


def run(out: Path) -> dict[str, Any]:
    raw = out / "raw_hook"
    raw.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"job": JOB, "steps": STEPS, "loader_ms": LOADER_MS}
    env = run_env(NCCL_NVLS_ENABLE="0")
    procs = Procs(raw, env)
    try:
        (raw / "rules.yaml").write_text(RULES.format(for_s=int(CAPTURE_AFTER_S)))
        (raw / "train.py").write_text(TRAIN)
        grpc_port, _, url = start_aggregator(procs, "--rules", raw / "rules.yaml", "--rules-interval", "1")
        base = f"{url}/api"
        run_dir = raw / "run"
        launch = procs.perfd("launch", "launch", "--job", JOB, "--run-dir", str(run_dir), "--kineto", "--",
                             sys.executable, str(raw / "train.py"), str(STEPS), str(LOADER_MS),
                             str(raw / "own_times.json"))
        manifest = wait_manifest(run_dir / "launch.json", launch)
        (raw / "agent.yaml").write_text(f"capture_dir: {raw / 'captures'}\nbatch_interval_s: 0.5\n")
        start_agent(procs, grpc_port, manifest=manifest, config=raw / "agent.yaml")
        t0 = time.time()
        polls = []
        while launch.poll() is None and time.time() - t0 < 240:
            try:
                got = view(get_json(f"{base}/jobs/{JOB}/summary"))
                polls.append({"t": round(time.time() - t0, 1), **got})
            except Exception as exc:
                polls.append({"t": round(time.time() - t0, 1), "error": repr(exc)})
            time.sleep(3)
        res["job_exit"] = launch.poll()
        res["polls"] = polls[-3:]
        time.sleep(6)
        full = get_json(f"{base}/jobs/{JOB}/summary")
        res["after"] = view(full)
        res["medians"] = (full.get("summary") or {}).get("medians")
        res["captures"] = get_json(f"{base}/captures")["captures"]
        traces = sorted((raw / "captures").rglob("*.json"), key=lambda t: t.stat().st_mtime) \
            if (raw / "captures").exists() else []
        traces = [t for t in traces if t.stat().st_size > 10_000]
        res["traces"] = [str(t.relative_to(raw)) for t in traces]
        for i, t in enumerate(traces[:1]):
            cut_trace(t, raw / f"trace_hook_data_{i}.json.gz")
            ac = subprocess.run([sys.executable, "-m", "perfd.app.cli", "analyze", "trace", str(t), "--json"],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            got = json.loads(ac.stdout) if ac.returncode == 0 else {"error": ac.stderr[-2000:]}
            got["union_check"] = union_idle(t)
            res.setdefault("capture_analysis", []).append(got)
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
    finally:
        procs.stop()
        for t in (raw / "captures").rglob("*.json") if (raw / "captures").exists() else []:
            t.unlink()  # the cut trace comes back; the full one stays on the GPU machine
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    res = run(args.out)
    (args.out / "hook_capture.json").write_text(json.dumps(res, indent=2, default=str))
    ok = bool(res.get("traces")) and "error" not in res
    print(json.dumps({"ok": ok, "traces": res.get("traces"), "error": res.get("error"),
                      "after": (res.get("after") or {}).get("bottleneck")}, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
