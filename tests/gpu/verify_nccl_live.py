"""On 2 GPUs: NCCL collective timings through the live pipeline, checked against a timeline.

    python3 tests/gpu/verify_nccl_live.py OUT_DIR [--parts live,timing,hang]

Every part is independent, bounded and reports its errors instead of raising (about 4 minutes):

- ``live``: `perfd aggregator`, a DDP job (torchrun, 2 ranks, fp32 MLP 8 x 8192², ~2 GiB of
  gradients all-reduced in 256 MiB buckets per step) under
  ``perfd launch --flight-recorder DIR --fr-timing``, with the perfd step hook in the loop, and
  ``perfd agent --launch-manifest`` (nccl + hook collectors). The job itself records a
  torch.profiler (Kineto) Chrome trace of 5 steps on each rank. perfd's total communication share of
  those 5 iterations (Flight Recorder durations, via /api/jobs/<job>/summary) is compared with
  comm_ms / span_ms of the same steps' timeline (perfd.capture.chrome_trace): target within 3
  points. Also reported: perfd's steady-state share, bus bandwidth per group, wait asymmetry.
- ``timing``: the cost of ``TORCH_NCCL_ENABLE_TIMING=1``: the same job without agent or hook,
  Flight Recorder on, timing off/on/on/off (paired runs); median step time of each run.
- ``hang``: rank 1 sleeps 20 s before an all_reduce that rank 0 has entered; the agent (hang
  threshold 5 s, a dump every second) and the aggregator must report the hang with rank 1 as the
  rank that did not join, within threshold + a few seconds; then the hang must resolve.

Writes OUT_DIR/nccl_live.json and OUT_DIR/nccl_live.md. Exit 0 when every part that ran passed.
Worker mode (what torchrun runs): ``verify_nccl_live.py --worker MODE DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.procs import (
    NOT_YET,
    Procs,
    free_port,
    get_json,
    http_get,
    run_env,
    start_agent,
    start_aggregator,
    tail,
    wait_for,
    wait_manifest,
)

TOTAL_BUDGET_S = 330.0
HANG_THRESHOLD_S = 5.0
HANG_SLEEP_S = 20.0
STEPS = int(os.environ.get("NCCL_LIVE_STEPS", "300"))
BENCH_STEPS = int(os.environ.get("NCCL_LIVE_BENCH_STEPS", "150"))
PROFILE_AT, PROFILE_STEPS = STEPS - 60, 5  # well before the end: the last dumps must cover them
HIDDEN = int(os.environ.get("NCCL_LIVE_HIDDEN", "8192"))
LAYERS = int(os.environ.get("NCCL_LIVE_LAYERS", "8"))
BATCH = int(os.environ.get("NCCL_LIVE_BATCH", "512"))
BUCKET_MB = int(os.environ.get("NCCL_LIVE_BUCKET_MB", "256"))
SMOKE = os.environ.get("NCCL_LIVE_CPU_SMOKE") == "1"  # see _smoke_dumper


def _smoke_dumper(torch: Any, rank: int) -> None:
    """CPU smoke test only: Gloo has no dump FIFO, so a thread writes the Flight Recorder ring where
    NCCL would, twice a second (no durations: Gloo has no timing)."""
    import threading

    path = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank)

    def loop() -> None:
        while True:
            data = torch._C._distributed_c10d._dump_fr_trace()
            with open(path + ".tmp", "wb") as fh:
                fh.write(data)
            os.replace(path + ".tmp", path)
            time.sleep(0.5)

    threading.Thread(target=loop, daemon=True).start()


# ------------------------------------------------------------------------------------ worker


def worker(mode: str, run_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    sync = (lambda: None) if SMOKE else torch.cuda.synchronize
    if SMOKE:  # CPU smoke test of this driver (no GPU): Gloo, and dumps written by a thread
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
        _smoke_dumper(torch, rank)
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    if mode == "hang":
        t = torch.ones(1 << 20, device=dev)
        for _ in range(5):
            dist.all_reduce(t)
        sync()
        if rank == 1:
            time.sleep(HANG_SLEEP_S)  # rank 0 is inside the next all_reduce, waiting for us
        else:
            (run_dir / "hang_started").write_text(str(time.time_ns()))
        dist.all_reduce(t)
        sync()
        time.sleep(4.0)  # the agent dumps once more: the hang's completion reaches the aggregator
        dist.barrier()
        dist.destroy_process_group()
        return
    from perfd.hook import StepHook

    model = torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(LAYERS)]).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=None if SMOKE else [local],
                                                    bucket_cap_mb=BUCKET_MB, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-9)
    x = torch.randn(BATCH, HIDDEN, device=dev)
    hook = StepHook(warmup_steps=5, cuda=not SMOKE) if mode == "train" else None
    prof: Any = None
    times: list[float] = []
    for i in range(1, (STEPS if mode == "train" else BENCH_STEPS) + 1):
        t0 = time.perf_counter()
        if hook is not None:
            hook.step_begin(i)
        loss = ddp(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        loss.item()  # a sync per step, as logging the loss does: host and GPU step ends agree
        if mode == "train" and i == PROFILE_AT - 1:
            # Start (slow: CUPTI set-up) inside step P-1, stop after step P+K-1 has ended: the
            # profiler's own start and export fall outside the windows of the profiled steps.
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.start()
        if hook is not None:
            hook.step_end()
        times.append(time.perf_counter() - t0)
        if prof is not None and i == PROFILE_AT + PROFILE_STEPS - 1:
            prof.stop()
            prof.export_chrome_trace(str(run_dir / f"trace_rank{rank}.json"))
            prof = None
            if not SMOKE:
                _save_fr_entries(torch, run_dir / f"fr_rank{rank}.json")
    if hook is not None:
        hook.close(timeout_s=1.0)
    (run_dir / f"steps_rank{rank}.json").write_text(json.dumps({
        "rank": rank, "step_s": times, "profiled": list(range(PROFILE_AT, PROFILE_AT + PROFILE_STEPS)),
        "params": sum(p.numel() for p in model.parameters()),
        "gpu": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(dev), "torch": torch.__version__,
        "nccl": None if SMOKE else ".".join(map(str, torch.cuda.nccl.version())),
        "timing_env": os.environ.get("TORCH_NCCL_ENABLE_TIMING")}))
    if mode == "train":
        time.sleep(3.0)  # the agent triggers a dump every second: the last steps get dumped too
    dist.barrier()
    dist.destroy_process_group()


def _save_fr_entries(torch: Any, path: Path) -> None:
    """This rank's Flight Recorder ring, as the job sees it right after the profiled steps: the
    driver matches each collective's duration_ms with its NCCL kernel in the Kineto trace."""
    import pickle

    try:
        raw = pickle.loads(torch._C._distributed_c10d._dump_nccl_trace())  # our own process's ring
        rows = [{"seq": e.get("collective_seq_id"), "pg": e.get("pg_id"), "op": e.get("profiling_name"),
                 "created_ns": e.get("time_created_ns"), "duration_ms": e.get("duration_ms"),
                 "started_ns": e.get("time_discovered_started_ns"), "state": e.get("state"),
                 "sizes": e.get("input_sizes")} for e in raw.get("entries", [])]
        path.write_text(json.dumps(rows))
    except Exception as exc:  # diagnostics only: never fail the run
        path.write_text(json.dumps({"error": repr(exc)}))


