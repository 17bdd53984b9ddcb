"""On a real GPU machine: the Kubernetes pairing, real NVML. A node agent (`--nvml real`, no job) and
a job's sidecar (`--job`, the log, `--nvml off`) with the same --node stream side by side; the job's
ranks run with PERFD_JOB set (as `perfd launch`, perfd-slurm-run and the example Job set it), a
foreign process declares another job on GPU 0. Checks: two agent ids, no stream superseded, no job
"default"; the node agent's GPU series of the rank GPUs carry job_name, and its UUID and pci_bus_id
equal nvidia-smi's (DCGM-exporter's values come from the same NVML calls).

    python3 tests/gpu/verify_node_agent_placement.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.procs import ROOT, Procs, free_port, get_json, http_get, start_agent, start_aggregator

LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
JOB, NODE = "pair", "gpu-node"
FOREIGN_CODE = """
import time, torch
x = torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda:0')
torch.cuda.synchronize()
time.sleep(40)
"""


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PERFD_JOB")}
    with Procs(out, env) as procs:
        grpc_port, _, base = start_aggregator(procs, ready=out / "ready")
        log = out / "train.log"
        shutil.copy(LOG, log)
        job_env = {"PERFD_JOB": JOB, "HOLD_S": "40", "PYTHONPATH": f"{ROOT}:{env.get('PYTHONPATH', '')}"}
        procs.start("job", [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
                            "tests.gpu._hold_gpu"], env=job_env)
        procs.start("foreign", [sys.executable, "-c", FOREIGN_CODE], env={"PERFD_JOB": "other"})
        time.sleep(8)  # CUDA contexts up before the agents' first process scan
        node_port, side_port = free_port(), free_port()
        start_agent(procs, grpc_port, "--node", NODE, metrics_port=node_port, name="node-agent")
        start_agent(procs, grpc_port, "--node", NODE, "--job", JOB, "--megatron-log", log, "--host", "off",
                    nvml="off", metrics_port=side_port, name="sidecar")
        time.sleep(12)
        stats, jobs = get_json(f"{base}/api/stats"), get_json(f"{base}/api/jobs")
        gpus, summary = get_json(f"{base}/api/jobs/{JOB}/gpus"), get_json(f"{base}/api/jobs/{JOB}/summary")
        text = http_get(f"http://127.0.0.1:{node_port}/metrics", timeout=10).decode()
        info = [dict(s.labels) for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "perfd_gpu_info"]
        smi = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,name",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout
        smi_rows = {r[0]: r for r in (
            [c.strip() for c in ln.split(",")] for ln in smi.strip().splitlines())}
        result = {"agents_seen": sorted(stats["agents_seen"]),
                  "streams_superseded": stats.get("transport", {}).get("streams_superseded"),
                  "jobs": sorted(j["job"] for j in jobs["jobs"]),
                  "job_gpus": [(g["node"], g["gpu"]) for g in gpus["gpus"]],
                  "ranks": [(r["rank"], r["node"], r["gpu"]) for r in summary.get("ranks") or []],
                  "gpu_info": info, "nvidia_smi": smi.strip().splitlines()}
        (out / "node_agent_placement.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
        rank_gpus = {g for _r, _n, g in result["ranks"]}
        checks = {
            "two agent ids": result["agents_seen"] == [f"{NODE}/{JOB}", f"{NODE}/node"],
            "no stream superseded": result["streams_superseded"] == 0,
            "no phantom job": result["jobs"] == [JOB],
            "ranks placed": sorted(r for r, _n, _g in result["ranks"]) == [0, 1],
            # GPU 0 holds rank 0 and the foreign job's process: the larger memory holder wins it.
            "job's GPUs": bool(rank_gpus) and rank_gpus <= {g for _n, g in result["job_gpus"]} | {"0"},
            "identity = nvidia-smi": all(
                i["UUID"] == smi_rows[i["gpu"]][1] and i["pci_bus_id"] == smi_rows[i["gpu"]][2]
                and i["modelName"] == smi_rows[i["gpu"]][3] for i in info) and bool(info),
            "job_name on rank GPUs": all(i.get("job_name") in (JOB, "other") for i in info
                                         if i["gpu"] in rank_gpus),
        }
        for k, v in checks.items():
            print(f"{'OK  ' if v else 'FAIL'} {k}")
        return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
