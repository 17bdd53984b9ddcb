"""DataLoader workers are the job's own children: the ranks collector counts the
CPU of a rank process's descendants as the job's (``children_cpu_cores``, never "other processes on
its CPUs"), the host evidence says typed whether the rank's CPUs are full or have room
(:class:`~perfd.analytics.incidents.host_evidence.CpuUse`), and the data-loading remedy follows: "more
data-loader workers" only with room, "cheaper transforms or more CPUs" when full. A real parent
python with multiprocessing children burning CPU for the collector; replayed observations for the
decision's other branches (room on a big node, a cgroup quota)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from perfd.aggregator.http import job_summary
from perfd.aggregator.state import AggregatorState
from perfd.analytics.incidents.attribution import GpuSeen
from perfd.analytics.incidents.detect import Incident
from perfd.analytics.incidents.evidence import Evidence, EvidenceKind, decide
from perfd.analytics.incidents.host_evidence import CpuRoom, cpu_use, host_items, job_cpu_use
from perfd.analytics.incidents.incident_evidence import IncidentEvidence, RankSnapshot
from perfd.analytics.run.run_analysis import analyze_run
from perfd.collectors.ranks import RanksCollector, procfs
from perfd.core import events
from perfd.core.model import JobInfo, Provenance, StepRecord, TimerValue
from perfd.report.data_text import DATA_CPU_BOUND_ACTION, DATA_LOADING_ACTION, DATA_MORE_WORKERS_ACTION
from perfd.report.incident_findings import incident_findings
from perfd.report.training_report import build_report

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

# A "rank" without RANK (python3 train.py): the loop waits on its data while two DataLoader-like
# workers (multiprocessing children) burn CPU decoding samples, all on one CPU.
TRAIN = """
import multiprocessing as mp, os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})

def worker():
    while True:
        pass

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    kids = [ctx.Process(target=worker, daemon=True) for _ in range(2)]
    for k in kids:
        k.start()
    print("ready", flush=True)
    while True:
        time.sleep(0.05)  # the training loop, waiting for batches
