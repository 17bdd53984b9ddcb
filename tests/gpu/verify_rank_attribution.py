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
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "perfd" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
FOREIGN_CODE = """
import time, torch
x = torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda:0')
torch.cuda.synchronize()
time.sleep(25)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    ready = out / "ready"
    agg = subprocess.Popen([sys.executable, "-m", "perfd.cli", "aggregator", "--grpc-host", "127.0.0.1",
                            "--grpc-port", "0", "--http-host", "127.0.0.1", "--http-port", "0",
                            "--ready-file", str(ready)], cwd=ROOT, env=env,
                           stdout=(out / "aggregator.out").open("w"), stderr=subprocess.STDOUT)
    procs = [agg]
    try:
        while not (ready.exists() and ready.read_text().strip()):
            time.sleep(0.1)
        grpc_port, http_port = map(int, ready.read_text().split())
        log = out / "train.log"
        shutil.copy(LOG, log)
        job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                "-m", "tests.gpu._hold_gpu"], cwd=ROOT,
                               env={**env, "PYTHONPATH": f"{ROOT}:{env.get('PYTHONPATH', '')}"},
                               stdout=(out / "job.out").open("w"), stderr=subprocess.STDOUT)
        foreign = subprocess.Popen([sys.executable, "-c", FOREIGN_CODE], env=env)
        procs += [job, foreign]
        time.sleep(8)  # CUDA contexts up before the agent's first process scan
        agent = subprocess.Popen([sys.executable, "-m", "perfd.cli", "agent", "--aggregator",
                                  f"127.0.0.1:{grpc_port}", "--job", "attr", "--megatron-log", str(log),
                                  "--nvml", "real", "--metrics-port", str(free_port())], cwd=ROOT, env=env,
                                 stdout=(out / "agent.out").open("w"), stderr=subprocess.STDOUT)
        procs.append(agent)
        time.sleep(8)
        base = f"http://127.0.0.1:{http_port}"
        summary = json.loads(urllib.request.urlopen(f"{base}/api/jobs/attr/summary", timeout=10).read())
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
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
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
