"""On 2 GPUs: the whole diagnosis loop on a real Megatron-LM DP=2 job with a co-tenant.

    MEGATRON_DIR=... python3 tests/gpu/incident_live.py OUT_DIR

Megatron-LM is not part of this repository: MEGATRON_DIR points at a checkout (core 0.20 was
used). Starts `perfd aggregator` with one rule (a rank's compute ratio > 1.2 for 10 s → a Kineto
capture of the slowest rank, 3 steps), `perfd launch --kineto --flight-recorder` around
`torchrun pretrain_gpt.py` (DP=2, per-rank timers, straggler detector), and `perfd agent
--launch-manifest --nvml real`. After WARM_S seconds of training a foreign bf16 matmul process
runs on GPU 1 for CO_TENANT_S seconds. Polls /api/jobs/<job>/incidents while it runs (when the
incident opens, whether it names rank 1 and the foreign pid), and after the job writes what the
aggregator kept: incidents, captures with findings, the report, the bottleneck class and its
sources. Writes OUT_DIR/incident_live.json and .md; exit 0 when the incident named rank 1 and the
foreign process, cost within 10% of Σ(step − steady median) from the log, and the capture joined it.
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

from tests.procs import Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

JOB = "dp2-cotenant"
ITERS = int(os.environ.get("MEGATRON_ITERS", "170"))
WARM_S = float(os.environ.get("WARM_S", "75"))  # after the launch: start-up (~40 s) + steady steps
CO_TENANT_S = float(os.environ.get("CO_TENANT_S", "30"))
RULES = """
rules:
  - name: slow_rank_capture
    expr: rank_compute_ratio > 1.2
    scope: rank
    for: 10s
    severity: warning
    action:
      type: capture
      tool: kineto
      targets: {slowest_rank: true}
      steps: 3
      cooldown: 1h
      max_per_hour: 1
