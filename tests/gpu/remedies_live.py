"""On 1 GPU: a real Megatron-LM job's remedies applied one at a time, and its op-level captures.

    MEGATRON_DIR=... python3 tests/gpu/remedies_live.py OUT_DIR gather [--variants a,b,...]

Megatron-LM is not part of this repository: MEGATRON_DIR points at a checkout (core 0.20), run beside
the project. The job is issue 34's "simply slow" H100 job (tests/gpu/verdict_live.py ``big2048``:
12 layers, h=2048, seq 2048, mbs 4, gbs 16, local transformer, no Transformer Engine, no Apex).

``gather``: the job started with ``KINETO_USE_DAEMON=1`` beside perfd's own Kineto daemon
(perfd.capture.kineto_daemon), two steady 3-step captures of its rank (the on-demand default, then
with Python stacks and input shapes: ``PROFILE_WITH_STACK``, ``PROFILE_REPORT_INPUT_SHAPES``), the
traces cut to what an op-level attribution reads (:func:`cut_trace`), then each variant of
:data:`VARIANTS` run on its own for ``ITERS`` iterations, its steady step time read from its log.
Everything is written to OUT_DIR as it happens (``gather.json`` after every run).
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
    """Keep what an op-level attribution reads: GPU activity, CPU ops, runtime calls, annotations,
    Python frames and the forward→backward flows, with the args that link them; drop the rest."""
    doc = json.loads(src.read_text())
    keep_args = ("correlation", "External id", "Sequence number", "Fwd thread id", "Input Dims",
                 "Input type", "device", "stream", "Python id", "Python parent id", "Python thread",
                 "Ev Idx", "bytes", "memory bandwidth (GB/s)", "grid", "block")
    out = []
    cats: dict[str, int] = {}
    for e in doc.get("traceEvents", []):
        cat = str(e.get("cat", ""))
        keep = cat in ("kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "cuda_runtime", "cuda_driver",
                       "user_annotation", "gpu_user_annotation", "python_function", "fwdbwd") \
            or e.get("ph") == "M"
        if not keep:
            continue
        cats[cat] = cats.get(cat, 0) + 1
        args = e.get("args")
        if isinstance(args, dict):
            e = {**e, "args": {k: v for k, v in args.items() if k in keep_args}}
        out.append(e)
    doc["traceEvents"] = out
    with gzip.open(dst, "wt") as f:
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
            if "RANK" in p.environ() and p.parent() is not None and "RANK" not in p.parent().environ():
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("mode", choices=("gather",))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--skip-capture", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    megatron = Path(os.environ.get("MEGATRON_DIR", ROOT / ".megatron")).resolve()
    try:
        gather(out, megatron, [v for v in a.variants.split(",") if v], a.skip_capture)
    except Exception:
        (out / "error.txt").write_text(traceback.format_exc())
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
