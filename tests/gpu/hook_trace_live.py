"""On 1 GPU: a hook job started without ``--kineto`` and without RANK, captured by a perfd rule through
the step hook's own trace ("captures without flags").

    python3 tests/gpu/hook_trace_live.py OUT_DIR

A small transformer (4 encoder layers, h=1024, bf16) under ``StepHook`` (``python3 train.py`` under
``perfd launch`` with no ``--kineto``: the process never polls a Kineto daemon), streamed by ``perfd
agent --launch-manifest --nvml real`` to ``perfd aggregator`` holding one rule that captures rank 0
with Kineto for 3 steps once the job has stepped CAPTURE_AFTER_S seconds. Checked here, and written to
OUT_DIR/hook_trace.json:

- the capture finished, its manifest's mode is ``hook-trace`` (the hook traced; no daemon was polled);
- the trace marks exactly 3 steps (``ProfilerStep#N``) and holds CUDA kernels, with kernels inside the
  last traced step's GPU span (the profiler was stopped only once that step's end marker completed);
- the analysis of the trace has the rank's device with a busy time and a top kernel;
- the hook wrote the trace into its own private folder (PERFD_HOOK_TRACE_DIR: mode 0700), named
  it to the agent, and the agent took it from there (the folder is empty afterwards);
- reported, not checked: the loop's own times of the traced steps against the others (the profiler's
  overhead; the hook itself never synchronizes, its stop waits on the end marker with ``query()``).

Exit 0 when every check passed. The cut trace (GPU events only) comes back as
OUT_DIR/raw_hook_trace/trace_0.json.gz.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.gpu.verdict_live import RULES, cut_trace, view
from tests.procs import Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

JOB = "hook-trace"
# The rule captures once the job has stepped CAPTURE_AFTER_S: 400 steps (~13 ms each on an H200) ended
# in ~6 s, before it fired (2026-11-28); 2,000 step ~26 s there.
STEPS = int(os.environ.get("HOOK_STEPS", "2000"))
LOADER_MS = float(os.environ.get("LOADER_MS", "10"))
CAPTURE_AFTER_S = float(os.environ.get("CAPTURE_AFTER_S", "10"))
TRAIN = r'''
import json, os, sys, time
import torch
from perfd.hook import StepHook

assert "RANK" not in os.environ and "KINETO_USE_DAEMON" not in os.environ, "the point: no flags"
STEPS, LOADER_S, OUT = int(sys.argv[1]), float(sys.argv[2]) / 1e3, sys.argv[3]
B, S, H, L = 8, 512, 1024, 4
layer = torch.nn.TransformerEncoderLayer(H, 16, 4 * H, batch_first=True, dtype=torch.bfloat16)
model = torch.nn.TransformerEncoder(layer, L).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
hook = StepHook(tokens_per_step=B * S, dtype="bf16", warmup_steps=5)
times, traced = [], []
for i in range(1, STEPS + 1):
    t0 = time.perf_counter()
    with hook.step(step=i):
        time.sleep(LOADER_S)
        x = torch.randn(B, S, H, dtype=torch.bfloat16, device="cuda")
        hook.data_ready()
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if i % 50 == 0:
        torch.cuda.synchronize()  # the loop's own, rarely: the queue may run ahead in between
    times.append((i, (time.perf_counter() - t0) * 1e3))
    if hook.counters().get("profiling"):
        traced.append(i)
torch.cuda.synchronize()
hook.close()
json.dump({"steps": times, "traced": traced, "counters": hook.counters()}, open(OUT, "w"), default=str)
'''


def check(res: dict[str, Any], raw: Path) -> list[str]:
    """What failed, in words (empty: every check passed)."""
    bad: list[str] = []
    caps = [c for c in res.get("captures") or [] if c.get("job") == JOB]
    if not caps or caps[0].get("status") != "finished":
        return [f"no finished capture: {caps}"]
    manifests = [json.loads(p.read_text()) for p in (raw / "captures").rglob("manifest.json")]
    m = next((x for x in manifests if x.get("status") == "ok"), None)
    if m is None:
        return [f"no ok manifest: {[(x.get('status'), x.get('reason')) for x in manifests]}"]
    res["manifest"] = {k: m.get(k) for k in ("mode", "tool", "steps", "pids", "latency_s", "traced_by")}
    if m.get("mode") != "hook-trace":
        bad.append(f"mode {m.get('mode')!r}, not hook-trace")
    folder = raw / "hook-traces"
    res["hook_folder"] = {"mode": oct(folder.stat().st_mode & 0o777) if folder.exists() else None,
                          "left": sorted(p.name for p in folder.iterdir()) if folder.exists() else None}
    if res["hook_folder"] != {"mode": "0o700", "left": []}:
        bad.append(f"the hook's trace folder is not a private, emptied one: {res['hook_folder']}")
    a = (m.get("analysis") or {}).get("0") or {}
    if a.get("steps") != 3:
        bad.append(f"the trace marks {a.get('steps')} steps, not 3")
    devs = a.get("devices") or []
    if not devs or not devs[0].get("top_kernels"):
        bad.append("no device with kernels in the analysis")
    arts = [x for x in m.get("artifacts") or [] if x.get("kind") == "kineto_trace"]
    if not arts:
        return [*bad, "no trace artifact"]
    doc = json.loads(Path(arts[0]["path"]).read_text())
    evs = doc.get("traceEvents", [])
    kernels = [e for e in evs if e.get("cat") == "kernel"]
    gpu_steps = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in evs
                       if e.get("cat") == "gpu_user_annotation"
                       and str(e.get("name", "")).startswith("ProfilerStep#"))
    res["trace"] = {"kernels": len(kernels), "gpu_steps": [s[2] for s in gpu_steps]}
    if not kernels:
        bad.append("no CUDA kernel in the trace")
    if gpu_steps:
        last = gpu_steps[-1]
        inside = [k for k in kernels if last[0] <= k["ts"] <= last[1]]
        res["trace"]["kernels_in_last_step"] = len(inside)
        if not inside:
            bad.append(f"no kernel inside the last traced step's GPU span {last[2]}: stopped too early")
    else:
        bad.append("no GPU-side ProfilerStep range (the steps' kernels are not placed)")
    own = json.loads((raw / "own_times.json").read_text())
    times = dict((int(i), float(ms)) for i, ms in own["steps"])
    traced = set(own.get("traced") or [])
    base = [ms for i, ms in times.items() if i > 20 and i not in traced and i % 50 != 0]
    res["own"] = {"traced": sorted(traced), "median_ms": statistics.median(base) if base else None,
                  "traced_ms": [round(times[i], 2) for i in sorted(traced) if i in times]}
    return bad


def run(out: Path) -> dict[str, Any]:
    raw = out / "raw_hook_trace"
    raw.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"job": JOB, "steps": STEPS, "loader_ms": LOADER_MS}
    env = run_env(NCCL_NVLS_ENABLE="0")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "KINETO_USE_DAEMON", "KINETO_CONFIG"):
        env.pop(k, None)
    env["PERFD_HOOK_TRACE_DIR"] = str(raw / "hook-traces")  # where the hook writes (its own choice)
    procs = Procs(raw, env)
    try:
        (raw / "rules.yaml").write_text(RULES.format(for_s=int(CAPTURE_AFTER_S)))
        (raw / "train.py").write_text(TRAIN)
        grpc_port, _, url = start_aggregator(procs, "--rules", raw / "rules.yaml", "--rules-interval", "1")
        run_dir = raw / "run"
        launch = procs.perfd("launch", "launch", "--job", JOB, "--run-dir", str(run_dir), "--",
                             sys.executable, str(raw / "train.py"), str(STEPS), str(LOADER_MS),
                             str(raw / "own_times.json"))
        manifest = wait_manifest(run_dir / "launch.json", launch)
        (raw / "agent.yaml").write_text(f"capture_dir: {raw / 'captures'}\nbatch_interval_s: 0.5\n")
        start_agent(procs, grpc_port, manifest=manifest, config=raw / "agent.yaml")
        t0 = time.time()
        while launch.poll() is None and time.time() - t0 < 300:
            time.sleep(2)
        res["job_exit"] = launch.poll()
        time.sleep(6)
        res["after"] = view(get_json(f"{url}/api/jobs/{JOB}/summary"))
        res["captures"] = get_json(f"{url}/api/captures")["captures"]
        res["failed"] = check(res, raw)
        traces = sorted(p for p in (raw / "captures").rglob("rank*.json"))
        for i, t in enumerate(traces[:1]):
            cut_trace(t, raw / f"trace_{i}.json.gz")
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
    finally:
        procs.stop()
        for t in (raw / "captures").rglob("rank*.json") if (raw / "captures").exists() else []:
            t.unlink()  # the cut trace comes back; the full one stays on the GPU machine
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    res = run(args.out)
    (args.out / "hook_trace.json").write_text(json.dumps(res, indent=2, default=str))
    ok = not res.get("failed") and "error" not in res
    print(json.dumps({"ok": ok, "failed": res.get("failed"), "error": res.get("error"),
                      "manifest": res.get("manifest"), "trace": res.get("trace")}, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
