"""On 1 GPU: where the run-to-run drift of a host-bound Megatron-LM job comes from (issue "the plan an
engineer would make": on the H200 the same command stepped 394-507 ms in runs minutes apart, more than
any gain under test).

    MEGATRON_DIR=... python3 tests/gpu/host_noise_live.py OUT [--config gqa_swiglu] [--variants free,2-5]
                                                          [--budget-s 300]

The job as plan_ab_live.py runs its base, in turn under each variant (``free``: as it is; a core list:
held to those cores with ``taskset``; either with ``/manual-gc``: Megatron-LM's own garbage collection,
``--manual-gc --manual-gc-interval 100``, the MoE guide's setting against Python's jitter),
each run with the machine's CPU time over the run from /proc/stat (user, system, steal, idle: a
neighbour's steal shows there, a busy process of this machine in user/system), the load average and the
machine's topology (lscpu, ``nvidia-smi topo -m``). Written to OUT/host_noise.json after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gpu.plan_ab_live import CONFIGS, Clock, _est_run_s, measure
from tests.procs import ROOT, run_env

# A variant's Megatron-LM flags, after its "/": the H100's long_seq runs slowed by 50-150 ms every 5-7
# steps (docs/evidence/plan_h100_v4/host_noise), a beat the interpreter's collector would make. In
# remedies_live.apply_flags' form: "--opt value" one string.
JOB_FLAGS: dict[str, list[str]] = {"manual-gc": ["--manual-gc", "--manual-gc-interval 100"]}
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> dict[str, int]:
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return dict(zip(STAT_FIELDS, map(int, first[:len(STAT_FIELDS)]), strict=True))


def share(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    d = {k: after[k] - before[k] for k in STAT_FIELDS}
    total = sum(d.values()) or 1
    return {k: round(100.0 * v / total, 2) for k, v in d.items()}


def sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout
    except subprocess.TimeoutExpired:
        return ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--config", default="gqa_swiglu")
    ap.add_argument("--variants", default="free,2-5",
                    help="comma-separated, run in turn: 'free' (as it is) or the cores a run is held to")
    ap.add_argument("--budget-s", type=float, default=300.0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(a.budget_s)
    megatron = Path(os.environ.get("MEGATRON_DIR", ROOT / ".megatron")).resolve()
    env = run_env(NCCL_NVLS_ENABLE="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    c = CONFIGS[a.config]
    res: dict[str, Any] = {
        "config": a.config,
        "nproc": os.cpu_count(),
        "lscpu": sh("lscpu"),
        "topo": sh("nvidia-smi topo -m"),
        "runs": {},
    }
    variants: dict[str, tuple[list[str], list[str]]] = {}  # label -> (command prefix, job flags)
    for v in (x for x in a.variants.split(",") if x):
        cores, _, extra = v.partition("/")
        if extra and extra not in JOB_FLAGS:
            ap.error(f"--variants: {extra!r} is not one of {', '.join(JOB_FLAGS)}")
        variants[v] = ([] if cores == "free" else ["taskset", "-c", cores], JOB_FLAGS.get(extra, []))
    if not variants:
        ap.error("--variants names no variant")
    order = list(variants)
    k = 0
    while True:
        label = order[k % len(order)]
        if not clock.fits(_est_run_s(res)):
            break
        before, load = cpu_times(), os.getloadavg()
        prefix, flags = variants[label]
        got = measure(megatron, c, env, flags, [], out, f"noise_{k}", prefix=prefix)
        got["cpu_share"] = share(before, cpu_times())
        got["loadavg_before"] = load
        got.pop("steps_raw", None)
        res["runs"][f"{k}_{label}"] = got
        (out / "host_noise.json").write_text(json.dumps(res, indent=1, default=str))
        clock.say(f"{k} {label}: {got['steady']} cpu {got['cpu_share']} exit {got['exit']} "
                  f"({got['wall_s']} s)")
        k += 1
    for label in variants:
        meds = [r["steady"]["median_ms"] for n, r in res["runs"].items()
                if n.split("_", 1)[1] == label and r["steady"].get("n")]
        if meds:
            clock.say(f"{label}: medians {meds} spread {max(meds) - min(meds):.1f} ms, "
                      f"mean {statistics.fmean(meds):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
