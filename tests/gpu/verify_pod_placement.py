"""On a real GPU machine: the Kubernetes sidecar topology with a trainer that declares NO PERFD_JOB.
A node agent (`--nvml real`, no job, the node's pid namespace, as the DaemonSet's with
hostPID), an aggregator, and a "pod": one pid namespace of its own (`unshare --pid`, the pod of a
job with shareProcessNamespace: true) holding the job's sidecar agent (`--job`, PERFD_JOB from the
pod's label, `--nvml off --ranks pod`) and its trainer (a CUDA PyTorch loop, RANK=0, no PERFD_JOB,
KINETO_USE_DAEMON=1). Checks: the node agent places the trainer's GPU in the job (its /metrics:
job_name on the GPU series; the aggregator: the job's GPU, rank 0 placed on it, its process with
the job), and a capture of rank 0 asked of the aggregator reaches the sidecar and returns a Kineto
trace of the trainer's kernels.

    python3 tests/gpu/verify_pod_placement.py OUT_DIR        (as root: unshare needs it)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.procs import ROOT, Procs, free_port, get_json, http_get, start_agent, start_aggregator

LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
JOB, NODE = "pod-job", "gpu-node"
TRAINER = """
import sys, time, torch
m = torch.nn.Linear(4096, 4096, device="cuda")
opt = torch.optim.SGD(m.parameters(), lr=1e-3)
x = torch.randn(1024, 4096, device="cuda")
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    loss = m(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    torch.cuda.synchronize()
    time.sleep(0.05)
"""


def _gpu_series(url: str, name: str) -> list[dict[str, str]]:
    text = http_get(url, timeout=10).decode()
    return [dict(s.labels) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PERFD_JOB")}
    env["PYTHONPATH"] = f"{ROOT}:{env.get('PYTHONPATH', '')}"
    sdir = Path(tempfile.mkdtemp(prefix="pk", dir="/tmp"))  # Kineto's socket folder, in the pod
    with Procs(out, env) as procs:
        grpc, _http, base = start_aggregator(procs, "--no-rules", ready=out / "ready")
        node_port = free_port()
        start_agent(procs, grpc, "--node", NODE, metrics_port=node_port, name="node-agent")
        log = out / "train.log"
        shutil.copy(LOG, log)
        (out / "trainer.py").write_text(TRAINER)
        (out / "kineto.conf").write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")
        (out / "sidecar.yaml").write_text(f"kineto_socket_dir: {sdir}\ncapture_dir: {out / 'captures'}\n")
        sidecar = (f"{sys.executable} -m perfd.app.cli agent --config {out / 'sidecar.yaml'} --job {JOB} "
                   f"--node {NODE} --aggregator 127.0.0.1:{grpc} --megatron-log {log} --nvml off --host off "
                   f"--ranks pod --metrics-port {free_port()} >{out / 'sidecar.out'} 2>&1")
        trainer = (f"env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 KINETO_USE_DAEMON=1 "
                   f"KINETO_CONFIG={out / 'kineto.conf'} KINETO_IPC_SOCKET_DIR={sdir} "
                   f"{sys.executable} {out / 'trainer.py'} 150 >{out / 'trainer.out'} 2>&1")
        procs.start("pod", ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
                            f"PERFD_JOB={JOB} {sidecar} & {trainer} & wait"])
        result: dict[str, Any] = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the node agent's process scan, the sidecar's pod scan
            gpus = get_json(f"{base}/api/jobs/{JOB}/gpus") if JOB in {j["job"] for j in get_json(
                f"{base}/api/jobs")["jobs"]} else {"gpus": [], "rank_hosts": []}
            summary = get_json(f"{base}/api/jobs/{JOB}/summary") if gpus["gpus"] else {}
            if gpus["gpus"] and summary.get("ranks") and gpus["rank_hosts"]:
                break
            time.sleep(2)
        result["job_gpus"] = [(g["node"], g["gpu"], [(p["pid"], p.get("rank"), p.get("job"))
                                                     for p in g.get("processes") or []])
                              for g in gpus["gpus"]]
        result["ranks"] = [(r["rank"], r["node"], r["gpu"]) for r in summary.get("ranks") or []]
        result["rank_hosts"] = [(r["rank"], r["pid"], r["node"]) for r in gpus.get("rank_hosts") or []]
        node_metrics = f"http://127.0.0.1:{node_port}/metrics"
        result["node_agent_gpu_info"] = _gpu_series(node_metrics, "perfd_gpu_info")
        result["node_agent_rank_state"] = _gpu_series(node_metrics, "perfd_host_rank_state_info")
        r = subprocess.run([sys.executable, "-m", "perfd.app.cli", "capture", "--aggregator", base, "--job",
                            JOB,
                            "--ranks", "0", "--steps", "3", "--tool", "kineto"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
        result["capture_cli"] = r.stdout[-500:] + r.stderr[-500:]
        cap: dict[str, Any] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            caps = [c for c in get_json(f"{base}/api/captures")["captures"] if c["job"] == JOB]
            cap = caps[-1] if caps else {}
            if cap.get("status") in ("finished", "failed"):
                break
            time.sleep(2)
        result["capture"] = {k: cap.get(k) for k in ("status", "reason", "agents", "bottleneck")}
        devices = ((cap.get("result") or {}).get("ranks") or {}).get("0", {}).get("devices") or []
        result["capture_devices"] = [{k: d.get(k) for k in ("device", "kernels", "busy_ms", "span_ms")}
                                     for d in devices]
        traces = sorted(str(p.relative_to(out)) for p in (out / "captures").rglob("rank0_*.json*"))
        result["traces"] = traces
    shutil.rmtree(sdir, ignore_errors=True)
    (out / "pod_placement.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    trainer_pids = {pid for _n, _g, procs_ in result["job_gpus"] for pid, rank, job in procs_
                    if rank == 0 and job == JOB}
    checks = {
        "the job's GPU placed by the node agent": bool(result["job_gpus"]) and bool(trainer_pids),
        "rank 0 placed on it": [r for r, _n, _g in result["ranks"]] == [0],
        "job_name on the node agent's GPU series": any(i.get("job_name") == JOB
                                                       for i in result["node_agent_gpu_info"]),
        "the sidecar follows rank 0 of its pod": any(r == 0 and pid not in trainer_pids
                                                      for r, pid, _n in result["rank_hosts"]),
        "capture reached the sidecar and finished": result["capture"]["status"] == "finished"
        and result["capture"]["agents"] == [f"{NODE}/{JOB}"],
        "a trace of rank 0": bool(result["traces"]),
    }
    for k, v in checks.items():
        print(f"{'OK  ' if v else 'FAIL'} {k}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
