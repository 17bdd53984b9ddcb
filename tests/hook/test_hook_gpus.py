"""Any process is a rank: a job without RANK (``python3 train.py``) placed on its GPU
by what its step hook says (its verified pid, the CUDA device UUID it sends), so that the aggregator's
placement, GPU hints and incidents work: a co-tenant on its GPU is named with its pid instead of "the
rank's GPU is unknown". The hook's side is real (a StepHook sending to a real HookCollector, its device
given as a UUID since this machine has no GPU); the process lists are NVML's as recorded, replayed."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any

from perfd.agent.hook_gpus import FROM_DEVICE, FROM_PID, HookGpus, HookRankInfo, attribute, hook_ranks
from perfd.aggregator.http import job_summary
from perfd.aggregator.state import AggregatorState
from perfd.analytics.incidents.evidence import Missing
from perfd.collectors.hook import HookCollector
from perfd.core import events
from perfd.core.model import Provenance, StepRecord, TimerValue
from perfd.hook import StepHook
from perfd.report.incident_text import missing_text

UUID = "GPU-8b7c1e2a-0d3f-4c55-9a1e-55aa66bb77cc"


def _procs(*entries: dict[str, Any]) -> list[dict[str, Any]]:
    base = {"name": "python3", "user": "alice", "cmdline": None, "used_memory_bytes": 10 << 30, "rank": None,
            "local_rank": None, "world_size": None, "job": None}
    return [{**base, **e} for e in entries]


def _event(gpu: str, uuid: str, procs: list[dict[str, Any]], t: float = 0.0) -> dict[str, Any]:
    return {"kind": events.GPU_PROCESSES.name, "severity": "info", "time": t, "text": "procs",
            "labels": {"node": "n1", "gpu": gpu, "uuid": uuid, "model": "NVIDIA H100 80GB HBM3"},
            "changed": True, "payload": procs}


def test_the_hooks_pid_or_device_places_its_rank() -> None:
    me = HookRankInfo(0, 4100, "8b7c1e2a-0d3f-4c55-9a1e-55aa66bb77cc")  # torch's spelling: no "GPU-"
    # NVML lists the process: it becomes rank 0 of the agent's job.
    procs = _procs({"pid": 4100}, {"pid": 5555, "name": "burn"})
    assert attribute(procs, UUID, [me], "j") == [(0, 4100, FROM_PID)]
    assert procs[0]["rank"] == 0 and procs[0]["job"] == "j" and procs[0]["rank_from"] == FROM_PID
    assert procs[1]["rank"] is None and "rank_from" not in procs[1]  # the co-tenant stays foreign
    # NVML does not list it (a container whose processes NVML cannot see): the UUID places it.
    procs = _procs({"pid": 5555})
    assert attribute(procs, UUID, [me], "j") == [(0, 4100, FROM_DEVICE)]
    assert procs[-1]["pid"] == 4100 and procs[-1]["rank"] == 0 and procs[-1]["used_memory_bytes"] is None
    # ... unless it is listed on another GPU of the node: placed there, never twice.
    procs = _procs({"pid": 5555})
    assert attribute(procs, UUID, [me], "j", frozenset({4100})) == []
    # Another GPU: nothing. A process with a RANK of its own, or another job's, is never relabelled.
    assert attribute(_procs({"pid": 77}), "GPU-0000", [me], "j") == []
    own = _procs({"pid": 4100, "rank": 3, "job": "j"})
    assert attribute(own, UUID, [me], "j") == [] and own[0]["rank"] == 3
    other = _procs({"pid": 4100, "job": "k"})
    assert attribute(other, UUID, [me], "j") == [] and other[0]["rank"] is None


def test_a_list_sent_before_the_hook_spoke_is_sent_again_attributed() -> None:
    """NVML's list goes out when its pids change (or every minute); the hook's device record may come
    later: the agent re-sends that GPU's list at once, attributed, and only when that changes."""
    g = HookGpus("j")
    batch = [_event("0", UUID, _procs({"pid": 4100}, {"pid": 5555}))]
    g.apply(batch, [], 1.0)
    assert len(batch) == 1 and batch[0]["payload"][0]["rank"] is None
    later: list[dict[str, Any]] = []
    g.apply(later, [HookRankInfo(0, 4100, None)], 2.0)
    (again,) = later
    assert again["time"] == 2.0 and again["payload"][0]["rank"] == 0 and "step hooks" in again["text"]
    more: list[dict[str, Any]] = []
    g.apply(more, [HookRankInfo(0, 4100, None)], 3.0)
    assert more == []  # unchanged: not sent again
    # NVML's next list is attributed as it goes.
    nxt = [_event("0", UUID, _procs({"pid": 4100}))]
    g.apply(nxt, [HookRankInfo(0, 4100, None)], 4.0)
    assert len(nxt) == 1 and nxt[0]["payload"][0]["rank"] == 0