"""
BURN = """
import os, time, torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(os.environ["BURN_S"])
while time.time() < end:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize()
"""


def megatron_argv(megatron: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_port", "29533", str(megatron / "pretrain_gpt.py"), "--num-layers", "12",
            "--hidden-size", "2048",
            "--num-attention-heads", "16", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--micro-batch-size", "4", "--global-batch-size", "64", "--train-iters", str(ITERS),
            "--lr", "1e-4", "--lr-decay-style", "constant", "--bf16", "--mock-data",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000", "--transformer-impl", "local",
            "--no-persist-layer-norm", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
            "--log-interval", "1", "--log-throughput", "--timing-log-level", "2",
            "--timing-log-option", "all",
            "--log-straggler", "--eval-iters", "0", "--eval-interval", "100000", "--disable-bias-linear",
            "--exit-interval", str(ITERS)]


def log_steps(log: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = re.search(r" iteration\s+(\d+)/.*elapsed time per iteration \(ms\): ([0-9.]+)", line)
        if m:
            out[int(m.group(1))] = float(m.group(2))
    return out


def run(out: Path, megatron: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"job": JOB, "warm_s": WARM_S, "co_tenant_s": CO_TENANT_S}
    procs = Procs(out, run_env(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                               NVSHMEM_DISABLE_NVLS="1", CUDA_DEVICE_MAX_CONNECTIONS="1"))
    try:
        (out / "rules.yaml").write_text(RULES)
        grpc_port, _, url = start_aggregator(procs, "--rules", out / "rules.yaml", "--rules-interval", "1")
        base = f"{url}/api"
        run_dir = out / "run"
        t0 = time.time()
        launch = procs.perfd("launch", "launch", "--job", JOB, "--run-dir", str(run_dir), "--kineto",
                             "--flight-recorder", str(out / "fr"), "--", *megatron_argv(megatron))
        manifest = wait_manifest(run_dir / "launch.json", launch)
        (out / "agent.yaml").write_text(f"capture_dir: {out / 'captures'}\nbatch_interval_s: 0.5\n")
        start_agent(procs, grpc_port, manifest=manifest, config=out / "agent.yaml")
        while time.time() - t0 < WARM_S:
            time.sleep(1)
        burn = procs.start("cotenant", [sys.executable, "-c", BURN],
                           env={"CUDA_VISIBLE_DEVICES": "1", "BURN_S": str(CO_TENANT_S)})
        t_burn = time.time()
        res["cotenant"] = {"pid": burn.pid, "cmdline": f"{sys.executable} -c <bf16 matmul loop>",
                           "started_s_after_launch": round(t_burn - t0, 1)}
        seen: list[dict[str, Any]] = []
        while launch.poll() is None and time.time() - t0 < 480:
            try:
                incs = get_json(f"{base}/jobs/{JOB}/incidents")["incidents"]
            except Exception as exc:  # not yet known to the aggregator
                incs = [{"error": repr(exc)}]
            for inc in incs:
                if "id" in inc and not any(s["id"] == inc["id"] for s in seen):
                    seen.append({"id": inc["id"], "seen_s_after_cotenant": round(time.time() - t_burn, 1),
                                 "ranks": inc.get("ranks"), "cause": inc.get("cause"),
                                 "names_foreign_pid": f"pid {burn.pid}" in str(inc.get("cause"))})
            time.sleep(2)
        res["job_exit"] = launch.poll()
        res["incidents_while_running"] = seen
        time.sleep(6)  # the last iterations and the capture report reach the aggregator
        summary = get_json(f"{base}/jobs/{JOB}/summary")
        res["incidents_after"] = summary.get("incidents")
        res["report_headline"] = (summary.get("report") or {}).get("summary", {}).get("headline")
        res["bottleneck"] = (summary.get("summary") or {}).get("bottleneck")
        res["bottleneck_reason"] = (summary.get("summary") or {}).get("bottleneck_reason")
        res["bottleneck_sources"] = (summary.get("summary") or {}).get("bottleneck_sources")
        res["findings"] = [{"id": f["id"], "title": f["title"], "observation": f["observation"][:600]}
                           for f in (summary.get("report") or {}).get("findings", [])]
        report = summary.get("report") or {}
        res["recommendations"] = [r["action"] for r in report.get("recommendations", [])]
        res["captures"] = [{k: c.get(k) for k in ("id", "status", "ranks", "tool", "origin", "started_at",
                                                  "finished_at", "bottleneck", "bottleneck_reason")}
                           | {"findings": [f["title"] for f in c.get("findings") or []]}
                           for c in get_json(f"{base}/captures")["captures"]]
        res["events"] = [{"kind": e.get("kind"), "text": str(e.get("text"))[:300]}
                         for e in get_json(f"{base}/events")["events"]
                         if e.get("kind") in ("incident_opened", "incident_closed", "rule_firing",
                                              "capture_started", "capture_finished", "capture_failed")]
        steps = log_steps(run_dir / "output.log")
        for name in ("output.log", "output.log.times"):  # the recorded log, for offline tests
            if (run_dir / name).exists():
                (out / name.replace("output", "dp2_cotenant")).write_bytes((run_dir / name).read_bytes())
        res["log_steps"] = len(steps)
        incs = res["incidents_after"] or []
        main = max(incs, key=lambda i: i.get("cost_s") or 0.0) if incs else None
        if main is not None and steps:
            inside = [v for k, v in steps.items() if main["first_iteration"] <= k <= main["last_iteration"]]
            calm = [v for k, v in steps.items() if k > 10 and not
                    (main["first_iteration"] <= k <= main["last_iteration"])]
            ref = statistics.median(calm)
            want = sum(v - ref for v in inside) / 1e3
            res["check"] = {"incident": main["id"], "cost_s": main["cost_s"], "sum_step_minus_median_s": want,
                            "rel_diff": abs(main["cost_s"] - want) / want if want else None,
                            "steady_median_ms": ref, "ranks": main.get("ranks"),
                            "cause_names_pid": f"pid {burn.pid}" in str(main.get("cause")),
                            "captures_joined": [c.get("id") for c in main.get("captures") or []]}
            c = res["check"]
            res["ok"] = bool(c["ranks"] and c["ranks"][0] == 1 and c["cause_names_pid"]
                             and c["rel_diff"] is not None and c["rel_diff"] <= 0.10)
        else:
            res["ok"] = False
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
        res["ok"] = False
    finally:
        procs.stop()
        res["logs"] = procs.tails()
    return res


def markdown(res: dict[str, Any]) -> str:
    lines = ["# The diagnosis loop on a real Megatron-LM DP=2 job with a co-tenant on GPU 1", "",
             f"Co-tenant: {res.get('cotenant')}; job exit {res.get('job_exit')}; {res.get('log_steps')} "
             "iterations logged.", "", "## While it ran", ""]
    lines += [f"- {s}" for s in res.get("incidents_while_running", [])]
    lines += ["", "## After the job (what the aggregator kept)", "",
              f"Headline: {res.get('report_headline')}", "",
              f"Bottleneck: {res.get('bottleneck')} — {res.get('bottleneck_reason')}",
              f"Sources: {res.get('bottleneck_sources')}", "", f"Check: {res.get('check')}", ""]
    for inc in res.get("incidents_after") or []:
        lines.append(f"- {inc.get('id')}: iterations {inc.get('first_iteration')}–"
                     f"{inc.get('last_iteration')}, ranks {inc.get('ranks')}, {inc.get('cost_s')} s lost; "
                     f"{inc.get('cause')}; captures "
                     f"{[c.get('id') for c in inc.get('captures') or []]}")
    lines += ["", "Captures:", *[f"- {c}" for c in res.get("captures", [])], "", "Events:",
              *[f"- {e['kind']}: {e['text']}" for e in res.get("events", [])], "",
              "Findings:", *[f"- {f['id']}: {f['title']}" for f in res.get("findings", [])], "",
              f"OK: {res.get('ok')}" + (f"; error {res.get('error')}" if res.get("error") else ""), ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    megatron = Path(os.environ.get("MEGATRON_DIR", "")).resolve()
    if not (megatron / "pretrain_gpt.py").exists():
        print("set MEGATRON_DIR to a Megatron-LM checkout", file=sys.stderr)
        return 2
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    res = run(out, megatron)
    (out / "incident_live.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (out / "incident_live.md").write_text(md)
    print(md)
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
