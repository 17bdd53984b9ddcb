"""On 1 GPU: a plain PyTorch DDP job watched by the step hook alone, live through agent -> aggregator.

    python3 tests/gpu/hook_ddp_live.py OUT_DIR

The job (docs/evidence/entries/18-a-hook-only-pytorch-ddp-job-live-2026-11-23-1-h100.md): 8 TransformerEncoder
layers, h=2048, bf16, DDP over NCCL (torchrun, one rank), ``StepHook(tokens_per_step=..., flops_per_step=...,
warmup_steps=5, dtype="bf16")`` and ``data_ready()`` after the batch; steps 80-159 wait for data several times
longer (a slow input pipeline). It runs under ``perfd launch --kineto --flight-recorder DIR --fr-timing`` with
``perfd agent --launch-manifest --nvml real`` streaming to ``perfd aggregator`` holding one rule,
``data_share > 20%`` for 5 s. The training script times every step itself (host clock, a device
sync at the step's end) and writes those times; after the job the script reads what the aggregator
kept (/api/jobs/<job>/summary, /incidents, /api/events, /metrics) and checks:

- MFU (median over the steady steps) within 1% of flops_per_step ÷ (the job's own median step time
  × the H100's peak), perfd's peak from NVML's GPU name;
- data share within 3 points of the job's own measured data wait ÷ step, in the calm steps and in
  the slow stretch;
- a communication share from the Flight Recorder (perfd_job_comm_total_ratio on /metrics);
- no bus bandwidth exported for the one-rank world group;
- the slow-data stretch as one incident, its cost within 10% of Σ(step − steady median) of the
  job's own times;
- the headline with no "None"; the rule ``data_share > 20%`` fired.

Writes OUT_DIR/hook_ddp_live.json and .md (and the job's own timing, the aggregator's summary);
exit 0 only when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.procs import Procs, get_json, http_get, run_env, start_agent, start_aggregator, wait_manifest

JOB = "hook-ddp"
STEPS = int(os.environ.get("HOOK_DDP_STEPS", "240"))
SLOW = (80, 159)  # inclusive: the slow-data stretch
RULES = """
rules:
  - name: data_slow
    expr: data_share > 20%
    for: 5s
    severity: warning
