"""On 1 GPU: where the variable-length loop's periodic slow steps come from (the open
question of docs/evidence/entries/26-plain-pytorch-loops-no-rank-irregular-steps-a-data-bound-loa.md).

    python3 tests/gpu/varlen_jitter_live.py OUT_DIR [--seconds 30] [--configs bare,hook,stack,stack_nonvml]

On the H100 (run 3 of plain_loop_live.py) the varlen loop's steps outside the co-tenant had a
residual CV of 14% and perfd reported step-jitter: about 45 steps ran 10-45 ms long, with a period of
1.5 s (their midpoints' phase concentration 0.75 at 1.54 s), 3.9% of the run's time. This runs the
same loop (tests/gpu/plain_loop_live.py's TRAIN_VARLEN, no co-tenant) SECONDS each way:

- ``bare``: the loop alone, the step hook disabled (PERFD_HOOK_DISABLE=1), no perfd process;
- ``hook``: the hook on, sending to a socket nobody reads (no agent);
- ``stack``: under perfd launch with a real agent (real NVML) and aggregator, as plain_loop_live runs it;
- ``stack_nonvml``: the same with the agent's NVML collector off;
- ``stack_timer``: the full stack with a timer beside the job: a process that every TIMER_PERIOD_S
  runs TIMER_BURST_MS of bf16 matmuls on the same GPU (a monitor that profiles the GPU on a timer).
  perfd should name its period, and its recommendation's impact should be what the loop's own
  throughput gains without it (``stack`` against ``stack_timer``: ``timer_gain``).

For each, by the loop's own clock (after a device sync each step): per-length medians, the steps
more than 8 ms over their length's median, the period (0.5-3 s) their midpoints concentrate at most
and how much, the excess's share of the run's time, the residual CV (perfd.analytics.steps.windows)
and, for the stacks, the aggregator's step_time_cv and findings. OUT_DIR/varlen_jitter.json, and
each loop's clock in OUT_DIR/<config>_steps.json.gz.
"""

from __future__ import annotations

import argparse
import cmath
import gzip
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests
# plain_loop_live's rule captures a job CAPTURE_AFTER_S into it: here nothing but monitoring runs.
os.environ.setdefault("CAPTURE_AFTER_S", "100000")

from perfd.analytics.steps.windows import unexplained_cv
from tests.gpu.plain_loop_live import TRAIN_VARLEN, run_job
from tests.procs import run_env

WARMUP = 20  # steps left out: CUDA and allocator warm-up
TIMER_PERIOD_S, TIMER_BURST_MS = 1.2, 40.0
TIMER = r"""
import sys, time, torch
period, burst = float(sys.argv[1]), float(sys.argv[2]) / 1e3
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ a
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(10):
    a @ a
torch.cuda.synchronize()
n = max(1, round(burst / ((time.perf_counter() - t) / 10)))  # matmuls per burst, queued at once
print(f"matmuls per burst: {n}", flush=True)
due = time.time() + period
while True:
    time.sleep(max(0.0, due - time.time()))
    t = time.perf_counter()
    for _ in range(n):
        a @ a
    torch.cuda.synchronize()
    print(f"burst at {time.time():.3f} took {(time.perf_counter() - t) * 1e3:.1f} ms", flush=True)
    due += period
"""

def timer(procs: Any, raw: Path, env: dict[str, str], t0: float) -> dict[str, Any]:
    """The timer process beside the job (stopped with the job's processes)."""
    (raw / "timer.py").write_text(TIMER)
    argv = [sys.executable, str(raw / "timer.py"), str(TIMER_PERIOD_S), str(TIMER_BURST_MS)]
    p = procs.start("timer", argv, env=env)
    return {"pid": p.pid, "period_s": TIMER_PERIOD_S, "burst_ms": TIMER_BURST_MS}


def throughput(own: dict[str, Any]) -> float:
    """The loop's own TFLOP/s after warm-up: its FLOPs summed over its time summed."""
    rows = own["steps"][WARMUP:]
    return float(sum(r[5] for r in rows) / sum(r[3] - r[1] for r in rows) / 1e12)
SPIKE_MS = 8.0  # a step this far over its length's median is a slow one


