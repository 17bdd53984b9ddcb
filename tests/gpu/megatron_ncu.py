"""What the live Megatron-LM scripts with Nsight Compute share (tests/gpu/ncu_megatron_rule.py,
ncu_megatron_answer.py, ncu_workflow_live.py): the job's own clock (Megatron's logged iterations), the
issue's model, ``perfd ncu-prefix``, and the sweep of a stopped job's leftover processes. Process
plumbing is tests/procs.py's."""

from __future__ import annotations

import datetime
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.procs import ROOT

_ITER = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\] iteration\s+(\d+)/.*?elapsed time per "
    r"iteration \(ms\): ([0-9.]+)"
)


def log_iterations(log: Path) -> dict[int, tuple[float, float | None]]:
    """Megatron's logged iterations: number -> (elapsed ms, end time in epoch s when the line has one).
    A log holding several runs (a restart appended) gives each number's last line."""
    out: dict[int, tuple[float, float | None]] = {}
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return out
    for m in _ITER.finditer(text):
        try:
            fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in m.group(1) else "%Y-%m-%d %H:%M:%S"
            at: float | None = datetime.datetime.strptime(m.group(1), fmt).timestamp()
        except ValueError:
            at = None
        out[int(m.group(2))] = (float(m.group(3)), at)
    return out


def stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    q = sorted(values)
    return {
        "n": len(q),
        "median_ms": round(statistics.median(q), 2),
        "p90_ms": round(q[int(0.9 * (len(q) - 1))], 2),
        "min_ms": round(q[0], 2),
        "max_ms": round(q[-1], 2),
    }


def issue_args(megatron: Path, train_iters: int, extra: Sequence[str] = ()) -> list[str]:
    """pretrain_gpt.py with the ncu evidence's config
    (docs/evidence/entries/28-nsight-compute-by-rule-in-the-answer-2026-11-24-1-h100.md,
    docs/evidence/entries/29-the-documented-ncu-workflow-both-ways-each-figure-from-its-r.md): 12 layers,
    hidden 1024, seq 2048, mbs 1, gbs 8 (DP=1: 8 micro-batches a step), the local transformer implementation
    and mock data (flags that work on the GPU machines here, without Transformer Engine or Apex). One
    ``--train-iters`` for every run of a job: a checkpoint's scheduler holds it, and a resumed run that asks
    another is refused ("total number of iterations do not match", seen on the H100)."""
    return [
        str(megatron / "pretrain_gpt.py"),
        *f"""
        --num-layers 12 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048
        --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --train-iters {train_iters}
        --lr 1e-4 --lr-decay-style constant --bf16 --mock-data --tokenizer-type NullTokenizer
        --vocab-size 32000 --transformer-impl local --no-persist-layer-norm
        --no-gradient-accumulation-fusion --no-masked-softmax-fusion --log-interval 1 --log-throughput
        --timing-log-level 2 --eval-iters 0 --eval-interval 100000 --disable-bias-linear""".split(),
        *extra,
    ]


def ncu_prefix(job: str, captures: Path, env: Mapping[str, str], launch_count: str, time_budget_s: str | None,
               kernels_from: str | None = None) -> dict[str, Any]:
    """``perfd ncu-prefix --job J --ranks 0 ...``: {rc, stdout (the words for torchrun --no-python),
    stderr (its estimate of the arming's cost)}. ``time_budget_s`` None: the prefix's own (a launch
    window chosen on the timeline gets a budget that fits it)."""
    argv = [sys.executable, "-m", "perfd.app.cli", "ncu-prefix", "--job", job, "--ranks", "0",
            "--capture-dir",
            str(captures), "--launch-count", launch_count]
    argv += ["--time-budget", time_budget_s] if time_budget_s else []
    argv += ["--kernels-from", kernels_from] if kernels_from else []
    pre = subprocess.run(argv, cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=120)
    return {"rc": pre.returncode, "stdout": pre.stdout.strip(), "stderr": pre.stderr.strip()}


def kill_job_leftovers(job: str, say: Callable[[str], None]) -> None:
    """Ranks and ncu left behind by a stopped launch would hold the GPU for the next phase: every process
    declaring PERFD_JOB=<job>, TERM then KILL."""
    mark = b"PERFD_JOB=" + job.encode()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid():
                try:
                    if mark in (d / "environ").read_bytes().split(b"\0"):
                        left.append(int(d.name))
                except OSError:
                    continue
        if not left:
            return
        say(f"job processes still there: {left}; {sig.name}")
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(5)