def match_fr_to_kernels(fr_path: Path, trace_path: Path) -> dict[str, Any]:
    """Per collective: Flight Recorder duration_ms against its NCCL kernel's duration in the Kineto
    trace. The profiled steps' collectives are the last len(kernels) entries of process group 0
    created before the trace's last kernel (one stream, same order on both sides)."""
    rows = json.loads(fr_path.read_text())
    if isinstance(rows, dict):
        return {"error": rows.get("error")}
    trace = json.loads(trace_path.read_text())
    nccl = ("ncclDevKernel", "ncclKernel")
    all_k = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
    kernels = sorted((e for e in all_k if str(e.get("name", "")).startswith(nccl)),
                     key=lambda e: float(e["ts"]))
    compute = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
                     for e in all_k if not str(e.get("name", "")).startswith(nccl))
    fr = sorted((r for r in rows if r.get("pg") == 0 and r.get("duration_ms") is not None),
                key=lambda r: r["seq"] or 0)
    if not kernels or len(fr) < len(kernels):
        return {"error": f"{len(kernels)} NCCL kernels, {len(fr)} timed Flight Recorder entries"}
    sel = fr[-len(kernels):]
    pairs = []
    for k, r in zip(kernels, sel, strict=True):
        ks, kd = float(k["ts"]), float(k.get("dur", 0))
        # compute kernels running at the NCCL kernel's start: SMs it had to wait for
        busy_at_start = any(a <= ks < b for a, b in compute)
        pairs.append({"seq": r["seq"], "fr_ms": r["duration_ms"], "kernel_ms": kd / 1e3,
                      "excess_ms": r["duration_ms"] - kd / 1e3, "compute_running_at_start": busy_at_start})
    fr_sum = sum(p["fr_ms"] for p in pairs)
    k_sum = sum(p["kernel_ms"] for p in pairs)
    overl = [p["excess_ms"] for p in pairs if p["compute_running_at_start"]]
    alone = [p["excess_ms"] for p in pairs if not p["compute_running_at_start"]]
    return {"n": len(pairs), "fr_sum_ms": fr_sum, "kernel_sum_ms": k_sum,
            "ratio": fr_sum / k_sum if k_sum else None,
            "median_excess_ms_compute_running": statistics.median(overl) if overl else None,
            "median_excess_ms_alone": statistics.median(alone) if alone else None,
            "n_compute_running": len(overl), "first_pairs": pairs[:12]}


