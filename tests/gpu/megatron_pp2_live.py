"""On 2 GPUs: a real Megatron-LM PP=2 job under `perfd launch`, its communication share from the
Flight Recorder against the Kineto timeline of the same iterations.

    MEGATRON_DIR=... python3 tests/gpu/megatron_pp2_live.py OUT_DIR

Megatron-LM is not part of this repository: MEGATRON_DIR points at a checkout (core 0.20 was
used). The job is the shared fixture's configuration (TP=1 PP=2, 8 layers, hidden 1024, gbs 64,
mbs 4, bf16, mock data) run by ``perfd launch --flight-recorder DIR --fr-timing -- torchrun ...``
with `perfd aggregator` and ``perfd agent --launch-manifest`` (megatron + nccl collectors; step
windows from the iteration lines' arrival times, perfd.core.linetimes). Megatron's own PyTorch
profiler (``--profile --use-pytorch-profiler --profile-ranks 0 1``) records iterations
PROFILE_START..PROFILE_END-1 on both ranks. Compared: perfd's share of those iterations
(/api/jobs/<job>/summary, per-iteration shares weighted by window) with comm_ms / span_ms of each
rank's trace (perfd.capture.chrome_trace), and per ProfilerStep#N range on the GPU. Target: within
3 points. Writes OUT_DIR/megatron_live.json and .md; exit 0 when the target is met.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gpu.verify_nccl_live import agent, aggregator, new_procs
from tests.procs import NOT_YET, get_json, tail, wait_for, wait_manifest

PP = int(os.environ.get("MEGATRON_PP", "2"))  # 1: data parallel over the two GPUs (DP=2)
JOB = f"megatron-pp{PP}" if PP > 1 else "megatron-dp2"
TRAIN_ITERS = int(os.environ.get("MEGATRON_ITERS", "70"))
PROFILE_START, PROFILE_END = 50, 55


def megatron_argv(megatron: Path, tb_dir: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            str(megatron / "pretrain_gpt.py"), "--tensor-model-parallel-size", "1",
            "--pipeline-model-parallel-size", str(PP), "--num-layers", "8", "--hidden-size", "1024",
            "--num-attention-heads", "16", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--micro-batch-size", "4", "--global-batch-size", "64", "--train-iters", str(TRAIN_ITERS),
            "--lr", "1e-4", "--lr-decay-style", "constant", "--bf16", "--mock-data",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000", "--transformer-impl", "local",
            "--no-persist-layer-norm", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
            "--log-interval", "1", "--log-throughput", "--timing-log-level", "2", "--eval-iters", "0",
            "--eval-interval", "100000", "--disable-bias-linear",
            "--profile", "--use-pytorch-profiler", "--profile-step-start", str(PROFILE_START),
            "--profile-step-end", str(PROFILE_END), "--profile-ranks", "0", "1",
            "--tensorboard-dir", str(tb_dir)]


def step_ranges(trace: Path) -> dict[int, tuple[float, float, float]]:
    """ProfilerStep#N on the GPU: N -> (span ms, NCCL-kernel union ms inside it, start ms)."""
    from perfd.capture.analysis import total, union
    from perfd.capture.chrome_trace import read_chrome_trace

    data = read_chrome_trace(trace)
    out: dict[int, tuple[float, float, float]] = {}
    nccl = sorted((k.start_ns, k.end_ns) for k in data.kernels if "nccl" in k.name.lower())
    for r in data.nvtx:
        if not r.name.startswith("ProfilerStep#") or r.device is None:
            continue
        n = int(r.name.split("#")[1])
        cut = [(max(s, r.start_ns), min(e, r.end_ns)) for s, e in nccl if e > r.start_ns and s < r.end_ns]
        out[n] = ((r.end_ns - r.start_ns) / 1e6, total(union(cut)) / 1e6, r.start_ns / 1e6)
    return out