"""


@pytest.fixture
def loader_job() -> Iterator[subprocess.Popen[str]]:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    p = subprocess.Popen([sys.executable, "-c", TRAIN, str(cpu)], env=env, stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield p
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


def test_a_ranks_workers_cpu_is_the_jobs_and_its_full_cpus_call_for_cheaper_transforms(
        loader_job: subprocess.Popen[str]) -> None:
    c = RanksCollector({"job": "j", "event_every_s": 0})
    c.note(loader_job.pid, 0, "hook", uid=os.getuid())  # the hook's verified pid: no RANK needed
    row: dict[str, Any] = {}
    for _ in range(20):  # a loaded machine may starve the workers for a window: read until they ran
        c.collect(time.time())
        time.sleep(0.7)
        out = c.collect(time.time())
        ev = next(e for e in out.events if e["kind"] == events.RANK_PROCESSES.name)
        row = ev["payload"]["ranks"][0]
        if (row.get("children_cpu_cores") or 0.0) > 0.3:
            break
    assert row["pid"] == loader_job.pid and row["children"] == 2
    # The workers burn the CPU; the rank itself waits for its batches.
    assert row["children_cpu_cores"] > 0.3 and row["children_cpu_cores"] > 5 * row["cpu_cores"]
    assert row["allowed_busy_ratio"] > 0.9 and len(row["allowed_cpus"]) == 1
    assert any(s.name == "perfd_host_rank_children_cpu_cores" and s.value > 0.3 for s in out.samples)
    # Whatever ran besides, the workers are never "other processes" contending with the rank: named
    # (when the rank waited and a scan ran) as the job's own, never in contention evidence.
    kids = set(procfs.descendants(loader_job.pid, 16) or [])
    assert len(kids) == 2
    assert all(o["own"] for o in row.get("others") or [] if o["pid"] in kids)
    for e in host_items(0, row):
        assert not kids & {o.get("pid") for o in e.detail.get("others", [])}
    use = cpu_use(0, row)
    assert use is not None and use.room is CpuRoom.FULL and use.children == 2


def _obs(**kw: Any) -> dict[str, Any]:
    return {"rank": 0, "pid": 4100, "state": "sleeping", "cpu_cores": 0.4, "children": 2,
            "children_cpu_cores": 1.8, "allowed_cpus": list(range(8)), "allowed_busy_ratio": 0.3, **kw}


def test_room_or_full_is_decided_on_the_ranks_cpus_and_quota() -> None:
    room = cpu_use(0, _obs())
    assert room is not None and room.room is CpuRoom.ROOM and room.cpus == 8
    assert cpu_use(0, _obs(allowed_busy_ratio=0.95)).room is CpuRoom.FULL  # type: ignore[union-attr]
    # A cgroup quota of 2 cores used by the rank and its workers: full though the node idles.
    assert cpu_use(0, _obs(cpu_quota_cores=2.0)).room is CpuRoom.FULL  # type: ignore[union-attr]
    assert cpu_use(0, _obs(cpu_quota_cores=8.0)).room is CpuRoom.ROOM  # type: ignore[union-attr]
    assert cpu_use(0, _obs(throttled_ratio=0.3)).room is CpuRoom.FULL  # type: ignore[union-attr]
    assert cpu_use(0, {"rank": 0, "pid": 1, "state": "running"}) is None  # says nothing: unknown
    # The job's: a rank whose CPUs are full decides (its loader cannot get more CPU).
    got = job_cpu_use({0: _obs(), 1: _obs(rank=1, allowed_busy_ratio=0.97)})
    assert got is not None and got.rank == 1 and got.room is CpuRoom.FULL


def _data_bound(pid: int = 4100) -> list[StepRecord]:
    """A hook job waiting on data 40% of each step (the share the remedy is about)."""
    return [StepRecord("j", i, rank=0, end_time=1000.0 + 0.1 * i, step_time_ms=100.0, interval=1,
                       fields={"timing": "host", "pid": str(pid)},
                       timers={"data-wait": TimerValue(40.0, 40.0, {0: 40.0}),
                               "compute": TimerValue(60.0, 60.0, {0: 60.0})},
                       source=Provenance("hook", f"rank0:pid{pid}")) for i in range(1, 121)]


def test_the_runs_data_loading_remedy_fits_the_ranks_cpus() -> None:
    a = analyze_run(JobInfo(framework="pytorch"), _data_bound())

    def rec(cpu: Any) -> Any:
        recs = build_report(a, None, cpu=cpu).recommendations
        return next(r for r in recs if r.finding_id == "data-loading")

    assert rec(None).action == DATA_LOADING_ACTION  # nothing known of the CPUs: the general action
    with_room = rec(cpu_use(0, _obs()))
    assert with_room.action == DATA_MORE_WORKERS_ACTION
    assert "8 CPU(s) 30% busy" in with_room.detail and "2 child process(es)" in with_room.detail
    full = rec(cpu_use(0, _obs(cpu_quota_cores=2.0)))
    assert full.action == DATA_CPU_BOUND_ACTION and "(full)" in full.detail
    assert "more data-loader workers would only share them" in full.action


def test_a_data_wait_incident_takes_the_cpu_use_of_its_time() -> None:
    lead = Evidence(EvidenceKind.DATA_WAIT, 0, "", 0.8, 1.0, 2.0, 10, {"steady": 0.3, "grew_ms": 50.0,
                                                                      "excess_ms": 60.0})
    snap = RankSnapshot(0, None, None, True, GpuSeen.NO_GPU, {}, (), {}, (), 0.0,
                        host=_obs(allowed_busy_ratio=0.97))
    inc = Incident(id="i1", first_iteration=10, last_iteration=20, kinds=["slow"], ranks=[0], n_iterations=0,
                   cost_s=12.0, steady_step_ms=None, median_step_ms=None, max_step_ms=None, cause="data",
                   evidence=IncidentEvidence(gpu={0: snap}), verdict=decide([lead], [0]))
    _, (r,) = incident_findings([inc], 100.0, cpu_use(0, _obs()))
    assert r.action == DATA_CPU_BOUND_ACTION and "97% busy" in r.detail  # its own snapshot wins
    bare = dataclasses.replace(inc, evidence=IncidentEvidence())
    _, (r,) = incident_findings([bare], 100.0, cpu_use(0, _obs()))
    assert r.action == DATA_MORE_WORKERS_ACTION  # none of its own: the job's now
    _, (r,) = incident_findings([bare], 100.0)
    assert r.action == DATA_LOADING_ACTION


def test_the_aggregator_report_says_more_workers_only_with_room() -> None:
    for obs, want in ((_obs(), DATA_MORE_WORKERS_ACTION),
                      (_obs(allowed_busy_ratio=0.99), DATA_CPU_BOUND_ACTION)):
        st = AggregatorState(min_recompute_s=0.0)
        st.hello("agent-a", ["j"])
        st.ingest_steps("agent-a", _data_bound())
        payload = {"job": "j", "interval_s": 1.0, "ranks": [obs], "node": {}}
        st.ingest_events("agent-a", [{"kind": events.RANK_PROCESSES.name, "time": time.time(), "job": "j",
                                      "labels": {"job": "j", "node": "n1"}, "payload": payload}])
        st.analysis("j", force=True)
        s = job_summary(st, "j")
        assert s is not None
        actions = [r["action"] for r in s["report"]["recommendations"]]
        assert want in actions and DATA_LOADING_ACTION not in actions, actions


def test_a_finished_jobs_report_keeps_the_cpus_it_ran_with() -> None:
    """On the H100 the run-level R1 of a finished data-bound job fell back to the general action: the
    agents' last report had the rank gone, and older ones were stale; then, in a later run, it read "its 0
    child process(es)", once "CPUs are full": the observation taken after its last step. The last
    observation a step came after (taken while it stepped) is the one kept, and said as such."""
    st = AggregatorState(min_recompute_s=0.0)
    st.hello("agent-a", ["j"])
    st.ingest_steps("agent-a", _data_bound())

    def report(obs: dict[str, Any]) -> None:
        payload = {"job": "j", "interval_s": 1.0, "ranks": [obs], "node": {}}
        st.ingest_events("agent-a", [{"kind": events.RANK_PROCESSES.name, "time": time.time(), "job": "j",
                                      "labels": {"job": "j", "node": "n1"}, "payload": payload}])

    steps = _data_bound()
    st.ingest_steps("agent-a", steps[:-5])
    report(_obs(observed_at=1_795_000_000.0))  # while it steps: its two workers, CPUs with room
    st.ingest_steps("agent-a", steps[-5:])
    # Its teardown after the last step (the workers gone, the CPUs busy with the exit), then its exit.
    report(_obs(children=0, children_cpu_cores=0.0, allowed_busy_ratio=0.97, observed_at=1_795_000_009.0))
    report({"rank": 0, "pid": 4100, "state": "gone"})
    st.analysis("j", force=True)
    s = job_summary(st, "j")
    assert s is not None
    (r,) = [r for r in s["report"]["recommendations"] if r["finding_id"] == "data-loading"]
    assert r["action"] == DATA_MORE_WORKERS_ACTION and "2 child process(es)" in r["detail"]
    assert "0 child process(es)" not in r["detail"] and "(room left)" in r["detail"]
    assert "observed at 2026-11-18 11:06:40 UTC, while running" in r["detail"]  # said when