# ------------------------------------------------------------------------------------ driver helpers


def new_procs(out: Path) -> Procs:
    """The processes of one part, with output in ``out``: no torchrun variables of our own passed on."""
    return Procs(out, run_env(drop=("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")))


def aggregator(ps: Procs) -> tuple[int, int]:
    """``perfd aggregator`` without rules: (gRPC port, HTTP port)."""
    grpc_port, http, _ = start_aggregator(ps, "--no-rules", ready=ps.out / "aggregator.ready",
                                          http_port=free_port())
    return grpc_port, http


def launch(ps: Procs, job: str, mode: str, fr_timing: bool, env: dict[str, str] | None = None) -> tuple[
        subprocess.Popen[bytes], Path]:
    run = ps.out / "run"
    run.mkdir(parents=True, exist_ok=True)
    flags = ["--fr-timing"] if fr_timing else []
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                str(free_port()), str(Path(__file__).resolve()), "--worker", mode, str(run)]
    p = ps.perfd("launch", "launch", "--job", job, "--run-dir", str(run), "--flight-recorder",
                 str(ps.out / "fr"), "--agent-socket", str(ps.out / "hook.sock"), *flags, "--", *torchrun,
                 env=env)
    return p, run / "launch.json"


def agent(ps: Procs, manifest: Path, grpc_port: int) -> None:
    cfg = ps.out / "agent.yaml"
    cfg.write_text("batch_interval_s: 0.2\ncollectors:\n  nccl:\n    flight_recorder:\n"
                   f"      interval_s: 1\n      hang_threshold_s: {HANG_THRESHOLD_S}\n")
    nvml = "off" if SMOKE else "real"  # NVML: the GPU's name, hence its link's bus bandwidth
    start_agent(ps, grpc_port, "--host", "off", manifest=manifest, nvml=nvml, config=cfg)


# ------------------------------------------------------------------------------------ parts