def run(out: Path, megatron: Path) -> dict[str, Any]:
    from perfd.capture.chrome_trace import analyze_chrome_trace

    res: dict[str, Any] = {"job": JOB, "profiled_iterations": list(range(PROFILE_START, PROFILE_END))}
    ps = new_procs(out)
    url = ""
    try:
        grpc_port, http = aggregator(ps)
        run_dir = out / "run"
        tb = out / "tb" / "tensorboard"
        tb.mkdir(parents=True, exist_ok=True)
        env = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
               "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        t0 = time.monotonic()
        launch = ps.perfd("launch", "launch", "--job", JOB, "--run-dir", str(run_dir), "--flight-recorder",
                          str(out / "fr"), "--fr-timing", "--agent-socket", str(out / "hook.sock"), "--",
                          *megatron_argv(megatron, tb), env=env)
        agent(ps, wait_manifest(run_dir / "launch.json", launch), grpc_port)
        rc = launch.wait(timeout=float(os.environ.get("MEGATRON_TIMEOUT_S", "240")))
        res["job_exit"], res["job_seconds"] = rc, round(time.monotonic() - t0, 1)
        url = f"http://127.0.0.1:{http}/api/jobs/{JOB}/summary"
        want = set(range(PROFILE_START, PROFILE_END))

        def covered() -> Any:
            c = get_json(url).get("collectives") or {}
            its = {it["iteration"] for it in c.get("iterations", [])}
            return c if want <= its else None

        wait_for(covered, 30, "the profiled iterations in the aggregator's analysis", ignore=NOT_YET)
        time.sleep(2.0)
        summary = get_json(url)
        coll = summary["collectives"]
        res["perfd_summary"], res["method"] = coll["summary"], coll["method"]
        res["bandwidth"], res["findings"] = coll["bandwidth"], [f["title"] for f in coll["findings"]]
        res["groups"] = coll.get("groups")
        its = {it["iteration"]: it for it in coll["iterations"]}
        log_ms = {}
        for line in (run_dir / "output.log").read_text(errors="replace").splitlines():
            if " iteration " in line and "elapsed time per iteration (ms):" in line:
                try:
                    n = int(line.split(" iteration ")[1].split("/")[0])
                    log_ms[n] = float(line.split("elapsed time per iteration (ms):")[1].split("|")[0])
                except (IndexError, ValueError):
                    pass
        traces = sorted((out / "tb" / "torch_profile").glob("rank-*.json.gz"))
        res["traces"] = [t.name for t in traces]
        per_rank: dict[str, Any] = {}
        for trace in traces:
            r = trace.name.split("-")[1].split(".")[0]
            tl = analyze_chrome_trace(trace)
            dev = max(tl.devices, key=lambda d: d.kernel_count)
            steps = step_ranges(trace)
            rows = [its[i] for i in sorted(want) if i in its and r in its[i]["share_by_rank"]]
            comm = sum(it["share_by_rank"][r] * it["window_ms"] for it in rows)
            span = sum(it["window_ms"] for it in rows)
            perfd = comm / span if span else None
            timeline = dev.comm_ms / dev.span_ms if dev.span_ms else None
            st_span = sum(v[0] for n, v in steps.items() if n in want)
            st_comm = sum(v[1] for n, v in steps.items() if n in want)
            per_rank[r] = {
                "perfd_share": perfd, "perfd_window_ms": span,
                "timeline_share": timeline, "timeline_comm_ms": dev.comm_ms, "timeline_span_ms": dev.span_ms,
                "timeline_sendrecv_ms": dev.sendrecv_ms, "timeline_exposed_ms": dev.comm_exposed_ms,
                "step_ranges_share": st_comm / st_span if st_span else None,
                "diff_points": None if perfd is None or timeline is None else 100 * (perfd - timeline),
                "per_iteration": [{"iteration": n, "perfd": its.get(n, {}).get("share_by_rank", {}).get(r),
                                   "perfd_window_ms": its.get(n, {}).get("window_ms"),
                                   "megatron_elapsed_ms": log_ms.get(n),
                                   "gpu_step_ms": steps.get(n, (None,))[0],
                                   "timeline": (steps[n][1] / steps[n][0]) if steps.get(n, (0,))[0] else None}
                                  for n in sorted(want)]}
        res["per_rank"] = per_rank
        diffs = [abs(v["diff_points"]) for v in per_rank.values() if v["diff_points"] is not None]
        res["max_abs_diff_points"] = max(diffs) if len(diffs) == 2 else None
        res["ok"] = rc == 0 and len(diffs) == 2 and max(diffs) <= 3.0
        steady = [v for k, v in log_ms.items() if k >= 10]
        res["steady_log_ms"] = statistics.median(steady) if steady else None
        res["output_tail"] = tail(run_dir / "output.log", 1200)
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
        res["ok"] = False
        res["logs"] = {n: tail(out / f"{n}.out", 3000) for n in ("launch", "agent", "aggregator")}
        try:
            c = get_json(url).get("collectives") or {} if url else {}
            keys = ("records", "sources", "timing", "method", "summary")
            res["last_collectives"] = {k: c.get(k) for k in keys}
            res["last_iterations"] = [it["iteration"] for it in c.get("iterations", [])]
        except Exception as exc2:
            res["last_collectives"] = repr(exc2)
    finally:
        ps.stop()
    return res