def test_a_real_hook_without_rank_names_its_pid_and_device(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("RANK", raising=False)
    sock = str(tmp_path / "h.sock")
    c = HookCollector({"socket_path": sock, "job": "j"})
    c.start()
    try:
        hook = StepHook(sock, cuda=False, flush_interval_s=0, warmup_steps=0, device_uuid=UUID)
        for _ in range(3):
            with hook.step():
                hook.data_ready()
        hook.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (0 in c.ranks and c.ranks[0].device_uuid):
            c.collect(time.time())
            time.sleep(0.01)
    finally:
        c.stop()
    (info,) = hook_ranks(c.ranks)
    assert info == HookRankInfo(0, os.getpid(), UUID.lower().removeprefix("gpu-"))  # the kernel's pid
    batch = [_event("0", UUID, _procs({"pid": 5555}))]  # NVML lists only the co-tenant here
    HookGpus("j").apply(batch, [info], 1.0)
    assert [(p["pid"], p["rank"]) for p in batch[0]["payload"]] == [(5555, None), (os.getpid(), 0)]


def _hook_records(pid: int, n: int, slow: range) -> list[StepRecord]:
    """One rank's step records as collectors/hook makes them: 100 ms steps, 250 ms in ``slow``."""
    out, t = [], 1000.0
    for i in range(1, n + 1):
        ms = 250.0 if i in slow else 100.0
        t += ms / 1e3
        out.append(StepRecord(job="j", iteration=i, rank=0, end_time=t, step_time_ms=ms, interval=1,
                              fields={"timing": "host", "pid": str(pid)},
                              timers={"data-wait": TimerValue(5.0, 5.0, {0: 5.0}),
                                      "compute": TimerValue(ms - 5.0, ms - 5.0, {0: ms - 5.0})},
                              source=Provenance("hook", f"rank0:pid{pid}")))
    return out


def test_a_co_tenant_on_a_hook_jobs_gpu_is_named_with_its_pid() -> None:
    """The issue's second loop: a co-tenant running matmuls on the GPU of a job without RANK. Before:
    "not explained: the rank's GPU is unknown (no process on the job's nodes declares its RANK)"."""
    pid, burner = 4100, 5555
    nvml = _event("0", UUID, _procs({"pid": pid, "cmdline": "python3 train.py"},
                                    {"pid": burner, "name": "python3", "user": "bob",
                                     "cmdline": "python3 matmul.py"}))
    placed = [copy.deepcopy(nvml)]
    HookGpus("j").apply(placed, [HookRankInfo(0, pid, UUID)], 1.0)
    for batch in ([copy.deepcopy(nvml)], placed):
        st = AggregatorState(min_recompute_s=0.0)
        st.hello("agent-a", ["j"])
        st.ingest_events("agent-a", batch)
        st.ingest_steps("agent-a", _hook_records(pid, 300, range(150, 200)))
        st.analysis("j", force=True)
        incs = st.incidents.incidents("j")
        assert incs, "the slow stretch is an incident"
        inc = max(incs, key=lambda i: i.get("cost_s") or 0.0)
        s = job_summary(st, "j")
        assert s is not None
        if batch is placed:
            assert [(r["rank"], r["pid"], r["gpu"]) for r in s["ranks"]] == [(0, pid, "0")]
            assert [p["pid"] for p in s["ranks"][0]["other_processes"]] == [burner]
            assert f"pid {burner}" in inc["cause"] and "matmul.py" in inc["cause"], inc["cause"]
            assert Missing.RANK_PLACEMENT.value not in inc["verdict"]["missing"]
        else:  # NVML's list alone: what the issue saw
            assert s["ranks"] == []
            assert Missing.RANK_PLACEMENT.value in inc["verdict"]["missing"]
            assert missing_text(Missing.RANK_PLACEMENT).startswith("the rank's GPU is unknown")