def part_live(out: Path, budget: float) -> dict[str, Any]:
    from perfd.capture.chrome_trace import analyze_chrome_trace

    res: dict[str, Any] = {"job": "ddp-live"}
    ps = new_procs(out)
    url = ""
    try:
        grpc_port, http = aggregator(ps)
        job, manifest = launch(ps, "ddp-live", "train", fr_timing=True)
        agent(ps, wait_manifest(manifest, job), grpc_port)
        rc = job.wait(timeout=max(30.0, budget - 40))
        res["job_exit"] = rc
        url = f"http://127.0.0.1:{http}/api/jobs/ddp-live/summary"
        steps = [json.loads((out / "run" / f"steps_rank{r}.json").read_text()) for r in (0, 1)]
        profiled = steps[0]["profiled"]
        res["step_ms_median"] = [1e3 * statistics.median(s["step_s"][20:]) for s in steps]
        res["params"], res["gpu"], res["torch"], res["nccl"] = (steps[0]["params"], steps[0]["gpu"],
                                                               steps[0]["torch"], steps[0]["nccl"])

        def covered() -> Any:
            c = get_json(url).get("collectives") or {}
            its = {it["iteration"] for it in c.get("iterations", [])}
            return c if set(profiled) <= its else None

        coll = wait_for(covered, 25, "the profiled iterations in the aggregator's analysis", ignore=NOT_YET)
        time.sleep(2.0)
        coll = get_json(url)["collectives"]
        res["perfd_summary"] = coll["summary"]
        res["method"] = coll["method"]
        res["bandwidth"] = coll["bandwidth"]
        res["waits"] = coll["waits"]
        res["findings"] = [f["title"] for f in coll["findings"]]
        its = {it["iteration"]: it for it in coll["iterations"]}
        per_rank: dict[str, Any] = {}
        for r in (0, 1):
            rows = [its[i] for i in profiled if i in its and str(r) in its[i]["share_by_rank"]]
            comm = sum(it["share_by_rank"][str(r)] * it["window_ms"] for it in rows)
            span = sum(it["window_ms"] for it in rows)
            trace = out / "run" / f"trace_rank{r}.json"
            tl = analyze_chrome_trace(trace)
            dev = max(tl.devices, key=lambda d: d.kernel_count)
            timeline = dev.comm_ms / dev.span_ms if dev.span_ms else None
            perfd = comm / span if span else None
            per_rank[str(r)] = {
                "perfd_share": perfd, "perfd_iterations": [it["iteration"] for it in rows],
                "perfd_window_ms": span, "timeline_share": timeline, "timeline_comm_ms": dev.comm_ms,
                "timeline_span_ms": dev.span_ms, "timeline_exposed_ms": dev.comm_exposed_ms,
                "timeline_device": dev.device,
                "diff_points": None if perfd is None or timeline is None else 100 * (perfd - timeline)}
            try:
                fr_file = out / "run" / f"fr_rank{r}.json"
                per_rank[str(r)]["fr_vs_kernels"] = match_fr_to_kernels(fr_file, trace)
            except Exception as exc:
                per_rank[str(r)]["fr_vs_kernels"] = {"error": repr(exc)}
        res["profiled_iterations"] = profiled
        res["per_rank"] = per_rank
        diffs = [abs(v["diff_points"]) for v in per_rank.values() if v["diff_points"] is not None]
        res["max_abs_diff_points"] = max(diffs) if len(diffs) == 2 else None
        res["ok"] = rc == 0 and len(diffs) == 2 and max(diffs) <= 3.0
        metrics = http_get(f"http://127.0.0.1:{http}/metrics").decode()
        res["metrics"] = [ln for ln in metrics.splitlines()
                          if ln.startswith(("perfd_job_comm_total", "perfd_job_collective"))]
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
        res["ok"] = False
        res["logs"] = {n: tail(out / f"{n}.out") for n in ("launch", "agent", "aggregator")}
        try:  # what the aggregator had, for the diagnosis
            c = get_json(url).get("collectives") or {} if url else {}
            keys = ("records", "sources", "timing", "method", "summary")
            res["last_collectives"] = {k: c.get(k) for k in keys}
            res["last_iterations"] = [it["iteration"] for it in c.get("iterations", [])]
        except Exception as exc2:
            res["last_collectives"] = repr(exc2)
    finally:
        ps.stop()
    return res


def part_timing(out: Path, budget: float) -> dict[str, Any]:
    res: dict[str, Any] = {"order": ["off", "on", "on", "off"], "runs": []}
    t_end = time.monotonic() + budget
    for i, timing in enumerate((False, True, True, False)):
        run_out = out / f"run{i}_{'on' if timing else 'off'}"
        run_out.mkdir(parents=True, exist_ok=True)
        ps = new_procs(run_out)
        entry: dict[str, Any] = {"timing": timing}
        try:
            left = t_end - time.monotonic()
            if left < 30:
                raise TimeoutError("no time left in this part's budget")
            p, _ = launch(ps, f"bench{i}", "bench", fr_timing=timing, env={"PERFD_HOOK_DISABLE": "1"})
            entry["exit"] = p.wait(timeout=min(90.0, left))
            steps = [json.loads((run_out / "run" / f"steps_rank{r}.json").read_text()) for r in (0, 1)]
            entry["timing_env"] = steps[0]["timing_env"]
            entry["median_step_ms"] = [1e3 * statistics.median(s["step_s"][20:]) for s in steps]
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["log"] = tail(run_out / "launch.out")
        finally:
            ps.stop()
        res["runs"].append(entry)
    off = [max(r["median_step_ms"]) for r in res["runs"] if not r["timing"] and "median_step_ms" in r]
    on = [max(r["median_step_ms"]) for r in res["runs"] if r["timing"] and "median_step_ms" in r]
    if off and on:
        res["median_step_ms_off"], res["median_step_ms_on"] = statistics.mean(off), statistics.mean(on)
        res["slowdown_pct"] = 100 * (res["median_step_ms_on"] / res["median_step_ms_off"] - 1)
        res["spread_off_pct"] = 100 * (max(off) - min(off)) / min(off)
        res["spread_on_pct"] = 100 * (max(on) - min(on)) / min(on)
    res["ok"] = len(off) == 2 and len(on) == 2
    return res