def keep_last_dumps(fr_dir: Path, dest: Path, entries: int = 400) -> dict[str, Any]:
    """Each rank's last Flight Recorder dump, cut to its newest ``entries`` entries (the ring holds
    20,000 with stacks: tens of MB), for the test data; the full dumps are removed."""
    import pickle

    from perfd.collectors.nccl.flight_recorder import DumpError, load_dump_bytes

    kept: dict[str, Any] = {}
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(fr_dir.glob("fr_dump_*")):
        try:
            d: dict[str, Any] = load_dump_bytes(f.read_bytes())  # read as the dump is known to be
        except (OSError, DumpError) as exc:
            kept[f.name] = repr(exc)
            continue
        n = len(d.get("entries") or [])
        d["entries"] = (d.get("entries") or [])[-entries:]
        (dest / f.name).write_bytes(pickle.dumps(d, protocol=2))
        kept[f.name] = {"entries_in_dump": n, "kept": len(d["entries"]), "bytes": f.stat().st_size}
        f.unlink()
    return kept


def markdown(res: dict[str, Any]) -> str:
    pct = lambda x: "n/a" if x is None else f"{100 * x:.2f}%"  # noqa: E731
    lines = ["# Megatron-LM PP=2 under perfd launch: communication share, perfd vs Kineto", "",
             f"Job exit {res.get('job_exit')} after {res.get('job_seconds')} s; profiled iterations "
             f"{res.get('profiled_iterations')}; steady iteration {res.get('steady_log_ms')} ms "
             "(Megatron's log).", ""]
    if "error" in res:
        return "\n".join([*lines, f"Failed: {res['error']}", ""])
    lines += ["| rank | perfd share | timeline comm / span | diff (points) | ProfilerStep ranges |",
              "|---|---|---|---|---|"]
    for r, v in sorted(res.get("per_rank", {}).items()):
        d = v.get("diff_points")
        lines.append(f"| {r} | {pct(v.get('perfd_share'))} | {pct(v.get('timeline_share'))} "
                     f"({v.get('timeline_comm_ms', 0):.1f} / {v.get('timeline_span_ms', 0):.1f} ms) | "
                     f"{'n/a' if d is None else f'{d:+.2f}'} | {pct(v.get('step_ranges_share'))} |")
    lines += ["", "Per iteration (perfd share / window ms / Megatron elapsed ms / GPU ProfilerStep ms / "
              "timeline share):", ""]
    for r, v in sorted(res.get("per_rank", {}).items()):
        for row in v.get("per_iteration", []):
            lines.append(f"- rank {r} it {row['iteration']}: {pct(row['perfd'])} / "
                         f"{row['perfd_window_ms']} / {row['megatron_elapsed_ms']} / {row['gpu_step_ms']} / "
                         f"{pct(row['timeline'])}")
    s = res.get("perfd_summary") or {}
    lines += ["", f"perfd steady state: {pct(s.get('comm_total_share'))}, by group "
              f"{s.get('comm_share_by_group')}; method {(res.get('method') or {}).get('name')}.",
              f"Findings: {res.get('findings')}",
              f"Target within 3 points: {'met' if res.get('ok') else 'NOT met'}.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    megatron = Path(os.environ.get("MEGATRON_DIR", "")).resolve()
    if not (megatron / "pretrain_gpt.py").exists():
        print("set MEGATRON_DIR to a Megatron-LM checkout", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    res = run(args.out, megatron)
    res["kept_dumps"] = keep_last_dumps(args.out / "fr", args.out / "fr_kept")
    (args.out / "megatron_live.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (args.out / "megatron_live.md").write_text(md)
    print(md)
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
