"""On a real GPU machine: the live pipeline places a job's ranks on their GPUs and names a foreign
process that shares a rank's GPU.

Starts `perfd aggregator` and `perfd agent --nvml real` (streaming over loopback gRPC), a torchrun
job whose ranks allocate memory on their GPUs (ranks round-robin over the visible GPUs), and a
foreign process (no RANK in its environment) on GPU 0. The agent also tails a recorded Megatron log
so the job has a layout (world size 2). Then reads /api/jobs/<job>/summary and /metrics.

    python3 tests/gpu/verify_rank_attribution.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.procs import ROOT, Procs, free_port, get_json, http_get, start_agent, start_aggregator

LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
FOREIGN_CODE = """
import time, torch
x = torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda:0')
torch.cuda.synchronize()
time.sleep(25)
"""


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    with Procs(out, env) as procs:
        grpc_port, _, base = start_aggregator(procs, ready=out / "ready")
        log = out / "train.log"
        shutil.copy(LOG, log)
        procs.start("job", [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
                            "tests.gpu._hold_gpu"], env={"PYTHONPATH": f"{ROOT}:{env.get('PYTHONPATH', '')}"})
        foreign = procs.start("foreign", [sys.executable, "-c", FOREIGN_CODE])
        time.sleep(8)  # CUDA contexts up before the agent's first process scan
        start_agent(procs, grpc_port, "--job", "attr", "--megatron-log", log, metrics_port=free_port())
        time.sleep(8)
        summary = get_json(f"{base}/api/jobs/attr/summary")
        metrics = http_get(f"{base}/metrics", timeout=10).decode()
        smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout
        result = {
            "ranks": summary.get("ranks"),
            "rank_info_lines": [ln for ln in metrics.splitlines() if ln.startswith("perfd_job_rank_info")],
            "foreign_pid": foreign.pid,
            "nvidia_smi_compute_apps": smi.strip().splitlines(),
            "overview": summary.get("overview"),
            "mfu_latest": (summary.get("latest") or {}).get("mfu"),
        }
        (out / "rank_attribution.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
        ranks = {r["rank"]: r for r in summary.get("ranks") or []}
        ok = set(ranks) == {0, 1} and any(
            p["pid"] == foreign.pid for r in ranks.values() if r["gpu"] == "0" for p in r["other_processes"])
        print("OK: both ranks placed, the foreign process named" if ok else "FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
