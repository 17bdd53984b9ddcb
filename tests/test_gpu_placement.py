"""The aggregator places each GPU in the job its processes declare, whichever agent reports it: a
node agent (in no job) next to a job's sidecar (with no GPUs of its own) on one node. The job's GPU
rows, rank placement and exported job_name follow; a GPU another job declares is never this job's;
no job "default" is made up."""

from __future__ import annotations

from typing import Any

from perfd.aggregator.http import _StateCollector, job_gpus
from perfd.aggregator.snapshot import overview_of
from perfd.aggregator.state import AggregatorState
from perfd.analytics.incidents.attribution import place_ranks
from perfd.core.events import GPU_PROCESSES

NODE = "n7"


def _gpu_series(state: AggregatorState, agent: str, gpus: list[str]) -> None:
    defs = {}
    for i, g in enumerate(gpus):
        labels = (("gpu", g), ("model", "NVIDIA H100"), ("node", NODE), ("uuid", f"GPU-{g}"))
        defs[2 * i + 1] = ("perfd_gpu_power_watts", labels)
        defs[2 * i + 2] = ("perfd_gpu_memory_total_bytes", labels)
    ids = sorted(defs)
    state.ingest_samples(agent, defs, ids, [1] * len(ids), [float(100 + i) for i in ids])


def _procs(state: AggregatorState, agent: str, gpu: str, procs: list[dict[str, Any]]) -> None:
    state.ingest_events(agent, [{"kind": GPU_PROCESSES.name, "severity": "info", "time": 1.0,
                                 "labels": {"node": NODE, "gpu": gpu}, "payload": procs}])


def _state() -> AggregatorState:
    state = AggregatorState()
    state.hello(f"{NODE}/node", [])  # the DaemonSet's agent: no job
    state.hello(f"{NODE}/gpt", ["gpt"])  # the sidecar: the job's log, no NVML
    _gpu_series(state, f"{NODE}/node", ["0", "1", "2"])
    _procs(state, f"{NODE}/node", "0", [{"pid": 10, "rank": 0, "world_size": 2, "job": "gpt"}])
    _procs(state, f"{NODE}/node", "1", [{"pid": 11, "rank": 0, "world_size": 1, "job": "other"}])
    _procs(state, f"{NODE}/node", "2", [])  # idle
    return state


def test_a_node_agents_gpus_land_in_the_job_on_them() -> None:
    state = _state()
    assert state.job_names() == ["gpt"]  # no phantom "default"
    rows = job_gpus(state, "gpt")
    assert rows is not None
    assert [(r["node"], r["gpu"]) for r in rows["gpus"]] == [(NODE, "0")]
    assert rows["gpus"][0]["values"]["perfd_gpu_power_watts"] == 101.0
    procs = state.gpu_procs("gpt")
    assert list(procs) == [(NODE, "0")]
    assert {r: (p.node, p.gpu) for r, p in place_ranks(procs).items()} == {0: (NODE, "0")}
    view_procs, values, _thr = state.gpu_view("gpt")
    assert list(view_procs) == list(values) == [(NODE, "0")]
    # The job's GPU model (MFU's peak table) comes from the node agent's series of its GPU.
    _gpu_series(state, f"{NODE}/node", ["0", "1", "2"])
    overview = overview_of(state.snapshot("gpt"))
    assert overview is not None and overview["gpu"] == "NVIDIA H100"
    assert "other" not in state.job_names()  # placement never makes a job


def test_the_job_follows_the_processes() -> None:
    state = _state()
    _procs(state, f"{NODE}/node", "0", [])  # the job left GPU 0 ...
    _procs(state, f"{NODE}/node", "2", [{"pid": 12, "rank": 1, "job": "gpt"}])  # ... and runs on GPU 2
    rows = job_gpus(state, "gpt")
    assert rows is not None and [r["gpu"] for r in rows["gpus"]] == ["2"]


def test_a_co_tenant_of_another_job_does_not_take_the_gpu_from_the_job() -> None:
    """Another job's process on a rank's GPU holding more memory: the GPU's series are labelled with
    that job, yet it stays one of this job's GPUs (its rank runs there), and the co-tenant is in its
    process list for the GPU hints."""
    state = _state()
    _procs(state, f"{NODE}/node", "0", [{"pid": 10, "rank": 0, "job": "gpt", "used_memory_bytes": 1},
                                        {"pid": 99, "job": "other", "used_memory_bytes": 1 << 30}])
    procs = state.gpu_procs("gpt")
    assert [p["pid"] for p in procs[(NODE, "0")]] == [10, 99]
    assert state.gpu_procs("other").keys() == {(NODE, "0"), (NODE, "1")}
    rows = job_gpus(state, "gpt")
    assert rows is not None and [r["gpu"] for r in rows["gpus"]] == ["0"]
    labels = {fam.name: [s.labels.get("job_name") for s in fam.samples if s.labels.get("gpu") == "0"]
              for fam in _StateCollector(state, export_node_series=True).collect()}
    assert labels["perfd_gpu_power_watts"] == ["other"]
    _procs(state, f"{NODE}/node", "0", [{"pid": 10, "rank": 0, "job": "gpt"}])  # the co-tenant left
    assert state.gpu_procs("other").keys() == {(NODE, "1")}


def test_a_sidecar_with_nvml_keeps_undeclared_gpus_and_loses_declared_ones() -> None:
    state = AggregatorState()
    state.hello("s", ["mine"])
    _gpu_series(state, "s", ["0", "1", "3"])
    _procs(state, "s", "0", [{"pid": 1, "rank": 0}])  # no PERFD_JOB: the agent's job
    _procs(state, "s", "1", [{"pid": 2, "rank": 0, "job": "theirs"}])  # declared elsewhere
    rows = job_gpus(state, "mine")  # GPU 3 has no process list yet: the agent's job too
    assert rows is not None and [r["gpu"] for r in rows["gpus"]] == ["0", "3"]


def test_exported_gpu_series_carry_the_placed_job() -> None:
    state = _state()
    got = {}
    for fam in _StateCollector(state, export_node_series=True).collect():
        if fam.name == "perfd_gpu_power_watts":
            # "" and absent are one in Prometheus (the family spans labelled and unlabelled rows)
            got = {s.labels["gpu"]: (s.labels.get("job_name") or None, s.labels["UUID"], s.labels["Hostname"])
                   for s in fam.samples}
    assert got == {"0": ("gpt", "GPU-0", NODE), "1": ("other", "GPU-1", NODE), "2": (None, "GPU-2", NODE)}
