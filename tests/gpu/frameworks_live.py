"""On 1 GPU (H100): any PyTorch job as people write it, each against its own clock
(docs/evidence/entries/30-any-pytorch-job-as-people-write-it-against-each-loop-s-own-c.md).

    python3 tests/gpu/frameworks_live.py OUT_DIR [--jobs readme,loader,hf,lightning,incident]
    python3 tests/gpu/frameworks_live.py OUT_DIR --cpu-smoke      # the same pipeline, CPU torch, short

Five jobs (tests/gpu/frameworks_train.py), each started as ``python3 train.py`` under ``perfd launch``
with a real ``perfd agent --nvml real`` and ``perfd aggregator`` (no rules: nothing captured), each
fed by a ``DataLoader`` with two worker processes whose samples take a set time:

- ``readme``: the README's loop, the batch fetched before its step, ``hook.step`` only (0.12 s a
  sample, the issue's loop);
- ``loader``: the same through ``hook.loader(loader)``;
- ``hf``: a Hugging Face Trainer on a small Llama built from its config (no download), the perfd
  callback given ``model={**config.to_dict(), "seq_length": S}``;
- ``lightning``: a Lightning module (a GPT stack) with the perfd callback;
- ``incident``: the README's loop whose samples cost ``slow_x`` times as much for ``slow_s`` seconds
  mid-run (the data-slowdown incident), with the NVML samples of the rank's GPU.

Each job keeps its own clock (every fetch's start and end, every step's end after a device sync;
frameworks_train.py). After each job the script reads the aggregator's summary, iterations,
incidents and report, and checks (``check``): steady step time within 3% and data share within 3
points of the loop's clock over the same steady iterations, the model TFLOP/s within 3% of the
loop's own FLOPs over its own time, class data-bound, R1 the data loader, goodput with under 3% of
"other"; for ``incident`` one incident over the slow stretch (its ends within 20 steps of the
loop's slow batches, its cost within 15% of Σ(step − steady mean) over them), its cause the data
wait and its action the data loader, with real NVML samples.

OUT_DIR gets frameworks.json (every check and what it compared), per job the aggregator's answers,
and ``recordings/<job>/``: the hook's datagram stream (hook.jsonl.gz), the NVML recording of GPU 0
(nvml.jsonl.gz, the series an incident and the class read; absent on CPU), the loop's clock
(own.json.gz) and meta.json. tests/hook/test_frameworks_replay.py replays them through the agent's
hook collector and the aggregator on CPU: copy ``OUT_DIR/recordings/*`` over
tests/data/hook/frameworks/. Exit 0 only when every check holds. About 6 minutes on the H100 (jobs
~4.5 min, start-up and stop ~20 s each); every wait is bounded.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.procs import Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

HERE = Path(__file__).resolve().parent
JOBS = ("readme", "loader", "hf", "lightning", "incident")
TOTAL_S = float(os.environ.get("FRAMEWORKS_TOTAL_S", "470"))  # the whole run's bound (8 min less margin)
NO_RULES = "rules: []\n"  # nothing captured: the loops' clocks are not disturbed
CPU_PEAK_TFLOPS = 0.5  # the aggregator's peak for the CPU smoke (a CPU has no row in the peak table)

# What each job runs with on the GPU; --cpu-smoke scales it down (SMOKE).
_GPT = {"vocab": 8192, "hidden": 2048, "layers": 8, "heads": 16, "seq": 1024, "batch": 8}
GPU: dict[str, dict[str, Any]] = {
    "readme": {**_GPT, "sample_s": 0.12, "run_s": 35},
    "loader": {**_GPT, "sample_s": 0.12, "run_s": 35},
    "hf": {"vocab": 32000, "hidden": 1024, "layers": 8, "heads": 16, "kv_heads": 4, "ffn": 2816, "seq": 1024,
           "batch": 8, "sample_s": 0.06, "run_s": 40},
    "lightning": {**_GPT, "hidden": 1024, "sample_s": 0.06, "run_s": 40},
    "incident": {**_GPT, "hidden": 1024, "layers": 4, "sample_s": 0.02, "run_s": 100, "slow_at": 35,
                 "slow_s": 40, "slow_x": 3},
}
_TINY = {"vocab": 256, "hidden": 64, "layers": 2, "heads": 4, "seq": 64, "batch": 4}
SMOKE: dict[str, dict[str, Any]] = {
    "readme": {**_TINY, "sample_s": 0.04, "run_s": 10},
    "loader": {**_TINY, "sample_s": 0.04, "run_s": 10},
    "hf": {**_TINY, "kv_heads": 2, "ffn": 176, "sample_s": 0.04, "run_s": 14},
    "lightning": {**_TINY, "sample_s": 0.04, "run_s": 14},
    "incident": {**_TINY, "sample_s": 0.02, "run_s": 40, "slow_at": 14, "slow_s": 12, "slow_x": 3},
}
# The NVML series kept in a recording: what an incident's GPU evidence and the class read.
NVML_KEEP = ("perfd_gpu_utilization_ratio", "perfd_gpu_memory_used_bytes", "perfd_gpu_power_watts",
             "perfd_gpu_power_limit_watts", "perfd_gpu_temperature_celsius", "perfd_gpu_sm_clock_hertz",
             "perfd_gpu_throttle_active", "perfd_gpu_processes", "perfd_gpu_xid_errors_total",
             "perfd_gpu_sm_util_ratio", "perfd_gpu_sm_occupancy_ratio", "perfd_gpu_tensor_util_ratio",
             "perfd_gpu_dram_bw_util_ratio")
EDGE_STEPS = 20
COST_REL = 0.15


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the loop's own clock against perfd's ------------------------------------------------------------


def own_steps(own: dict[str, Any]) -> dict[int, tuple[float, float]]:
    """Step n (the hook's number: 1, 2, ... in order) -> (its period, the fetch time inside it), in
    seconds, by the loop's own clock: from step n-1's end to its own, and every fetch interval's part
    that lies in between (wherever the loop fetched: before the step, inside it, a batch ahead)."""
    ends = [float(e) for e in own["ends"]]
    fetches = sorted((float(a), float(b)) for a, b in own["fetches"])
    out: dict[int, tuple[float, float]] = {}
    k = 0
    for n in range(2, len(ends) + 1):
        lo, hi = ends[n - 2], ends[n - 1]
        while k < len(fetches) and fetches[k][1] <= lo:
            k += 1
        wait, j = 0.0, k
        while j < len(fetches) and fetches[j][0] < hi:
            wait += max(0.0, min(fetches[j][1], hi) - max(fetches[j][0], lo))
            j += 1
        out[n] = (hi - lo, wait)
    return out


def slow_stretch(own: dict[str, Any]) -> tuple[int, int] | None:
    """The first and last step whose batch was made in the slow phase (the incident's truth)."""
    slow = [n for n, s in enumerate(own.get("slow") or [], start=1) if s]
    return (min(slow), max(slow)) if slow else None


def check(kind: str, own: dict[str, Any], full: dict[str, Any], incidents: list[dict[str, Any]],
          iterations: list[dict[str, Any]]) -> dict[str, Any]:
    """perfd's answers for one job (the summary as GET /api/jobs/<job>/summary serves it, the
    incidents, the iterations) against the loop's own clock. Keys ``ok_*`` are the checks."""
    steps = own_steps(own)
    summ = full.get("summary") or {}
    med = summ.get("medians") or {}
    rep = full.get("report") or {}
    steady = [r["iteration"] for r in iterations if r.get("steady_state") and r["iteration"] in steps]
    c: dict[str, Any] = {"n_steps": len(own["ends"]), "n_steady": len(steady)}
    if len(steady) < 10:
        c["ok_enough_steady"] = False
        return c
    period = statistics.fmean(steps[i][0] for i in steady)
    share = sum(steps[i][1] for i in steady) / sum(steps[i][0] for i in steady)
    c["own"] = {"step_ms": round(period * 1e3, 2), "data_share": round(share, 4)}
    c["perfd"] = {k: med.get(k) for k in ("step_time_ms", "in_step_ms", "data_share", "outside_share",
                                          "model_tflops_per_gpu", "mfu")}
    got_ms = med.get("step_time_ms")
    c["ok_step_time"] = got_ms is not None and abs(got_ms / (period * 1e3) - 1) <= 0.03
    c["ok_data_share"] = med.get("data_share") is not None and abs(med["data_share"] - share) <= 0.03
    flops = own.get("flops_per_step") or own.get("reference_flops")
    if flops:
        tflops = flops / period / 1e12
        c["own"]["tflops"] = round(tflops, 3)
        got = med.get("model_tflops_per_gpu")
        c["ok_tflops"] = got is not None and abs(got / tflops - 1) <= 0.03
    c["bottleneck"] = summ.get("bottleneck")
    c["ok_class"] = c["bottleneck"] == "data-bound"
    r1 = (rep.get("recommendations") or [{}])[0]
    c["r1"] = {k: r1.get(k) for k in ("finding_id", "action", "remedy")}
    if kind != "incident":
        c["ok_r1"] = r1.get("finding_id") == "data-loading"
    gp = summ.get("goodput") or {}
    parts, wall = gp.get("parts_s") or {}, gp.get("wall_s") or 0
    c["goodput"] = {"ratio": gp.get("ratio"), "other_s": parts.get("other"), "wall_s": wall}
    c["ok_goodput_other"] = bool(wall) and (parts.get("other") or 0) <= 0.03 * wall
    if kind == "incident":
        c.update(check_incident(own, steps, steady, incidents, rep))
    return c


def check_incident(own: dict[str, Any], steps: dict[int, tuple[float, float]], steady: list[int],
                   incidents: list[dict[str, Any]], rep: dict[str, Any]) -> dict[str, Any]:
    truth = slow_stretch(own)
    c: dict[str, Any] = {"slow_stretch": truth}
    if truth is None:
        c["ok_slow_stretch"] = False
        return c
    first, last = truth
    base = statistics.fmean(steps[i][0] for i in steady)
    cost = sum(steps[i][0] - base for i in range(first, last + 1) if i in steps)
    incs = [i for i in incidents if "capture" not in (i.get("kinds") or [])]
    over = [i for i in incs
            if i["last_iteration"] >= first - EDGE_STEPS and i["first_iteration"] <= last + EDGE_STEPS]
    c["incidents"] = [{k: i.get(k) for k in ("id", "first_iteration", "last_iteration", "cost_s", "cause")}
                      | {"verdict_cause": (i.get("verdict") or {}).get("cause")} for i in incs]
    c["truth_cost_s"] = round(cost, 2)
    c["ok_one_incident"] = len(over) == 1 and len(incs) == 1
    if len(over) == 1:
        inc = over[0]
        c["start_off"], c["end_off"] = inc["first_iteration"] - first, inc["last_iteration"] - last
        c["ok_edges"] = abs(c["start_off"]) <= EDGE_STEPS and abs(c["end_off"]) <= EDGE_STEPS
        c["ok_cost"] = inc.get("cost_s") is not None and abs(inc["cost_s"] / cost - 1) <= COST_REL
        c["ok_cause_data"] = (inc.get("verdict") or {}).get("cause") == "data_wait"
        # The incident's action: its own recommendation, or, where it asks what the run's data-loading
        # one asks, that one (the report keeps one of two recommendations with the same action).
        recs = rep.get("recommendations") or []
        mine = [r for r in recs if r.get("finding_id") == f"incident-{inc['id']}"]
        if not mine and c["ok_cause_data"]:
            mine = [r for r in recs if r.get("finding_id") == "data-loading"]
        action = str(mine[0].get("action")) if mine else ""
        c["incident_action"] = action or None
        c["ok_action_data"] = "data" in action.lower() and not action.startswith("Check rank")
    return c


# ---- one job under the real stack ------------------------------------------------------------------


def run_job(out: Path, kind: str, params: dict[str, Any], smoke: bool, budget_s: float) -> dict[str, Any]:
    raw = out / kind
    raw.mkdir(parents=True, exist_ok=True)
    job = f"fw-{kind}"
    res: dict[str, Any] = {"job": job, "kind": kind, "params": params}
    env = run_env(drop=("RANK", "LOCAL_RANK", "WORLD_SIZE", "KINETO_USE_DAEMON"))
    if smoke:
        env["CUDA_VISIBLE_DEVICES"] = ""
    procs = Procs(raw, env, say=say)
    own_path, record = raw / "own.json", raw / "hook.jsonl"
    p = {**params, "kind": kind, "own": str(own_path), "record": str(record), "cpu": smoke}
    t_start = time.time()
    try:
        (raw / "rules.yaml").write_text(NO_RULES)
        agg_args: list[str | Path] = ["--rules", raw / "rules.yaml"]
        if smoke:
            agg_args += ["--peak-tflops", str(CPU_PEAK_TFLOPS)]
        grpc_port, _, url = start_aggregator(procs, *agg_args)
        base = f"{url}/api"
        if not smoke:  # the rank's GPU, recorded beside the agent (NVML allows both)
            procs.start("nvml", [sys.executable, "-m", "perfd.collectors.nvml.record",
                                 str(raw / "nvml.jsonl"),
                                 "--duration", str(int(params["run_s"]) + 90), "--interval", "0.5",
                                 "--devices", "0"])
        launch = procs.perfd("launch", "launch", "--job", job, "--run-dir", str(raw / "run"), "--",
                             sys.executable, str(HERE / "frameworks_train.py"), json.dumps(p))
        manifest = wait_manifest(raw / "run" / "launch.json", launch)
        (raw / "agent.yaml").write_text("batch_interval_s: 0.5\n")
        start_agent(procs, grpc_port, manifest=manifest, config=raw / "agent.yaml",
                    nvml="off" if smoke else "real")
        polls: list[dict[str, Any]] = []
        deadline = t_start + budget_s
        while launch.poll() is None and time.time() < deadline:
            try:
                s = get_json(f"{base}/jobs/{job}/summary").get("summary") or {}
                polls.append({"t": round(time.time() - t_start, 1), "bottleneck": s.get("bottleneck"),
                              "data_share": (s.get("medians") or {}).get("data_share")})
            except Exception as exc:
                polls.append({"t": round(time.time() - t_start, 1), "error": repr(exc)[:200]})
            time.sleep(5)
        res["job_exit"] = launch.poll()
        res["polls"] = polls
        if res["job_exit"] is None:
            raise TimeoutError(f"{kind}: the job ran past its {budget_s:.0f} s")
        time.sleep(6)  # the agent's last batch, the aggregator's refresh
        full = get_json(f"{base}/jobs/{job}/summary")
        res["summary"] = full.get("summary")
        res["report"] = full.get("report")
        res["incidents"] = get_json(f"{base}/jobs/{job}/incidents").get("incidents") or []
        res["iterations"] = get_json(f"{base}/jobs/{job}/iterations?sources=0").get("iterations") or []
        res["own"] = json.loads(own_path.read_text())
        res["check"] = check(kind, res["own"], full, res["incidents"], res["iterations"])
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
    finally:
        procs.stop()
        res["tails"] = procs.tails(("aggregator", "agent", "launch", "nvml"))
    res["wall_s"] = round(time.time() - t_start, 1)
    save_recording(out / "recordings" / kind, raw, res, smoke)
    return res


def save_recording(dst: Path, raw: Path, res: dict[str, Any], smoke: bool) -> None:
    """What the CPU suite replays: the hook's datagrams, the NVML series an incident reads, the
    loop's clock, and how they were made (meta.json)."""
    dst.mkdir(parents=True, exist_ok=True)
    if (raw / "hook.jsonl").exists():
        with open(raw / "hook.jsonl", "rb") as f, gzip.open(dst / "hook.jsonl.gz", "wb") as g:
            shutil.copyfileobj(f, g)
    if (raw / "own.json").exists():
        with gzip.open(dst / "own.json.gz", "wt") as g:
            g.write((raw / "own.json").read_text())
    nvml = raw / "nvml.jsonl"
    if nvml.exists():
        with gzip.open(dst / "nvml.jsonl.gz", "wt") as g:
            for line in nvml.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # the recorder was stopped mid-line
                if rec.get("type") == "collect":
                    rec["samples"] = [s for s in rec.get("samples") or [] if s.get("name") in NVML_KEEP]
                g.write(json.dumps(rec) + "\n")
    meta = {"job": res["job"], "kind": res["kind"], "params": res["params"],
            "device": "cpu" if smoke else "gpu",
            "peak_tflops": CPU_PEAK_TFLOPS if smoke else None, "recorded": time.strftime("%Y-%m-%d"),
            "made_by": "tests/gpu/frameworks_live.py" + (" --cpu-smoke" if smoke else ""),
            "live_check": res.get("check")}
    (dst / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--cpu-smoke", action="store_true", help="CPU torch, tiny models, short runs, no NVML")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    table = SMOKE if args.cpu_smoke else GPU
    began = time.time()
    results: dict[str, Any] = {}
    for kind in args.jobs.split(","):
        left = TOTAL_S - (time.time() - began)
        need = float(table[kind]["run_s"]) + 60
        if left < need:
            results[kind] = {"skipped": f"{left:.0f} s left of {TOTAL_S:.0f}, the job needs ~{need:.0f}"}
            continue
        say(f"job {kind}")
        res = run_job(args.out, kind, table[kind], args.cpu_smoke, min(left - 20, need + 60))
        results[kind] = res
        (args.out / f"{kind}.json").write_text(json.dumps(res, indent=1, default=str))
        say(f"{kind}: {json.dumps(res.get('check') or res.get('error'), default=str)[:1500]}")
    checks = {k: (r.get("check") or {"error": r.get("error") or r.get("skipped")})
              for k, r in results.items()}
    summary = {"total_s": round(time.time() - began, 1), "cpu_smoke": args.cpu_smoke, "checks": checks,
               "failed": {k: [n for n, v in c.items() if n.startswith("ok_") and not v] or c.get("error")
                          for k, c in checks.items()
                          if c.get("error") or not all(v for n, v in c.items() if n.startswith("ok_"))}}
    (args.out / "frameworks.json").write_text(json.dumps(summary, indent=1, default=str))
    say(json.dumps(summary["failed"] or "every check holds", default=str))
    return 0 if not summary["failed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
