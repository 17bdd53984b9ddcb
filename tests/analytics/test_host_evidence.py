"""Host evidence of a rank process (perfd.analytics.incidents.host_evidence), its place in the causal order
(perfd.analytics.incidents.evidence), its sentences (perfd.report.incident_text) and the live stall check
(perfd.analytics.stall). The observations are collectors/ranks payloads recorded on real processes
(tests/data/host/record_obs.py); variations of them test each threshold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics import thresholds as th
from perfd.analytics.incidents.evidence import KIND_SPECS, Evidence, EvidenceKind, StallReason, Tier, decide
from perfd.analytics.incidents.host_evidence import foreign_others, host_items, oom_evidence
from perfd.analytics.incidents.stall import RankSeen, StallInputs, Status, check_stall, stall_limit
from perfd.core import shared_thresholds as shared
from perfd.report.incident_findings import action_text
from perfd.report.incident_text import cause_text, cpus_text, sentence

K = EvidenceKind
DATA = Path(__file__).resolve().parents[1] / "data" / "host" / "rank_observations.json"
REC = json.loads(DATA.read_text())


def obs(which: str, **over: Any) -> dict[str, Any]:
    return {**REC[which]["ranks"][0], **over}


def kinds(items: list[Evidence]) -> list[EvidenceKind]:
    return [e.kind for e in items]


def test_recorded_contention_names_the_burners_and_the_wait() -> None:
    o = obs("contention")
    (e,) = host_items(0, o, "node-a")
    assert e.kind is K.CPU_CONTENTION and e.rank == 0 and e.worst == o["wait_ratio"]
    assert {x["pid"] for x in e.detail["others"]} == set(REC["burners"])
    assert e.detail["allowed_cpus"] == o["allowed_cpus"] and e.detail["node"] == "node-a"
    text = sentence(e)
    cpu = o["allowed_cpus"][0]
    pids = ", ".join(str(x["pid"]) for x in e.detail["others"])
    assert text.startswith(f"4 other process(es) (pids {pids}")
    assert f"took {o['others_ratio']:.0%} of rank 0's CPU {cpu}" in text
    assert f"the rank waited for a CPU {o['wait_ratio']:.0%} of the time" in text
    assert "`/work/" in text and "sched_setaffinity" in text  # the burners' command line


def test_recorded_calm_stopped_and_gone() -> None:
    # Alone on its CPU the rank waited a little (a loaded machine: wait > 0 while others took ~0): no
    # contention is named without processes that took its CPU.
    calm = obs("calm")
    assert calm["others_ratio"] < shared.CPU_OTHERS_SHARE.value
    assert K.CPU_CONTENTION not in kinds(host_items(0, calm))
    (s,) = host_items(0, obs("stopped"))
    stopped = obs("stopped")
    assert s.kind is K.PROCESS_STOPPED and s.spec.tier is Tier.PROCESS
    assert s.first_seen == stopped["state_since"] and s.worst == pytest.approx(
        stopped["observed_at"] - stopped["state_since"])
    assert "was stopped (state T" in sentence(s) and f"pid {REC['rank_pid']}" in sentence(s)
    (g,) = host_items(0, obs("gone"))
    assert g.kind is K.PROCESS_GONE and "gone (it exited)" in sentence(g)
    assert "zombie" in sentence(host_items(0, obs("gone", state="zombie"))[0])


def test_each_threshold() -> None:
    base = obs("contention")
    # Contention needs both the wait and the others' share, and named foreign processes.
    assert not host_items(0, {**base, "wait_ratio": shared.CPU_WAIT_CONTENTION.value - 0.01})
    assert not host_items(0, {**base, "others_ratio": shared.CPU_OTHERS_SHARE.value - 0.01})
    own = [{**x, "own": True} for x in base["others"]]
    assert not host_items(0, {**base, "others": own})  # the job's own workers are no foreign cause
    assert foreign_others({**base, "others": own}) == []
    calm = obs("calm", wait_ratio=0.0, others=[], others_ratio=None)
    (t,) = host_items(0, {**calm, "throttled_ratio": 0.5, "cpu_quota_cores": 0.5})
    assert t.kind is K.CPU_THROTTLED and "hit its CPU quota of 0.5 CPU: throttled in 50%" in sentence(t)
    assert not host_items(0, {**calm, "throttled_ratio": shared.CPU_THROTTLED_SHARE.value - 0.01})
    (m,) = host_items(0, {**calm, "pressure": {"memory": 0.2, "io": 0.0}, "pressure_source": "cgroup"})
    assert m.kind is K.MEMORY_PRESSURE and "cgroup's tasks stalled on memory 20%" in sentence(m)
    (m2,) = host_items(0, calm, swap_in_bytes_per_s=shared.SWAP_IN_BYTES_PER_S.value * 4)
    assert m2.kind is K.MEMORY_PRESSURE and "swapping in 4.0 MiB/s" in sentence(m2)
    (io,) = host_items(0, {**calm, "state": "disk_sleep"})
    assert io.kind is K.IO_BLOCKED and "in disk sleep (state D)" in sentence(io)
    (io2,) = host_items(0, {**calm, "pressure": {"io": 0.5}, "pressure_source": "node"})
    assert io2.kind is K.IO_BLOCKED and "the node's tasks stalled on I/O 50%" in sentence(io2)


def test_oom_kills_count_from_the_incidents_open_or_the_ranks_end() -> None:
    gone = obs("gone", oom_kills=3, oom_kills_since_follow=1, cgroup="/kubepods/pod1")
    assert oom_evidence(0, 3, obs("calm", oom_kills=3, oom_kills_since_follow=1)) is None  # an old kill
    e = oom_evidence(0, 3, gone)  # none since the incident opened, but the rank died of one
    assert e is not None and e.kind is K.OOM_KILL and e.worst == 1.0
    e2 = oom_evidence(0, 1, obs("calm", oom_kills=3))
    assert e2 is not None and e2.worst == 2.0 and "killed 2 process(es) in rank 0's cgroup" in sentence(e2)
    assert oom_evidence(0, None, obs("calm")) is None


def test_the_causal_order_of_host_evidence() -> None:
    t = 100.0
    stopped = Evidence(K.PROCESS_STOPPED, 0, "", 20.0, t, t + 20, 3, {"pid": 7})
    data = Evidence(K.DATA_WAIT, 0, "", 0.99, t, t, 1, {"steady": 0.02})
    foreign_gpu = Evidence(K.FOREIGN_PROCESS, 0, "55", 1e9, t, t, 1, {"pid": 55})
    cont = host_items(0, obs("contention"))[0]
    capture = Evidence(K.CAPTURE_FINDING, 0, "c1", 2.0, t, t, 1, {"capture": "c1"})
    throttled = Evidence(K.CPU_THROTTLED, 0, "", 0.9, t, t, 1, {})
    ratio = Evidence(K.RANK_COMPUTE_RATIO, 0, "", 3.0, t, t, 1)
    # A stopped process leads everything, a data wait it caused included (the H100 run's wrong cause).
    v = decide([data, foreign_gpu, stopped], [0])
    assert v.cause is K.PROCESS_STOPPED and v.lead is stopped
    # Contention sits with a foreign process, above the own-work tier where a capture's finding is.
    assert cont.spec.tier is Tier.FOREIGN_PROCESS is foreign_gpu.spec.tier
    assert decide([capture, data, cont, ratio], [0]).cause is K.CPU_CONTENTION
    assert ratio in decide([capture, cont, ratio], [0]).effects  # the slow compute is its effect
    # A CPU quota before contention (its throttled time reads as run-queue wait).
    assert decide([cont, throttled], [0]).cause is K.CPU_THROTTLED
    # A foreign process on the GPU comes first within the tier.
    assert decide([cont, foreign_gpu], [0]).cause is K.FOREIGN_PROCESS


def test_a_stall_is_led_only_by_what_halts_a_rank() -> None:
    # A stall (no step at all) on a loaded machine: the rank waited for a CPU 80% of the time, which
    # slows it but does not stop it; the stall's own reasons (a pending collective) say what holds it.
    t = 100.0
    cont = host_items(0, obs("contention"))[0]
    stopped = Evidence(K.PROCESS_STOPPED, 1, "", 20.0, t, t + 20, 3, {"pid": 7})
    v = decide([cont], [0, 1], stalled=True)
    assert v.cause is None and v.lead is None and v.also == (cont,)
    assert decide([cont], [0, 1]).cause is K.CPU_CONTENTION  # slow steps: contention leads
    # A stopped rank leads a stall, whichever rank the data names first; contention stays beside it.
    v = decide([cont, stopped], [0, 1], stalled=True)
    assert v.cause is K.PROCESS_STOPPED and v.rank == 1 and cont in v.also
    assert {k for k, spec in KIND_SPECS.items() if spec.halts} == {
        K.PROCESS_STOPPED, K.PROCESS_GONE, K.OOM_KILL, K.XID, K.IO_BLOCKED}


def test_contention_in_steady_state_too_explains_only_when_worse_by_the_margin() -> None:
    cont = host_items(0, obs("contention"))[0]  # waited ~80%

    def seen(level: float) -> Evidence:
        return Evidence(cont.kind, 0, "", cont.worst, 1.0, 1.0, 1,
                        {**cont.detail, "in_steady_state": 0.9, "steady_worst": level})

    assert decide([seen(0.5)], [0]).cause is K.CPU_CONTENTION  # 80% against 50%: it got worse
    assert decide([seen((cont.worst or 0) - th.STEADY_MARGIN.value / 2)], [0]).cause is None  # as always
    gpu = Evidence(K.POWER_CAP, 0, "", 700.0, 1.0, 1.0, 1, {"in_steady_state": 0.9, "steady_worst": 1.0})
    assert decide([gpu], [0]).cause is None  # a GPU kind is present or not: no margin
    assert "(50% in steady state)" in sentence(seen(0.5))


def test_actions_and_cause_lines() -> None:
    cont = host_items(0, obs("contention"))[0]
    v = decide([cont], [0])
    cpu = obs("contention")["allowed_cpus"][0]
    act = action_text(v)
    assert act.startswith(f"Keep other processes off rank 0's CPU {cpu} (pid ")
    stopped = host_items(0, obs("stopped"))[0]
    first = f"Find what stopped rank 0's process (pid {REC['rank_pid']})"
    assert action_text(decide([stopped], [0])).startswith(first)
    line = cause_text(decide([stopped], [0]), "steps 72× the steady median", single_rank=True)
    assert line.startswith("rank 0's process") and "was stopped" in line and line.endswith("steady median")
    assert cpus_text([2, 3]) == "CPUs 2–3" and cpus_text([0, 2, 3, 5]) == "CPUs 0, 2–3, 5"
    assert cpus_text([4]) == "CPU 4" and cpus_text([]) == "its CPUs"


def seen(rank: int, state: str, cpu: float | None = 1.0, gpu: float | None = None) -> RankSeen:
    return RankSeen(rank, state, cpu, gpu, 100 + rank, "n1")


def test_stall_check() -> None:
    now = 1000.0
    cadence = 0.5  # a record every 0.5 s: the limit is the floor, 5 s
    assert stall_limit(cadence) == shared.STALL_FLOOR_S.value
    assert stall_limit(10.0) == 10.0 * shared.STALL_CADENCE_FACTOR.value  # a log interval's cadence

    def check(silent: float, ranks: list[RankSeen], **kw: Any) -> Any:
        return check_stall(StallInputs(now, now - silent, cadence, ranks, **kw))

    assert check(4.0, [seen(0, "stopped")]).status is Status.RUNNING  # within the limit
    # The limit is the silence after which a job stalls: at it, still running; just past it, stalled.
    limit = stall_limit(cadence)
    assert check(limit, [seen(0, "stopped")]).status is Status.RUNNING
    assert check(limit + 0.01, [seen(0, "stopped")]).status is Status.STALLED
    assert check_stall(StallInputs(now, None, None)).status is Status.RUNNING  # no cadence yet
    quiet = check(6.0, [seen(0, "running", 1.0)])
    assert quiet.status is Status.SILENT and quiet.reasons == ()  # busy, nothing corroborates
    st = check(6.0, [seen(0, "running", 1.0), seen(1, "stopped", 0.0)])
    assert st.status is Status.STALLED and st.reasons == (StallReason.STOPPED,) and st.stuck_ranks == (1, 0)
    idle = check(6.0, [seen(0, "sleeping", 0.0), seen(1, "sleeping", 0.01)])
    assert idle.status is Status.STALLED and idle.reasons == (StallReason.IDLE,)
    busy_gpu = check(6.0, [seen(0, "sleeping", 0.0, gpu=1.0)])  # a kernel still resident: not idle
    assert busy_gpu.status is Status.SILENT
    assert check(6.0, [seen(0, "running", 1.0)], pending_collective=True).reasons == (
        StallReason.PENDING_COLLECTIVE,)
    assert check(6.0, [seen(0, "disk_sleep", 0.0)]).reasons[0] is StallReason.IO_BLOCKED
    assert check(6.0, [seen(0, "gone", None), seen(1, "zombie", None)]).status is Status.ENDED
    # An announced save holds it back — unless a rank is stopped or gone; and not for ever.
    save = ("checkpoint", now - 30)
    assert check(60.0, [seen(0, "sleeping", 0.0)], phase=save).status is Status.HELD
    assert check(60.0, [seen(0, "stopped", 0.0)], phase=save).status is Status.STALLED
    # After an announced pause the silence counts from its end: the steps come seconds after it.
    sleeping = [seen(0, "sleeping", 0.0)]
    ended = check_stall(StallInputs(now, now - 60.0, cadence, sleeping, phase_ended_at=now - 2))
    assert ended.status is Status.RUNNING and ended.silent_s == 2.0
    assert check_stall(StallInputs(now, now - 60.0, cadence, sleeping,
                                   phase_ended_at=now - 6)).status is Status.STALLED
    cap = shared.STALL_PHASE_MAX_S.value
    old = ("checkpoint", now - cap - 1)
    assert check(cap + 1, [seen(0, "sleeping", 0.0)], phase=old).status is Status.STALLED
    # Announcements hold a stall for at most the cap after the last record, whatever they say: a save
    # announced again just now (its begin new), or pulses of begin and end, do not.
    assert check(cap + 1, sleeping, phase=("checkpoint", now - 1)).status is Status.STALLED
    pulsed = check_stall(StallInputs(now, now - cap - 10, cadence, sleeping, phase_ended_at=now - 1))
    assert pulsed.status is Status.STALLED and pulsed.silent_s == 10.0  # counted from the cap, not the pulse
    # A stopped rank is the kernel's word: a pause that ended a second ago does not restart its silence.
    stopped_now = check_stall(StallInputs(now, now - 60.0, cadence, [seen(0, "stopped", 0.0)],
                                          phase_ended_at=now - 1))
    assert stopped_now.status is Status.STALLED and stopped_now.silent_s == 60.0
    # The cap is the aggregator's to shorten (--stall-phase-max-s): the same 60 s silence under a save.
    assert check(60.0, sleeping, phase=save, phase_max_s=30.0).status is Status.STALLED
    doc = st.to_json()
    assert doc["status"] == "stalled" and doc["reasons"] == ["stopped"]
    assert doc["ranks"]["1"]["state"] == "stopped"