def part_hang(out: Path, budget: float) -> dict[str, Any]:
    res: dict[str, Any] = {"threshold_s": HANG_THRESHOLD_S, "sleep_s": HANG_SLEEP_S, "dump_interval_s": 1.0}
    ps = new_procs(out)
    try:
        grpc_port, http = aggregator(ps)
        job, manifest = launch(ps, "ddp-hang", "hang", fr_timing=False)
        agent(ps, wait_manifest(manifest, job), grpc_port)
        started_file = out / "run" / "hang_started"
        started_ns = int(wait_for(lambda: started_file.exists() and started_file.read_text(), 60,
                                  "rank 0 entering the all_reduce", ignore=NOT_YET))
        url = f"http://127.0.0.1:{http}/api/jobs/ddp-hang/summary"

        def active() -> Any:
            hangs = (get_json(url).get("collectives") or {}).get("hangs") or []
            return [h for h in hangs if h["active"]] or None

        hangs = wait_for(active, HANG_SLEEP_S + 5, "an active hang in the aggregator", ignore=NOT_YET)
        detected_ns = time.time_ns()
        res["detected_after_s"] = (detected_ns - started_ns) / 1e9
        res["hang"] = hangs[0]
        res["job_exit"] = job.wait(timeout=HANG_SLEEP_S + 25)

        def resolved() -> Any:
            hs = (get_json(url).get("collectives") or {}).get("hangs") or []
            return hs if hs and all(h["resolved"] for h in hs) else None

        try:
            res["after"] = wait_for(resolved, 15, "the hang resolved", ignore=NOT_YET)
            res["resolved"] = True
        except TimeoutError:
            res["resolved"] = False
        h = res["hang"]
        res["ok"] = (h["ranks_not_joined"] == [1] and h["stuck_ranks"] == [0]
                     and res["detected_after_s"] <= HANG_THRESHOLD_S + 6.0 and res["resolved"])
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
        res["ok"] = False
        res["logs"] = {n: tail(out / f"{n}.out") for n in ("launch", "agent", "aggregator")}
    finally:
        ps.stop()
    return res


# ------------------------------------------------------------------------------------ report