def spikes(own: dict[str, Any]) -> dict[str, Any]:
    """The loop's slow steps and their period, by its own clock (begin, data ready, end, seq, FLOPs)."""
    rows = own["steps"][WARMUP:]
    busy = [(r[3] - r[2]) * 1e3 for r in rows]
    by_len: dict[int, list[float]] = defaultdict(list)
    for r, b in zip(rows, busy, strict=True):
        by_len[r[4]].append(b)
    med = {k: statistics.median(v) for k, v in by_len.items()}
    t0 = rows[0][1]
    slow = [((r[2] + r[3]) / 2 - t0, b - med[r[4]]) for r, b in zip(rows, busy, strict=True)
            if b - med[r[4]] > SPIKE_MS]
    best: tuple[float, float | None] = (0.0, None)
    if len(slow) >= 3:
        for p_ms in range(500, 3001, 5):
            p = p_ms / 1e3
            z = sum(cmath.exp(2j * math.pi * t / p) for t, _ in slow)
            best = max(best, (abs(z) / len(slow), p), key=lambda x: x[0])
    total = sum(busy)
    return {"steps": len(rows), "median_ms_by_len": {str(k): round(v, 2) for k, v in sorted(med.items())},
            "slow_steps": len(slow), "slow_excess_ms": round(sum(e for _, e in slow), 1),
            "excess_share": round(sum(max(0.0, b - med[r[4]]) for r, b in zip(rows, busy, strict=True))
                                  / total, 4),
            "period_s": best[1], "phase_concentration": round(best[0], 3),
            "residual_cv": unexplained_cv(busy, [float(r[5]) for r in rows]),
            "slow_at_s": [round(t, 2) for t, _ in slow[:60]]}


def run_plain(out: Path, name: str, seconds: float, env_extra: dict[str, str]) -> dict[str, Any]:
    """The loop alone (no perfd process), with ``env_extra``."""
    raw = out / f"raw_{name}"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "train.py").write_text(TRAIN_VARLEN)
    own = raw / "own_steps.json"
    env = {**run_env(drop=("RANK", "LOCAL_RANK", "WORLD_SIZE", "KINETO_USE_DAEMON")), **env_extra}
    with (raw / "train.out").open("wb") as log:
        rc = subprocess.run([sys.executable, str(raw / "train.py"), str(own), str(seconds)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, timeout=seconds + 180).returncode
    res: dict[str, Any] = {"job_exit": rc}
    if own.exists():
        res["own"] = json.loads(own.read_text())
    else:
        res["error"] = (raw / "train.out").read_text()[-2000:]
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--configs", default="bare,hook,stack,stack_nonvml")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for name in a.configs.split(","):
        t = time.time()
        if name == "bare":
            r = run_plain(a.out, name, a.seconds, {"PERFD_HOOK_DISABLE": "1"})
        elif name == "hook":
            r = run_plain(a.out, name, a.seconds, {"PERFD_HOOK_SOCKET": str(a.out / "nobody.sock")})
        elif name in ("stack", "stack_nonvml", "stack_timer"):
            os.environ["PERFD_NVML"] = "off" if name == "stack_nonvml" else "real"
            r = run_job(a.out, f"varlen-{name}", TRAIN_VARLEN, [str(a.seconds)], a.seconds,
                        during=timer if name == "stack_timer" else None)
        else:
            raise SystemExit(f"unknown config {name!r}")
        row: dict[str, Any] = {"wall_s": round(time.time() - t, 1), "job_exit": r.get("job_exit"),
                               "error": r.get("error")}
        if "own" in r:
            row["loop"] = spikes(r["own"])
            row["loop"]["tflops"] = throughput(r["own"])
            with gzip.open(a.out / f"{name}_steps.json.gz", "wt") as f:
                json.dump(r["own"], f)
        if "view" in r or "step_time_cv" in r:
            row["perfd"] = {"step_time_cv": r.get("step_time_cv"), "findings": r.get("findings"),
                            "slow_steps": r.get("slow_steps"), "recommendations": r.get("recommendations"),
                            "timer": r.get("extra"),
                            "incidents": [(i.get("first_iteration"), i.get("last_iteration"), i.get("cause"))
                                          for i in r.get("incidents") or []]}
        results[name] = row
        shown = {k: v for k, v in row.items() if k != "perfd"}
        print(json.dumps({name: shown}, default=str)[:1500], flush=True)
        if "stack" in results and "stack_timer" in results and "loop" in results["stack"] \
                and "loop" in results["stack_timer"]:
            # What removing the timer gives back, by the loop's clock, against perfd's R for it
            gain = results["stack"]["loop"]["tflops"] / results["stack_timer"]["loop"]["tflops"] - 1
            recs = (results["stack_timer"].get("perfd") or {}).get("recommendations") or []
            impact = next((x.get("impact") for x in recs if x.get("finding_id") == "step-jitter"), None)
            results["timer_gain"] = {"loop_throughput_gain": gain, "perfd_impact": impact}
            print(json.dumps({"timer_gain": results["timer_gain"]}), flush=True)
        (a.out / "varlen_jitter.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
