"""The documented Kubernetes pairing: a node agent (the DaemonSet's: NVML, no job) and a job's sidecar
agent (its log, --nvml off) on one node, both given the same --node, one real aggregator (the three
in the test's process: tests/inproc.py). Their default agent ids differ (no stream supersedes the
other, both stay connected), no job "default" appears, and the node agent's GPU lands in the job whose
processes run on it: in /api/jobs/<job>/gpus, in rank placement and in job_name on the node agent's
/metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.inproc import Pipeline, pipeline
from tests.procs import http_get, placed_recording

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
NVML = ROOT / "perfd" / "collectors" / "nvml" / "data" / "h100_phases.jsonl"
JOB = "gpt-pair"
NODE = "gpu-node-7"
BUS = "00000000:18:00.0"


def _connected(metrics_url: str) -> float | None:
    for fam in text_string_to_metric_families(http_get(metrics_url).decode()):
        if fam.name == "perfd_agent_connected":
            return float(fam.samples[0].value)
    return None


def test_node_agent_and_sidecar_on_one_node(tmp_path: Path) -> None:
    with pipeline(tmp_path, "--gpu", "NVIDIA H100 80GB HBM3") as p:
        recording = placed_recording(NVML, tmp_path / "node.jsonl", JOB, BUS)
        node_cfg = tmp_path / "node-agent.yaml"  # the DaemonSet's: NVML (looping), no job
        node_cfg.write_text(f"batch_interval_s: 0.2\naggregator_sample_interval_s: 0.5\n"
                            f"collectors:\n  nvml: {{source: 'replay:{recording}', loop: true}}\n")
        train_log = tmp_path / "train.log"
        train_log.write_text(LOG.read_text())
        common = ("--node", NODE, "--host", "off", "--metrics-port", "0")
        node = p.agent("--config", node_cfg, *common, name="node-agent")
        side = p.agent("--job", JOB, "--megatron-log", train_log, "--nvml", "off", *common, name="sidecar")
        node_metrics, side_metrics = node.metrics_url, side.metrics_url

        def both_in() -> dict[str, Any] | None:
            stats = p.json("/api/stats")
            gpus = p.json(f"/api/jobs/{JOB}/gpus")["gpus"] if JOB in _jobs(p) else []
            return stats if len(stats["agents_seen"]) == 2 and gpus else None

        stats = p.wait(both_in, 60, "both agents seen and the job's GPU placed")
        assert set(stats["agents_seen"]) == {f"{NODE}/node", f"{NODE}/{JOB}"}

        # Both connected every time asked while 25 more batches come in (5 s of the node agent's at
        # 0.2 s: the old code flipped within a second or two), and no stream of one agent ever
        # superseded the other's.
        batches = p.json("/api/stats")["transport"]["batches"]

        def batches_in() -> bool:
            assert _connected(node_metrics) == 1.0 and _connected(side_metrics) == 1.0
            return bool(p.json("/api/stats")["transport"]["batches"] >= batches + 25)

        p.wait(batches_in, 60, "25 more batches at the aggregator")
        transport = p.json("/api/stats")["transport"]
        assert transport["streams_superseded"] == 0, transport
        for h in (node, side):
            assert not h.task.done(), h.seen()  # both still running

        # No phantom job: only the sidecar's job exists, and it holds the node agent's GPU.
        assert _jobs(p) == [JOB]
        (gpu,) = p.json(f"/api/jobs/{JOB}/gpus")["gpus"]
        assert (gpu["node"], gpu["gpu"], gpu["model"]) == (NODE, "0", "NVIDIA H100 80GB HBM3")
        assert gpu["values"]["perfd_gpu_memory_total_bytes"] > 0
        # Rank placement sees the job's rank 0 on it (the node agent reported the process list).
        summary = p.json(f"/api/jobs/{JOB}/summary")
        assert [(r["rank"], r["node"], r["gpu"]) for r in summary["ranks"]] == [(0, NODE, "0")]

        # The node agent's own /metrics: GPU series in the job, with DCGM-exporter's identity labels.
        text = http_get(node_metrics).decode()
        mem = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "perfd_gpu_memory_total_bytes"]
        assert len(mem) == 1
        lab = mem[0].labels
        assert lab["job_name"] == JOB and lab["Hostname"] == NODE and lab["pci_bus_id"] == BUS
        assert lab["UUID"] == lab["uuid"] and lab["model"] == "NVIDIA H100 80GB HBM3"
        assert 'job_name="default"' not in text
        info = [s for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "perfd_gpu_info"]
        assert [(s.labels["job_name"], s.labels["UUID"], s.labels["modelName"], s.value) for s in info] == \
            [(JOB, lab["UUID"], lab["model"], 1.0)]
        # --host off; the ranks collector follows no rank here: nothing perfd_host_*
        assert not re.search(r'^perfd_host_', text, re.M), re.findall(r'^perfd_host_.*', text, re.M)


def _jobs(p: Pipeline) -> list[str]:
    return sorted(j["job"] for j in p.json("/api/jobs")["jobs"])