"""
TRAIN = r'''
import json, os, sys, time
import torch, torch.distributed as dist
from perfd.hook import StepHook

STEPS, SLOW_FIRST, SLOW_LAST = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
OUT = sys.argv[4]
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
L, H, HEADS, B, S = 8, 2048, 16, 8, 1024
layer = torch.nn.TransformerEncoderLayer(H, HEADS, dim_feedforward=4 * H, dropout=0.0, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=L).cuda().to(torch.bfloat16)
model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
tokens = B * S * dist.get_world_size()
# Model FLOPs per step (forward 2 per MAC, backward twice the forward): per token and layer the
# QKV and output projections 4h^2 MACs, the MLP 8h^2, attention scores and values 2*s*h.
flops = 3 * 2 * tokens * L * (12 * H * H + 2 * S * H)
hook = StepHook(tokens_per_step=tokens, flops_per_step=flops, warmup_steps=5, dtype="bf16")
x = torch.randn(B, S, H, device="cuda", dtype=torch.bfloat16)

def batch(i):
    # The input pipeline: ~10% of a step normally, ~3 steps' worth in the slow stretch.
    time.sleep(0.300 if SLOW_FIRST <= i <= SLOW_LAST else 0.010)
    return x

own = {}
for i in range(1, STEPS + 1):
    t0 = time.perf_counter()
    hook.step_begin(i)
    b = batch(i)
    t1 = time.perf_counter()
    hook.data_ready()
    loss = model(b).float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    hook.step_end()
    torch.cuda.synchronize()  # the job's own clock: the step ends when its GPU work does
    own[i] = {"step_ms": (time.perf_counter() - t0) * 1e3, "wait_ms": (t1 - t0) * 1e3}
hook.close(timeout_s=5.0)
if rank == 0:
    json.dump({"flops_per_step": flops, "tokens_per_step": tokens, "steps": own}, open(OUT, "w"))
dist.destroy_process_group()
'''


def metric_lines(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            m = re.match(r"^[^{ ]+(?:\{(.*)\})? (\S+)", line)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
                out.append((labels, float(m.group(2))))
    return out


def run(out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"job": JOB, "steps": STEPS, "slow": SLOW}
    procs = Procs(out, run_env(NCCL_NVLS_ENABLE="0"))
    try:
        (out / "rules.yaml").write_text(RULES)
        (out / "train.py").write_text(TRAIN)
        grpc_port, _, base = start_aggregator(procs, "--rules", out / "rules.yaml", "--rules-interval", "1")
        run_dir = out / "run"
        own_path = out / "own_timing.json"
        t0 = time.time()
        launch = procs.perfd("launch", "launch", "--job", JOB, "--run-dir", str(run_dir), "--kineto",
                             "--flight-recorder", str(out / "fr"), "--fr-timing", "--", sys.executable, "-m",
                             "torch.distributed.run", "--nproc_per_node", "1", "--master_port", "29541",
                             str(out / "train.py"), str(STEPS), str(SLOW[0]), str(SLOW[1]), str(own_path))
        manifest = wait_manifest(run_dir / "launch.json", launch)
        (out / "agent.yaml").write_text(f"capture_dir: {out / 'captures'}\nbatch_interval_s: 0.5\n")
        start_agent(procs, grpc_port, manifest=manifest, config=out / "agent.yaml")
        while launch.poll() is None and time.time() - t0 < 540:
            time.sleep(2)
        res["job_exit"] = launch.poll()
        time.sleep(8)  # the last records, a Flight Recorder dump and a rules pass reach the aggregator
        summary = get_json(f"{base}/api/jobs/{JOB}/summary")
        incidents = get_json(f"{base}/api/jobs/{JOB}/incidents")["incidents"]
        summary["iterations"] = get_json(f"{base}/api/jobs/{JOB}/iterations?sources=0")["iterations"]
        events = get_json(f"{base}/api/events")["events"]
        (out / "aggregator_summary.json").write_text(json.dumps(summary, indent=1, default=str))
        metrics = http_get(f"{base}/metrics", timeout=10).decode()
        (out / "aggregator_metrics.txt").write_text(metrics)
        own = json.loads(own_path.read_text())
        steps = {int(k): v for k, v in own["steps"].items()}
        res.update(check(summary, incidents, events, metrics, steps, own["flops_per_step"]))
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
        res["ok"] = False
    finally:
        procs.stop()
        res["logs"] = procs.tails()
    return res


def check(summary: dict[str, Any], incidents: list[dict[str, Any]], events: list[dict[str, Any]],
          metrics: str, steps: dict[int, dict[str, float]], flops: float) -> dict[str, Any]:
    s, job = summary.get("summary") or {}, summary.get("job") or {}
    med = s.get("medians") or {}
    peak = (job.get("gpu") or {}).get("peak_tflops")
    calm = [i for i in steps if 10 <= i < SLOW[0] or SLOW[1] + 6 <= i]
    own_step = statistics.median(steps[i]["step_ms"] for i in calm)
    expected_mfu = flops / (own_step / 1e3 * peak * 1e12) if peak else None
    mfu = med.get("mfu")
    c: dict[str, Any] = {"peak_tflops": peak, "gpu": (job.get("gpu") or {}).get("name"),
                         "own_median_step_ms": own_step, "perfd_median_step_ms": med.get("step_time_ms"),
                         "mfu": mfu, "expected_mfu": expected_mfu,
                         "mfu_rel_gap": (abs(mfu - expected_mfu) / expected_mfu
                                         if mfu and expected_mfu else None)}
    rows = {r["iteration"]: r for r in summary.get("iterations") or []}
    shares: dict[str, dict[str, Any]] = {}
    for name, span in (("calm", calm), ("slow", range(SLOW[0] + 1, SLOW[1]))):
        perfd = [rows[i]["data_share"] for i in span if i in rows and rows[i].get("data_share") is not None]
        own = statistics.median(steps[i]["wait_ms"] / steps[i]["step_ms"] for i in span)
        shares[name] = {"perfd": statistics.median(perfd) if perfd else None, "own": own}
    c["data_share"] = shares
    comm = metric_lines(metrics, "perfd_job_comm_total_ratio")
    c["comm_total_ratio"] = [v for lab, v in comm if lab.get("job_name") == JOB]
    c["busbw_link_ratio_rows"] = [lab for lab, _ in
                                  metric_lines(metrics, "perfd_job_collective_busbw_link_ratio")]
    mine = [i for i in incidents
            if i.get("first_iteration", 0) <= SLOW[1] and i.get("last_iteration", 0) >= SLOW[0]]
    c["incidents"] = [{k: i.get(k) for k in ("id", "first_iteration", "last_iteration", "cost_s", "cause")}
                      for i in incidents]
    ref = statistics.median(steps[i]["step_ms"] for i in calm)
    if len(mine) == 1:
        inc = mine[0]
        span = range(inc["first_iteration"], inc["last_iteration"] + 1)
        want = sum(steps[i]["step_ms"] - ref for i in span if i in steps) / 1e3
        c["incident_cost"] = {"perfd_s": inc.get("cost_s"), "own_s": want,
                              "rel_diff": abs((inc.get("cost_s") or 0) - want) / want if want else None}
    headline = ((summary.get("report") or {}).get("summary") or {}).get("headline") or ""
    c["headline"] = headline
    c["rule_fired"] = [e.get("text") for e in events if e.get("kind") == "rule_firing" and "data_slow" in
                       str(e.get("text")) + str(e.get("labels"))]
    ok = {
        "mfu_within_1pct": c["mfu_rel_gap"] is not None and c["mfu_rel_gap"] <= 0.01,
        "data_share_within_3pts": all(v["perfd"] is not None and abs(v["perfd"] - v["own"]) <= 0.03
                                      for v in shares.values()),
        "comm_share_from_fr": bool(c["comm_total_ratio"]),
        "no_busbw_for_one_rank": not any(lab.get("job_name") == JOB for lab in c["busbw_link_ratio_rows"]),
        "one_incident_with_cost": len(mine) == 1
        and (c.get("incident_cost") or {}).get("rel_diff") is not None
        and c["incident_cost"]["rel_diff"] <= 0.10,
        "headline_without_none": bool(headline) and "None" not in headline and "MFU n/a" not in headline,
        "rule_fired": bool(c["rule_fired"]),
    }
    return {"check": c, "criteria": ok, "ok": all(ok.values())}


def markdown(res: dict[str, Any]) -> str:
    c = res.get("check") or {}
    lines = ["# A hook-only PyTorch DDP job, live (perfd launch -> agent -> aggregator)", "",
             f"Job exit {res.get('job_exit')}; {res.get('steps')} steps, slow data in {res.get('slow')}.", "",
             f"Headline: {c.get('headline')}", "", "| criterion | holds |", "|---|---|",
             *[f"| {k} | {v} |" for k, v in (res.get("criteria") or {}).items()], "",
             f"MFU {c.get('mfu')} vs flops/(own median step {c.get('own_median_step_ms')} ms × peak "
             f"{c.get('peak_tflops')}) = {c.get('expected_mfu')} (gap {c.get('mfu_rel_gap')}); perfd's "
             "median "
             f"step {c.get('perfd_median_step_ms')} ms on {c.get('gpu')}", "",
             f"Data share (perfd vs the job's own wait/step): {c.get('data_share')}", "",
             f"Comm share (Flight Recorder): {c.get('comm_total_ratio')}; busbw rows: "
             f"{c.get('busbw_link_ratio_rows')}", "", f"Incidents: {c.get('incidents')}",
             f"Cost check: {c.get('incident_cost')}", "", f"Rule firings: {c.get('rule_fired')}", "",
             f"OK: {res.get('ok')}" + (f"; error {res.get('error')}" if res.get("error") else ""), ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    res = run(out)
    (out / "hook_ddp_live.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (out / "hook_ddp_live.md").write_text(md)
    print(md)
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
