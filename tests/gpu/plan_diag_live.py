"""On 1 GPU: what removing Megatron-LM's per-micro-batch timers changes on the host and the device
(issue "the plan an engineer would make": the timers' gain the v1 model missed by 5×).

    MEGATRON_DIR=... python3 tests/gpu/plan_diag_live.py OUT [--config long_seq] [--budget-s 480]

The configuration of tests/gpu/plan_ab_live.py captured twice with Kineto (3 steady steps each, the
trace cut as there): as it runs (``--timing-log-level 2``) and with the timers at level 1, so that the
two host timelines can be compared launch by launch; then, without the profiler, the job as it runs,
at level 1, and at level 2 with ``--manual-gc`` (Python's collector run at fixed points: whether the
step-to-step spread of a synchronised job is the collector's). Each measured from Megatron-LM's own
logged iteration times. Written to OUT as it happens (``diag.json``; ``trace_<label>.json.gz`` and
``log_<label>.log.gz`` per capture).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.gpu.plan_ab_live import CONFIGS, Clock, capture_run, measure
from tests.procs import ROOT, run_env

LEVEL1 = ["--timing-log-level", "1"]
CAPTURES = {"l2": [], "l1": LEVEL1}
MEASURES = {"base": [], "l1": LEVEL1, "l2_manual_gc": ["--manual-gc"], "base_end": []}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--config", default="long_seq", choices=sorted(CONFIGS))
    ap.add_argument("--budget-s", type=float, default=480.0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    megatron = Path(os.environ.get("MEGATRON_DIR", ROOT / ".megatron")).resolve()
    env = run_env(NCCL_NVLS_ENABLE="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    clock = Clock(a.budget_s)
    res: dict[str, Any] = {"config": a.config, "captures": {}, "runs": {}}
    gpu = subprocess.run([sys.executable, "-c", "import torch;print(torch.cuda.get_device_name(0))"],
                         capture_output=True, text=True, env=env).stdout.strip()
    res["gpu"] = gpu
    clock.say(f"GPU {gpu}")
    try:
        for label, extra in CAPTURES.items():
            if not clock.fits(150):
                break
            c = {**CONFIGS[a.config], "extra": [*CONFIGS[a.config].get("extra", []), *extra]}
            got: dict[str, Any] = {}
            capture_run(out, f"{a.config}_{label}", c, megatron, env, got, clock)
            res["captures"][label] = {**got.get("capture", {}), "extra": extra}
            (out / "diag.json").write_text(json.dumps(res, indent=1, default=str))
        for label, flags in MEASURES.items():
            if not clock.fits(70):
                break
            c = CONFIGS[a.config]
            got = measure(megatron, c, env, [" ".join(flags)] if flags else [], [], out, label, keep_log=True)
            res["runs"][label] = got
            clock.say(f"{label}: {got['steady']} exit {got['exit']}")
            (out / "diag.json").write_text(json.dumps(res, indent=1, default=str))
    except Exception:
        (out / "error.txt").write_text(traceback.format_exc())
        traceback.print_exc()
    clock.say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
