"""On 1 GPU: a real Megatron-LM job's remedies applied one at a time, and its op-level captures.

    MEGATRON_DIR=... python3 tests/gpu/remedies_live.py OUT_DIR gather [--variants a,b,...]
    MEGATRON_DIR=... python3 tests/gpu/remedies_live.py OUT_DIR verify [--measure N]
    MEGATRON_DIR=... python3 tests/gpu/remedies_live.py OUT_DIR measure --plan PLAN.json [--variants a,b]

Megatron-LM is not part of this repository: MEGATRON_DIR points at a checkout (core 0.20), run beside
the project. The job is the "simply slow" H100 job of
docs/evidence/entries/22-why-not-closer-to-the-limit-the-step-budget-on-the-issue-s-h.md
(tests/gpu/verdict_live.py ``big2048``: 12 layers, h=2048, seq 2048, mbs 4, gbs 16, local transformer, no
Transformer Engine, no Apex).

``gather``: the job started with ``KINETO_USE_DAEMON=1`` beside perfd's own Kineto daemon
(perfd.capture.kineto_daemon), two steady 3-step captures of its rank (the on-demand default, then
with Python stacks and input shapes: ``PROFILE_WITH_STACK``, ``PROFILE_REPORT_INPUT_SHAPES``), the
traces cut to what an op-level attribution reads (:func:`cut_trace`), then each variant of
:data:`VARIANTS` run on its own for ``ITERS`` iterations, its steady step time read from its log.
Everything is written to OUT_DIR as it happens (``gather.json`` after every run).

``verify`` (docs/evidence/entries/25-remedies-applied-one-at-a-time-on-the-issue-s-h100-job-attri.md): the
live path — ``perfd aggregator`` with a rule that captures rank 0 with Kineto for 3 steps once the job steps,
``perfd launch --kineto`` around the job, ``perfd agent --launch-manifest --nvml real`` — then a second
capture of the same rank with Python stacks (``POST /api/captures {"stack": true}``). After the job: the live
summary (budget, class, recommendations with their typed ``flags``, ``needs`` and ``gain_ms``), the offline
report of the log with the default trace, perfd's parts of the stack trace (by op, and by module frames)
beside the independent count (tests/capture/op_reference.py), and the plan: every recommendation whose flags
can be applied here (nothing missing to install), applied one at a time against the job as it ran
(``plan.json``; the first ``--measure`` of them run at once, the rest by ``measure``). CUDA graphs are
measured too when perfd did not recommend them (the check that they would not have paid).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from perfd.capture.chrome_trace import SYNC_CALLS as SYNC_NAMES
from perfd.capture.kineto_daemon import KinetoDaemon, kineto_env
from tests.procs import ROOT, run_env

ITERS = int(os.environ.get("ITERS", "30"))
STEADY_FROM = 6  # iterations before this one are warm-up
CONFIG = {"layers": 12, "hidden": 2048, "heads": 16, "seq": 2048, "mbs": 4, "gbs": 16}


def megatron_argv(megatron: Path, iters: int, extra: list[str], drop: tuple[str, ...] = (),
                  replace: dict[str, str] | None = None) -> list[str]:
    """The job's command line; ``drop`` removes flags (with their value when they take one),
    ``replace`` sets a flag's value."""
    c = CONFIG
    flags: list[tuple[str, str | None]] = [
        ("--num-layers", str(c["layers"])), ("--hidden-size", str(c["hidden"])),
        ("--num-attention-heads", str(c["heads"])), ("--seq-length", str(c["seq"])),
        ("--max-position-embeddings", str(c["seq"])), ("--micro-batch-size", str(c["mbs"])),
        ("--global-batch-size", str(c["gbs"])), ("--train-iters", str(iters)), ("--lr", "1e-4"),
        ("--lr-decay-style", "constant"), ("--bf16", None), ("--mock-data", None),
        ("--tokenizer-type", "NullTokenizer"), ("--vocab-size", "32000"), ("--transformer-impl", "local"),
        ("--no-persist-layer-norm", None), ("--no-gradient-accumulation-fusion", None),
        ("--no-masked-softmax-fusion", None), ("--log-interval", "1"), ("--log-throughput", None),
        ("--timing-log-level", "2"), ("--timing-log-option", "all"), ("--log-straggler", None),
        ("--eval-iters", "0"), ("--eval-interval", "100000"), ("--disable-bias-linear", None),
        ("--exit-interval", str(iters)),
    ]
    rep = replace or {}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", "29543",
            str(megatron / "pretrain_gpt.py")]
    for flag, value in flags:
        if flag in drop:
            continue
        argv.append(flag)
        if flag in rep:
            argv.append(rep[flag])
        elif value is not None:
            argv.append(value)
    return argv + extra