def cut_launch_trace(src: Path, dst: Path) -> dict[str, Any]:
    """A Kineto trace cut to what the launch match and the step budget read (perfd/capture/chrome_trace.py):
    GPU activity; the runtime and driver calls that launched it or waited for the device; the CPU ops
    that enclose a launch, begin a forward->backward flow or carry an autograd sequence number;
    annotations; the flows; of the args only correlation, device, stream, grid, block and the sequence
    number. On the ncu workflow's H100 trace (69 MB) ``perfd analyze ncu --capture`` and ``perfd analyze
    megatron --capture`` give the same JSON from the cut (1.7 MB) as from the whole trace."""
    import bisect
    import gzip
    import json

    raw = src.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc.get("traceEvents", [])
    syncs = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
             "cuCtxSynchronize", "cuStreamSynchronize"}
    gpu_corr = {(e.get("args") or {}).get("correlation") for e in events
                if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}

    def kept_call(e: dict[str, Any]) -> bool:
        return (e.get("args") or {}).get("correlation") in gpu_corr or e.get("name") in syncs

    calls: dict[Any, list[float]] = {}
    flows: dict[Any, set[float]] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and kept_call(e):
            calls.setdefault(e.get("tid"), []).append(float(e["ts"]))
        elif e.get("cat") == "fwdbwd":
            flows.setdefault(e.get("tid"), set()).add(e.get("ts"))
    for launched in calls.values():
        launched.sort()
    keep_args = ("correlation", "Sequence number", "device", "stream", "grid", "block")
    out = []
    for e in events:
        cat = str(e.get("cat", ""))
        if cat in ("cuda_runtime", "cuda_driver"):
            if not kept_call(e):
                continue
        elif cat == "cpu_op":
            t, at, dur = calls.get(e.get("tid"), []), float(e.get("ts", 0)), float(e.get("dur", 0))
            i = bisect.bisect_left(t, at)
            encloses = i < len(t) and t[i] <= at + dur
            if not (encloses or e.get("ts") in flows.get(e.get("tid"), ())
                    or "Sequence number" in (e.get("args") or {})):
                continue
        elif cat not in ("kernel", "gpu_memcpy", "gpu_memset", "user_annotation", "gpu_user_annotation",
                         "fwdbwd", "python_function") and e.get("ph") != "M":
            continue
        args = e.get("args")
        out.append({**e, "args": {k: v for k, v in args.items() if k in keep_args}} if isinstance(args, dict)
                   else e)
    doc["traceEvents"] = out
    with gzip.open(dst, "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    return {"events_in": len(events), "events": len(out), "bytes_out": dst.stat().st_size}


def trim_manifest(path: Path) -> dict[str, Any]:
    """A capture's manifest.json without what its other files give again (an ncu analysis' per-kernel
    rows and category summaries: the CSVs; a Kineto analysis: the trace) and without the artifacts'
    paths: its timings, range, options, coverage, kernel choice and filter stay."""
    import json

    m = json.loads(path.read_text())
    for a in (m.get("analysis") or {}).values():
        if isinstance(a, dict):
            for k in ("kernels", "categories", "devices", "top_kernels"):
                a.pop(k, None)
    if m.get("tool") != "ncu":
        m.pop("analysis", None)
    m["artifacts"] = [{k: v for k, v in a.items() if k != "path"} for a in m.get("artifacts") or []]
    return dict(m)


if __name__ == "__main__":  # the fixtures' cuts (tests/data/ncu/README.md)
    import json

    if sys.argv[1:2] == ["cut-trace"] and len(sys.argv) == 4:
        print(cut_launch_trace(Path(sys.argv[2]), Path(sys.argv[3])))
    elif sys.argv[1:2] == ["trim-manifests"] and len(sys.argv) > 2:
        print(json.dumps([trim_manifest(Path(p)) for p in sys.argv[2:]], indent=1, sort_keys=True))
    else:
        sys.exit("usage: python3 -m tests.gpu.megatron_ncu cut-trace SRC DST | trim-manifests MANIFEST...")
