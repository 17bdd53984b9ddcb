"""Goodput of a real Megatron-LM job with checkpoint saves and evaluations, live (about 3 minutes).

    MEGATRON_DIR=... python3 tests/gpu/megatron_save_goodput_live.py OUT_DIR

Megatron-LM is not part of this repository: MEGATRON_DIR points at a checkout (core 0.20). Starts
`perfd aggregator`, `perfd launch -- torchrun pretrain_gpt.py` (one GPU, h=1024, 12 layers, a save
every ``--save-interval`` iterations and an evaluation every ``--eval-interval``) and `perfd agent
--launch-manifest --nvml real`; once the job has exited and its last record is in, reads the job's
goodput from the aggregator (``/api/jobs/<job>/summary``) and checks it against two references on
the same log: ``perfd analyze megatron`` (the whole log parsed at once) and the log's own stamps
(``successfully saved checkpoint`` − ``saving checkpoint`` for every save).

What it proves: live, a save's ``save-checkpoint`` timer reaches its record although the log is
quiet for the whole save (the collector holds the record while the save it announced is open), so
the live checkpoint part is the saves' time and the stall part is 0 — before, every save over the
collector's 2 s quiet flush was read as a stall live. Writes OUT_DIR/save_goodput.json and
save_goodput.md; the job's log and both daemons' output in OUT_DIR/raw/. Exit 0 when every check
holds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.gpu.verdict_live import megatron_argv
from tests.procs import (
    PERFD,
    Procs,
    get_json,
    run_env,
    start_agent,
    start_aggregator,
    wait_for,
    wait_manifest,
)

JOB = "save-goodput"
STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\] "
SAVING = re.compile(STAMP + r"saving checkpoint at iteration\s+(\d+)")
SAVED = re.compile(STAMP + r"successfully saved checkpoint from iteration\s+(\d+)")
PARTS = ("training", "checkpoint", "evaluation", "stall", "other", "startup", "restart", "incident")


def _epoch(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").timestamp()  # the job's local time, as it printed


def saves_by_stamps(log: str) -> dict[int, float]:
    """iteration -> seconds from 'saving checkpoint' to 'successfully saved checkpoint' (the log's own
    stamps, read apart from perfd's parser)."""
    began = {int(m[2]): _epoch(m[1]) for m in SAVING.finditer(log)}
    ended = {int(m[2]): _epoch(m[1]) for m in SAVED.finditer(log)}
    return {it: round(ended[it] - t, 3) for it, t in began.items() if it in ended}


def offline_goodput(log: Path) -> dict[str, Any]:
    p = subprocess.run([*PERFD, "analyze", "megatron", str(log), "--gpu", "NVIDIA H100 80GB HBM3", "--json"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"perfd analyze megatron exited {p.returncode}: {p.stderr[-2000:]}")
    return dict(json.loads(p.stdout)["summary"]["goodput"])


def run(out: Path, a: argparse.Namespace, megatron: Path) -> dict[str, Any]:
    raw = out / "raw"
    shutil.rmtree(raw, ignore_errors=True)
    raw.mkdir(parents=True)
    res: dict[str, Any] = {"job": JOB, "args": {k: str(v) for k, v in vars(a).items()}}
    procs = Procs(raw, run_env(NCCL_NVLS_ENABLE="0", CUDA_DEVICE_MAX_CONNECTIONS="1"))
    try:
        grpc_port, _, base = start_aggregator(procs)
        c = {"layers": 12, "hidden": 1024, "heads": 16, "seq": 1024, "mbs": 4, "gbs": 32, "iters": a.iters}
        cmd = [*megatron_argv(megatron, c), "--save", str(raw / "ckpt"),
               "--save-interval", str(a.save_interval), "--eval-interval", str(a.eval_interval),
               "--eval-iters", "5"]
        run_dir = raw / "run"
        launch = procs.start("launch", [*PERFD, "launch", "--job", JOB, "--run-dir", str(run_dir), "--",
                                        *cmd])
        manifest = wait_manifest(run_dir / "launch.json", launch)
        start_agent(procs, grpc_port, manifest=manifest, nvml="real")
        t0 = time.time()
        rc = launch.wait(timeout=a.max_s)
        res["job_exit"], res["job_s"] = rc, round(time.time() - t0, 1)
        log_text = (run_dir / "output.log").read_text(errors="replace")
        last = max((int(m) for m in re.findall(r" iteration\s+(\d+)/", log_text)), default=None)
        res["last_iteration"] = last

        def caught_up() -> dict[str, Any] | None:
            ov = get_json(f"{base}/api/jobs/{JOB}/summary")  # the analysis too, not only the store
            held = (ov.get("overview") or {}).get("last_iteration"), (ov.get("latest") or {}).get("iteration")
            return ov if held == (last, last) and ov.get("goodput") else None

        summary = wait_for(caught_up, 60, f"the aggregator holding iteration {last}", interval=1.0)
        res["live"] = summary.get("goodput")
        res["offline"] = offline_goodput(run_dir / "output.log")
        res["saves_by_stamps"] = saves_by_stamps(log_text)
        res["evaluations"] = len(re.findall(r"validation loss at iteration", log_text))
        res["checks"] = checks(res)
    except Exception as exc:
        import traceback

        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
    finally:
        procs.stop()
        src = raw / "run" / "output.log"
        if src.exists():
            (raw / "job.log").write_bytes(src.read_bytes())
        shutil.rmtree(raw / "ckpt", ignore_errors=True)
    return res


def checks(res: dict[str, Any]) -> dict[str, Any]:
    live, off = res["live"]["parts_s"], res["offline"]["parts_s"]
    stamps = sum(res["saves_by_stamps"].values())
    c: dict[str, Any] = {
        "saves": len(res["saves_by_stamps"]),
        "evaluations": res["evaluations"],
        "checkpoint_live_s": round(live["checkpoint"], 2),
        "checkpoint_offline_s": round(off["checkpoint"], 2),
        "checkpoint_by_stamps_s": round(stamps, 2),
        "evaluation_live_s": round(live["evaluation"], 2),
        "evaluation_offline_s": round(off["evaluation"], 2),
        "stall_live_s": round(live["stall"], 2),
        "stall_offline_s": round(off["stall"], 2),
    }

    def near(x: float, ref: float) -> bool:
        return abs(x - ref) <= 0.02 * ref

    c["checkpoint_live_vs_offline_within_2pct"] = near(live["checkpoint"], off["checkpoint"])
    c["checkpoint_live_vs_stamps_within_2pct"] = near(live["checkpoint"], stamps)
    c["evaluation_live_vs_offline_within_2pct"] = near(live["evaluation"], off["evaluation"])
    c["no_stall_live"] = live["stall"] == 0
    c["all"] = bool(c["saves"] >= 2 and c["evaluations"] >= 1 and c["no_stall_live"]
                    and all(v for k, v in c.items() if k.endswith("_2pct")))
    return c


def markdown(res: dict[str, Any]) -> str:
    out = [f"# Goodput of a Megatron-LM job with saves, live vs offline ({JOB})", "",
           f"Job exit {res.get('job_exit')} after {res.get('job_s')} s, "
           f"last iteration {res.get('last_iteration')}; "
           f"saves by the log's stamps (s): {res.get('saves_by_stamps')}.", "",
           "| part (s) | live (aggregator) | offline (`perfd analyze megatron`) |", "|---|---|---|"]
    live, off = (res.get("live") or {}).get("parts_s", {}), (res.get("offline") or {}).get("parts_s", {})
    out += [f"| {k} | {live.get(k, 0):.2f} | {off.get(k, 0):.2f} |" for k in PARTS]
    out += ["", "| check | result |", "|---|---|"]
    out += [f"| {k} | {json.dumps(v)} |" for k, v in (res.get("checks") or {}).items()]
    if "error" in res:
        out += ["", f"error: {res['error']}"]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--save-interval", type=int, default=20)
    ap.add_argument("--eval-interval", type=int, default=30)
    ap.add_argument("--max-s", type=float, default=420.0, help="the longest the job may run")
    a = ap.parse_args()
    megatron = Path(os.environ.get("MEGATRON_DIR", ""))
    if not (megatron / "pretrain_gpt.py").exists():
        print("set MEGATRON_DIR to a Megatron-LM checkout (core 0.20)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    res = run(a.out, a, megatron)
    (a.out / "save_goodput.json").write_text(json.dumps(res, indent=1, default=str))
    (a.out / "save_goodput.md").write_text(markdown(res))
    print(markdown(res))
    return 0 if (res.get("checks") or {}).get("all") else 1


if __name__ == "__main__":
    sys.exit(main())
