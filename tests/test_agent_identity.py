"""An agent's identity and what its /metrics says about jobs: ids unique per role on a node, no job
"default" for a node agent, each GPU series in the job its processes declare, captures counted."""

from __future__ import annotations

from typing import Any

from perfd.agent.config import apply_overrides, load_config
from perfd.agent.node_agent import Agent
from perfd.collectors.collector import Collected
from perfd.core.events import CAPTURE_FAILED, CAPTURE_FINISHED, GPU_PROCESSES
from perfd.core.model import Sample
from perfd.core.placement import declared_job, gpu_job


def test_default_agent_ids_differ_for_the_node_agent_and_a_job_sidecar() -> None:
    node = apply_overrides(load_config(None), node="n7", nvml="off", host=False)
    side = apply_overrides(load_config(None), node="n7", job="gpt", nvml="off", host=False)
    assert (node.agent_id, node.job) == ("n7/node", "")  # serves no job: no phantom "default"
    assert (side.agent_id, side.job) == ("n7/gpt", "gpt")
    again = apply_overrides(load_config(None), node="n7", job="gpt", nvml="off", host=False)
    assert again.agent_id == side.agent_id  # stable across restarts
    # A log without a job name still gets one (its data is a job's), and an explicit id wins.
    log = apply_overrides(load_config(None), node="n7", megatron_log="/x.log", nvml="off", host=False)
    assert (log.agent_id, log.job) == ("n7/default", "default")
    given = apply_overrides(load_config(None), node="n7", agent_id="a1", nvml="off", host=False)
    assert given.agent_id == "a1"


def test_placement_rules() -> None:
    procs: list[dict[str, Any]] = [{"pid": 1, "job": "a", "used_memory_bytes": 1 << 20},
                                   {"pid": 2, "job": "b", "used_memory_bytes": 1 << 30},
                                   {"pid": 3, "job": None}]
    assert declared_job(procs) == "b"  # more GPU memory wins
    assert declared_job([{"pid": 1, "job": "z"}, {"pid": 2, "job": "a"}]) == "a"  # then the name: stable
    assert gpu_job([{"pid": 1}], "side") == "side" and gpu_job([], None) is None and gpu_job(None, "") is None


def _gpu(name: str, gpu: str, value: float) -> Sample:
    labels = {"gpu": gpu, "uuid": f"GPU-{gpu}", "model": "H100"}
    return Sample(name=name, value=value, time=1.0, labels=labels)


def test_node_agent_metrics_put_each_gpu_in_the_job_on_it() -> None:
    agent = Agent(apply_overrides(load_config(None), node="n7", nvml="off", metrics_port=-1))
    procs = {"kind": GPU_PROCESSES.name, "labels": {"gpu": "0"},
             "payload": [{"pid": 10, "rank": 0, "job": "gpt", "used_memory_bytes": 1}]}
    idle = {"kind": GPU_PROCESSES.name, "labels": {"gpu": "1"}, "payload": []}
    agent._forward([("nvml", Collected(samples=[_gpu("perfd_gpu_power_watts", "0", 300.0),
                                                _gpu("perfd_gpu_power_watts", "1", 60.0)],
                                       events=[procs, idle]))])
    agent._forward([("host", Collected(samples=[Sample("perfd_host_load1", 1.0, 1.0, {})]))])
    rows = {(name, labels.get("gpu")): dict(labels) for labels, name, _v in agent.node_rows()}
    assert rows[("perfd_gpu_power_watts", "0")]["job_name"] == "gpt"
    assert "job_name" not in rows[("perfd_gpu_power_watts", "1")]  # idle: in no job
    assert "job_name" not in rows[("perfd_host_load1", None)]
    assert rows[("perfd_gpu_info", "0")] == {"gpu": "0", "uuid": "GPU-0", "model": "H100", "node": "n7",
                                             "job_name": "gpt"}
    assert rows[("perfd_gpu_info", "1")]["uuid"] == "GPU-1"
    # The job leaves the GPU: its series leave the job.
    agent._forward([("nvml", Collected(events=[{**procs, "payload": []}]))])
    rows = {(name, labels.get("gpu")): dict(labels) for labels, name, _v in agent.node_rows()}
    assert "job_name" not in rows[("perfd_gpu_power_watts", "0")]


def test_a_sidecar_keeps_its_gpus_unless_another_job_declares_them() -> None:
    agent = Agent(apply_overrides(load_config(None), node="n7", job="mine", nvml="off", metrics_port=-1))
    other = {"kind": GPU_PROCESSES.name, "labels": {"gpu": "1"}, "payload": [{"pid": 5, "job": "theirs"}]}
    agent._forward([("nvml", Collected(samples=[_gpu("perfd_gpu_power_watts", "0", 1.0),
                                                _gpu("perfd_gpu_power_watts", "1", 1.0)], events=[other]))])
    jobs = {labels["gpu"]: labels["job_name"] for labels, name, _v in agent.node_rows()
            if name == "perfd_gpu_power_watts"}
    assert jobs == {"0": "mine", "1": "theirs"}


def test_captures_are_counted_by_tool_and_outcome() -> None:
    agent = Agent(apply_overrides(load_config(None), node="n7", job="gpt", nvml="off", metrics_port=-1))
    ended = ((CAPTURE_FINISHED.name, "ok"), (CAPTURE_FAILED.name, "failed"), (CAPTURE_FAILED.name, "skipped"),
             (CAPTURE_FAILED.name, "weird"), ("capture_started", ""))
    for kind, status in ended:
        agent._emit_event({"kind": kind, "labels": {"tool": "kineto"}, "payload": {"status": status}})
    rows = {(lab["tool"], lab["status"]): v for lab, name, v in agent.self_metric_rows()
            if name == "perfd_agent_captures_total"}
    assert rows == {("kineto", "ok"): 1.0, ("kineto", "failed"): 2.0, ("kineto", "skipped"): 1.0}
    assert agent.collect_duration_family().name == "perfd_agent_collect_duration_seconds"