def markdown(results: dict[str, Any]) -> str:
    lines = ["# NCCL collective timings, live (tests/gpu/verify_nccl_live.py)", ""]
    live = results.get("live")
    if live:
        lines += ["## Total communication share: perfd (Flight Recorder) vs the Kineto timeline", ""]
        if "error" in live:
            lines.append(f"Failed: {live['error']}")
        else:
            lines += [f"GPU {live.get('gpu')}, torch {live.get('torch')}, NCCL {live.get('nccl')}, "
                      f"{live.get('params', 0) / 1e6:.0f} M fp32 parameters, median step "
                      f"{', '.join(f'{x:.1f}' for x in live.get('step_ms_median', []))} ms "
                      f"(ranks 0, 1); profiled iterations {live.get('profiled_iterations')}.", "",
                      "| rank | perfd share | timeline comm / span | diff (points) |", "|---|---|---|---|"]
            for r, v in sorted(live.get("per_rank", {}).items()):
                p, t, d = v.get("perfd_share"), v.get("timeline_share"), v.get("diff_points")
                diff = "n/a" if d is None else f"{d:+.2f}"
                lines.append(f"| {r} | {_pct(p)} | {_pct(t)} ({v.get('timeline_comm_ms', 0):.1f} / "
                             f"{v.get('timeline_span_ms', 0):.1f} ms) | {diff} |")
            s = live.get("perfd_summary") or {}
            bw = [(b["group"], round(b["median_busbw_gbs"]), b["link"], b["ratio"])
                  for b in live.get("bandwidth", [])]
            method = live.get("method", {}).get("name")
            lines += ["", "Flight Recorder duration vs the same collective's NCCL kernel (Kineto):", ""]
            for r, v in sorted(live.get("per_rank", {}).items()):
                m = v.get("fr_vs_kernels") or {}
                if "error" in m:
                    lines.append(f"- rank {r}: {m['error']}")
                    continue
                lines.append(
                    f"- rank {r}: {m.get('n')} collectives, FR {m.get('fr_sum_ms', 0):.1f} ms vs kernels "
                    f"{m.get('kernel_sum_ms', 0):.1f} ms (x{m.get('ratio') or 0:.2f}); median excess "
                    f"{m.get('median_excess_ms_compute_running')} ms when compute kernels ran at the "
                    f"NCCL kernel's start ({m.get('n_compute_running')}), "
                    f"{m.get('median_excess_ms_alone')} ms otherwise")
            lines += ["", f"perfd steady-state (median over the run): {_pct(s.get('comm_total_share'))}, "
                      f"by group {s.get('comm_share_by_group')}; method: {method}.",
                      f"Bus bandwidth (group, GB/s, link, ratio to the link): {bw}",
                      f"Target within 3 points: {'met' if live.get('ok') else 'NOT met'}."]
        lines.append("")
    tm = results.get("timing")
    if tm:
        lines += ["## Cost of TORCH_NCCL_ENABLE_TIMING=1 (paired runs, off/on/on/off)", ""]
        for r in tm.get("runs", []):
            lines.append(f"- timing {'on ' if r['timing'] else 'off'}: median step "
                         f"{r.get('median_step_ms', r.get('error'))}")
        if "slowdown_pct" in tm:
            lines.append(f"- slowdown with timing: {tm['slowdown_pct']:+.2f}% (spread between runs of the "
                         f"same setting: off {tm['spread_off_pct']:.2f}%, on {tm['spread_on_pct']:.2f}%)")
        lines.append("")
    hg = results.get("hang")
    if hg:
        lines += ["## Simulated hang (rank 1 sleeps before an all_reduce)", ""]
        if "error" in hg:
            lines.append(f"Failed: {hg['error']}")
        else:
            h = hg["hang"]
            lines += [f"- reported {hg['detected_after_s']:.1f} s after rank 0 entered the all_reduce "
                      f"(threshold {hg['threshold_s']:.0f} s, dumps every {hg['dump_interval_s']:.0f} s)",
                      f"- {h['text']}", f"- resolved afterwards: {hg['resolved']}; ok: {hg['ok']}"]
    return "\n".join(lines) + "\n"


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--parts", default="live,timing,hang")
    if "--worker" in sys.argv:
        i = sys.argv.index("--worker")
        worker(sys.argv[i + 1], Path(sys.argv[i + 2]))
        return 0
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    budgets = {"live": 120.0, "timing": 125.0, "hang": 85.0}
    results: dict[str, Any] = {"started": time.time(), "parts": args.parts.split(",")}
    for name, fn in (("live", part_live), ("timing", part_timing), ("hang", part_hang)):
        if name not in results["parts"]:
            continue
        left = TOTAL_BUDGET_S - (time.monotonic() - t0)
        if left < 40:
            results[name] = {"ok": False, "error": "skipped: total time budget spent"}
            continue
        d = args.out / name
        d.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        try:
            results[name] = fn(d, min(budgets[name], left))
        except Exception as exc:  # a part must never stop the others
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()[-3000:]}
        results[name]["seconds"] = round(time.monotonic() - t, 1)
        (args.out / "nccl_live.json").write_text(json.dumps(results, indent=1, default=str))
    results["seconds"] = round(time.monotonic() - t0, 1)
    (args.out / "nccl_live.json").write_text(json.dumps(results, indent=1, default=str))
    (args.out / "nccl_live.md").write_text(markdown(results))
    print(markdown(results))
    ok = all(results[p].get("ok") for p in results["parts"] if p in results)
    print("OK" if ok else "FAILED (see nccl_live.json)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