# One change each against "base" (the job as it ran): (extra flags, flags dropped, flags replaced).
VARIANTS: dict[str, tuple[list[str], tuple[str, ...], dict[str, str]]] = {
    "base": ([], (), {}),
    "attention_dropout_0": (["--attention-dropout", "0.0"], (), {}),
    "ce_fusion_native": (["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "native"], (), {}),
    "timing_level_1": ([], (), {"--timing-log-level": "1"}),
    "timing_level_0": ([], ("--timing-log-option",), {"--timing-log-level": "0"}),
    "mbs_8": ([], (), {"--micro-batch-size": "8"}),
    "cuda_graph_local": (["--cuda-graph-impl", "local"], (), {}),
    "masked_softmax_fusion": ([], ("--no-masked-softmax-fusion",), {}),
    "base_again": ([], (), {}),
}

_STEP = re.compile(r" iteration\s+(\d+)/.*elapsed time per iteration \(ms\): ([0-9.]+)")
_MEM = re.compile(r"memory \(MB\) \| allocated: ([0-9.]+) \| max allocated: ([0-9.]+)")


def log_steps(text: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in _STEP.finditer(text)}


def steady(steps: dict[int, float]) -> dict[str, Any]:
    xs = [v for k, v in sorted(steps.items()) if k >= STEADY_FROM]
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median_ms": statistics.median(xs), "mean_ms": statistics.fmean(xs),
            "min_ms": min(xs), "max_ms": max(xs)}


def cut_trace(src: Path, dst: Path) -> dict[str, Any]:
    """Keep what an op-level attribution reads: GPU activity, CPU ops, the runtime calls that launched
    GPU work or waited for it, annotations, the nn.Module frames and the loss's, optimizer's and
    data-parallel machinery's Python frames, the forward→backward flows; the args that link them."""
    doc = json.loads(src.read_text())
    events = doc.get("traceEvents", [])
    gpu_corr = {(e.get("args") or {}).get("correlation") for e in events
                if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    # grid and block: ncu's profiled launches are matched to the timeline's on them (launch_order.py)
    keep_args = ("correlation", "External id", "Sequence number", "Fwd thread id", "Input Dims", "device",
                 "stream", "grid", "block")
    frames = ("cross_entropy", "loss", "/optimizer/", "clip_grads", "/distributed/", "param_and_grad_buffer")
    out: list[dict[str, Any]] = []
    cats: dict[str, int] = {}
    for e in events:
        cat = str(e.get("cat", ""))
        if cat in ("cuda_runtime", "cuda_driver"):
            if (e.get("args") or {}).get("correlation") not in gpu_corr and e.get("name") not in SYNC_NAMES:
                continue
        elif cat == "python_function":
            n = str(e.get("name", ""))
            if not (n.startswith("nn.Module:") or any(k in n for k in frames)):
                continue
        elif cat not in ("kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation",
                         "gpu_user_annotation", "fwdbwd") and e.get("ph") != "M":
            continue
        cats[cat] = cats.get(cat, 0) + 1
        args = e.get("args")
        if isinstance(args, dict):
            e = {**e, "args": {k: v for k, v in args.items() if k in keep_args}}
        out.append(e)
    doc["traceEvents"] = out
    with gzip.open(dst, "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    return {"events": len(out), "categories": cats, "bytes_in": src.stat().st_size,
            "bytes_out": dst.stat().st_size}


def rank_pid(launcher_pid: int) -> int | None:
    """The rank: the topmost process under the launcher whose environment declares RANK."""
    import psutil

    try:
        kids = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.Error:
        return None
    for p in kids:
        try:
            parent = p.parent()
            if "RANK" in p.environ() and parent is not None and "RANK" not in parent.environ():
                return int(p.pid)
        except psutil.Error:
            continue
    return None


def capture(daemon: KinetoDaemon, pid: int, path: Path, stack: bool, log: Path, res: dict[str, Any],
            name: str) -> None:
    cfg = (f"ACTIVITIES_LOG_FILE={path}\nPROFILE_START_ITERATION=0\nPROFILE_START_ITERATION_ROUNDUP=1\n"
           "ACTIVITIES_ITERATIONS=3\n")
    if stack:
        cfg += "PROFILE_REPORT_INPUT_SHAPES=true\nPROFILE_WITH_STACK=true\n"
    t0 = time.time()
    arming = daemon.arm({pid: cfg}, expires_at=time.time() + 30)
    ok = arming.wait_answered(timeout=30)
    it_at = max(log_steps(log.read_text(errors="replace")) or {0: 0.0})
    got = None
    deadline = time.time() + 120
    want = path.with_name(path.stem + f"_{pid}.json")
    while time.time() < deadline:
        if want.exists() and want.read_bytes().rstrip().endswith(b"}"):
            size = want.stat().st_size
            time.sleep(2)
            if want.stat().st_size == size:
                got = want
                break
        time.sleep(0.5)
    res[name] = {"answered": ok, "answered_s": round(time.time() - t0, 2), "iteration_at_arming": it_at,
                 "config": cfg, "trace": str(got) if got else None}


def gather(out: Path, megatron: Path, variants: list[str], skip_capture: bool = False) -> dict[str, Any]:
    res: dict[str, Any] = {"config": CONFIG, "iters": ITERS, "started": time.time()}
    save = lambda: (out / "gather.json").write_text(json.dumps(res, indent=1, default=str))  # noqa: E731
    env = run_env(NCCL_NVLS_ENABLE="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    res["env"] = subprocess.run([sys.executable, "-c", "import torch,sys;print(sys.version.split()[0], "
                                 "torch.__version__, torch.cuda.get_device_name(0))"],
                                capture_output=True, text=True, env=env).stdout.strip()
    if skip_capture:
        return _variants(out, megatron, variants, env, res, save)
    # 1. the captured run
    raw = Path("/tmp/remedies_captured")  # the full log is kept gzipped in OUT
    raw.mkdir(parents=True, exist_ok=True)
    sock_dir = Path("/tmp/perfd-kineto-sock")
    sock_dir.mkdir(exist_ok=True)
    trace_dir = Path("/tmp/perfd-traces")
    trace_dir.mkdir(exist_ok=True)
    kenv = kineto_env(1, config_dir=raw / "kineto", socket_dir=str(sock_dir), trace_dir=trace_dir)
    daemon = KinetoDaemon(socket_dir=str(sock_dir)).start()
    log = raw / "megatron.log"
    try:
        with log.open("wb") as f:
            p = subprocess.Popen(megatron_argv(megatron, 60, []), cwd=megatron, env={**env, **kenv},
                                 stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        pid = None
        while p.poll() is None and time.time() - t0 < 240:
            steps = log_steps(log.read_text(errors="replace"))
            if pid is None:
                pid = rank_pid(p.pid)
            if pid and steps and max(steps) >= 12 and "capture_default" not in res:
                capture(daemon, pid, trace_dir / "default.json", False, log, res, "capture_default")
                save()
            if pid and steps and max(steps) >= 30 and "capture_stack" not in res:
                capture(daemon, pid, trace_dir / "stack.json", True, log, res, "capture_stack")
                save()
            time.sleep(0.5)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
        text = log.read_text(errors="replace")
        res["captured_run"] = {"exit": p.returncode, "steps": log_steps(text), "rank_pid": pid,
                               "polls": daemon.requests_seen, "memory": _MEM.findall(text)[-2:]}
    finally:
        daemon.stop()
    for name in ("capture_default", "capture_stack"):
        t = (res.get(name) or {}).get("trace")
        if t:
            res[name]["cut"] = cut_trace(Path(t), out / f"trace_{name.split('_')[1]}.json.gz")
    gz = out / "megatron_captured.log.gz"
    with gzip.open(gz, "wb") as g:
        g.write(log.read_bytes())
    save()
    return _variants(out, megatron, variants, env, res, save)


def _variants(out: Path, megatron: Path, variants: list[str], env: dict[str, str], res: dict[str, Any],
              save: Any) -> dict[str, Any]:
    """Each variant of VARIANTS run on its own: one change against the job as it ran."""
    res["variants"] = {}
    for name in variants:
        extra, drop, rep = VARIANTS[name]
        vlog = out / f"variant_{name}.log"
        t0 = time.time()
        try:
            with vlog.open("wb") as f:
                r = subprocess.run(megatron_argv(megatron, ITERS, extra, drop, rep), cwd=megatron, env=env,
                                   stdout=f, stderr=subprocess.STDOUT, timeout=240, start_new_session=True)
            code: int | str = r.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        text = vlog.read_text(errors="replace")
        steps = log_steps(text)
        res["variants"][name] = {"exit": code, "wall_s": round(time.time() - t0, 1), "steady": steady(steps),
                                 "steps": steps, "memory": _MEM.findall(text)[-2:],
                                 "tail": "" if steps and code == 0 else text[-3000:]}
        vlog.unlink()  # the step times are kept; the logs are not needed
        save()
        print(name, res["variants"][name]["steady"], flush=True)
    return res


# --- verify: the live path, then perfd's own remedies applied --------------------------------------------
VERIFY_RULES = """
rules:
  - name: steady_capture
    expr: step_time > 0
    scope: job
    for: 15s
    severity: info
    action:
      type: capture
      tool: kineto
      targets: {ranks: [0]}
      steps: 3
      cooldown: 1h
      max_per_hour: 1
"""
H100 = "NVIDIA H100 80GB HBM3"
JOB = "remedies-big2048"


def apply_flags(argv: list[str], flags: list[str], remove: list[str]) -> list[str]:
    """``argv`` with each "--opt value" / "--switch" of ``flags`` set (a value replaced where the option
    is there, appended where not) and each option of ``remove`` taken out (with its value)."""
    out = list(argv)
    for opt in remove:
        if opt in out:
            i = out.index(opt)
            takes = i + 1 < len(out) and not out[i + 1].startswith("--")
            del out[i:i + (2 if takes else 1)]
    for f in flags:
        opt, _, value = f.partition(" ")
        if opt in out:
            i = out.index(opt)
            if value:
                out[i + 1] = value
        else:
            out += [opt, *([value] if value else [])]
    return out


def post_json(url: str, body: dict[str, Any]) -> Any:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _job_argv(megatron: Path, iters: int) -> list[str]:
    return megatron_argv(megatron, iters, [])


def verify(out: Path, megatron: Path, measure_now: int) -> dict[str, Any]:
    from tests.procs import Procs, get_json, start_agent, start_aggregator, wait_manifest

    res: dict[str, Any] = {"config": CONFIG, "iters": ITERS, "started": time.time()}
    save = lambda: (out / "verify.json").write_text(json.dumps(res, indent=1, default=str))  # noqa: E731
    raw = Path("/tmp/remedies_verify")
    raw.mkdir(parents=True, exist_ok=True)
    env = run_env(NCCL_NVLS_ENABLE="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    procs = Procs(raw, env)
    log = raw / "run" / "output.log"
    try:
        (raw / "rules.yaml").write_text(VERIFY_RULES)
        grpc_port, _, url = start_aggregator(procs, "--rules", raw / "rules.yaml", "--rules-interval", "1")
        base = f"{url}/api"
        launch = procs.perfd("launch", "launch", "--job", JOB, "--run-dir", str(raw / "run"), "--kineto",
                             "--", *_job_argv(megatron, 80), cwd=megatron)
        manifest = wait_manifest(raw / "run" / "launch.json", launch)
        (raw / "agent.yaml").write_text(f"capture_dir: {raw / 'captures'}\nbatch_interval_s: 0.5\n")
        start_agent(procs, grpc_port, manifest=manifest, config=raw / "agent.yaml")
        t0 = time.time()
        stacked = None
        while launch.poll() is None and time.time() - t0 < 300:
            caps = get_json(f"{base}/captures")["captures"]
            if stacked is None and any(c.get("status") == "finished" for c in caps):
                stacked = post_json(f"{base}/captures",
                                    {"job": JOB, "ranks": [0], "steps": 3, "tool": "kineto", "stack": True})
                res["stack_request"] = {"id": stacked.get("id"), "status": stacked.get("status"),
                                        "at_s": round(time.time() - t0, 1)}
                save()
            time.sleep(1)
        res["job_exit"] = launch.poll()
        # the last records, and the stack capture's trace analysed by the agent (a larger trace)
        deadline = time.time() + 90
        while time.time() < deadline and any(c.get("status") in ("requested", "started")
                                             for c in get_json(f"{base}/captures")["captures"]):
            time.sleep(2)
        time.sleep(8)
        summary = get_json(f"{base}/jobs/{JOB}/summary")
        res["live"] = {"budget": (summary.get("summary") or {}).get("step_budget"),
                       "bottleneck": (summary.get("summary") or {}).get("bottleneck"),
                       "bottleneck_reason": (summary.get("summary") or {}).get("bottleneck_reason"),
                       "status_text": ((summary.get("report") or {}).get("summary") or {}).get("status_text"),
                       "recommendations": (summary.get("report") or {}).get("recommendations"),
                       "findings": [{k: f.get(k) for k in ("id", "severity", "title", "observation")}
                                    for f in (summary.get("report") or {}).get("findings") or []]}
        res["captures"] = [{k: c.get(k) for k in ("id", "status", "reason", "stack", "steps", "origin",
                                                  "bottleneck", "bottleneck_reason")}
                           for c in get_json(f"{base}/captures")["captures"]]
        res["log_steps"] = log_steps(log.read_text(errors="replace"))
        save()
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
        save()
    finally:
        procs.stop()
    with gzip.open(out / "megatron_live.log.gz", "wb") as g:
        g.write(log.read_bytes() if log.exists() else b"")
    traces = sorted((raw / "captures").rglob("*.json"), key=lambda t: t.stat().st_mtime) \
        if (raw / "captures").exists() else []
    traces = [t for t in traces if t.stat().st_size > 100_000]
    res["traces"] = [str(t) for t in traces]
    if traces:
        res["attribution"] = attribution(traces, log, out)
    save()
    # the plan: perfd's recommendations that can be applied here, one at a time
    plan: dict[str, Any] = {"base": {"flags": [], "remove": []}}
    cannot = {}
    for r in (res.get("live") or {}).get("recommendations") or []:
        if not r.get("remedy"):
            continue
        if r.get("needs") or not (r.get("flags") or r.get("remove")):
            cannot[r["remedy"]] = {"action": r.get("action"), "needs": r.get("needs"),
                                   "gain_ms": r.get("gain_ms")}
            continue
        plan[r["remedy"]] = {"flags": r.get("flags") or [], "remove": r.get("remove") or [],
                             "gain_ms": r.get("gain_ms"), "action": r.get("action")}
    if "cuda_graphs" not in plan:  # not recommended: measured to show it would not have paid
        plan["cuda_graphs_unrecommended"] = {"flags": ["--cuda-graph-impl local"], "remove": []}
    plan["base_again"] = {"flags": [], "remove": []}
    res["plan"], res["cannot_run_here"] = plan, cannot
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    save()
    names = list(plan)
    res["measured"] = measure(megatron, plan, names[:measure_now], out, res, save)
    return res


def measure(megatron: Path, plan: dict[str, Any], names: list[str], out: Path, res: dict[str, Any],
            save: Any) -> dict[str, Any]:
    env = run_env(NCCL_NVLS_ENABLE="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    got: dict[str, Any] = res.setdefault("measured", {})
    for name in names:
        v = plan[name]
        argv = apply_flags(megatron_argv(megatron, ITERS, []), list(v["flags"]), list(v["remove"]))
        vlog = out / f"variant_{name}.log"
        t0 = time.time()
        try:
            with vlog.open("wb") as f:
                r = subprocess.run(argv, cwd=megatron, env=env, stdout=f, stderr=subprocess.STDOUT,
                                   timeout=240, start_new_session=True)
            code: int | str = r.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        text = vlog.read_text(errors="replace")
        steps = log_steps(text)
        got[name] = {"exit": code, "wall_s": round(time.time() - t0, 1), "steady": steady(steps),
                     "argv_tail": argv[-6:], "memory": _MEM.findall(text)[-2:],
                     "tail": "" if steps and code == 0 else text[-2000:]}
        vlog.unlink()
        save()
        print(name, got[name]["steady"], flush=True)
    return got


def attribution(traces: list[Path], log: Path, out: Path) -> dict[str, Any]:
    """perfd's parts of each trace (by op; the stack trace also by module frames) beside the
    independent count of the stack trace; the traces cut for the repository."""
    from perfd.capture.chrome_trace import analyze_chrome_trace
    from tests.capture.op_reference import Reference, _load

    got: dict[str, Any] = {}
    for t in traces:
        stack = b"python_function" in t.read_bytes()
        name = "stack" if stack else "default"
        row: dict[str, Any] = {"file": str(t), "bytes": t.stat().st_size}
        for frames in ((True, False) if stack else (False,)):
            a = analyze_chrome_trace(t, use_frames=frames)
            d = a.devices[0]
            row["frames" if frames else "ops"] = {"attribution": d.attribution, "steps": d.trace_steps,
                                                  "span_ms": d.span_ms,
                                                  "share": {p: v / d.span_ms for p, v in d.parts_ms.items()}}
        if stack:
            ref = Reference(_load(str(t)))
            span = ref.span_ms()
            row["reference"] = {"span_ms": span, "share": {p: v / span for p, v in ref.totals_ms().items()}}
        row["cut"] = cut_trace(t, out / f"live_{name}_rank0.json.gz")
        got[name] = row
    return got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("mode", choices=("gather", "verify", "measure"))
    ap.add_argument("--variants", default=None)
    ap.add_argument("--skip-capture", action="store_true")
    ap.add_argument("--measure", type=int, default=3, help="verify: variants of the plan measured at once")
    ap.add_argument("--plan", help="measure: the plan.json verify wrote")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    megatron = Path(os.environ.get("MEGATRON_DIR", ROOT / ".megatron")).resolve()
    try:
        if a.mode == "gather":
            gather(out, megatron, [v for v in (a.variants or ",".join(VARIANTS)).split(",") if v],
                   a.skip_capture)
        elif a.mode == "verify":
            verify(out, megatron, a.measure)
        else:
            plan = json.loads(Path(a.plan).read_text())
            names = [v for v in (a.variants or ",".join(plan)).split(",") if v]
            res: dict[str, Any] = {}
            measure(megatron, plan, names, out, res,
                    lambda: (out / "measure.json").write_text(json.dumps(res, indent=1, default=str)))
    except Exception:
        (out / "error.txt").write_text(traceback.format_exc())
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
