"""The host ran slower: an incident whose every host-timed part of the step grew alike on a job whose GPU
waits on its host (perfd.analytics.incidents.host_paced), on the recorded journal of transformers'
run_clm.py on an H200 (eager Llama, host-bound) and on synthetic steps."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from perfd.analytics.incidents.detect import detect_incidents
from perfd.analytics.incidents.evidence import Evidence, EvidenceKind, decide
from perfd.analytics.incidents.host_paced import HostParts, host_slower
from tests.journal_replay import Replayed, replay, unpack

GPU_CHECK = "Check rank 0: its GPU"


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Replayed:
    return replay(unpack("hf_clm_h200", tmp_path_factory.mktemp("loops")), "hf")


def test_the_recorded_host_slowdown_is_the_hosts_not_rank_0s_gpu(hf: Replayed) -> None:
    """Before: inc-239 "not explained", its action "Check rank 0: its GPU (clocks, ...)"; the data wait,
    the time outside the step and the rest of the step all grew ~1.25-1.35×."""
    live = [i for i in hf.summary["incidents"] if 235 <= i["first_iteration"] <= 275]
    assert live and all(i["verdict"]["cause"] == "host_slower" for i in live)
    factors = live[0]["verdict"]["lead"]["detail"]["factors"]
    assert set(factors) == {"data_wait", "outside", "in_step"}
    assert all(1.1 < f < 1.5 for f in factors.values())
    recs = {r["finding_id"]: r["action"] for r in hf.summary["report"]["recommendations"]}
    for i in live:
        action = recs[f"incident-{i['id']}"]
        assert GPU_CHECK not in action and "host" in action and "CPU" in action
    offline = [i for i in hf.analysis.incidents if 235 <= i.first_iteration <= 275]
    assert offline
    assert all(i.verdict is not None and i.verdict.cause is EvidenceKind.HOST_SLOWER for i in offline)
    # perfd's capture's aftermath keeps its own, more specific cause
    after = next(i for i in hf.summary["incidents"] if i["id"] == "inc-136")
    assert after["verdict"]["cause"] == "after_capture"


@dataclass
class It:
    iteration: int
    step_time_ms: float | None
    data_share: float | None
    outside_share: float | None
    comm_exposed_share: float | None = None
    straggler_candidate_ranks: list[int] = field(default_factory=list)
    straggler_rank_compute_ratio: dict[int, float] = field(default_factory=dict)
    straggler_rtt_ratio: float | None = None
    straggler_rtt_max_rank: int | None = None
    straggler_between_stages: bool = False


def _steps(data: float, outside: float, rest: float, slow: tuple[float, float, float]) -> list[It]:
    """100 steady steps of (data, outside, rest) ms, 30 slow ones of ``slow``, 70 steady again."""
    out = []
    for i in range(200):
        d, o, r = slow if 100 <= i < 130 else (data, outside, rest)
        s = d + o + r
        out.append(It(i, s, d / s, o / s))
    return out


def _detected(its: list[It], host_bound: bool = True) -> list[EvidenceKind | None]:
    ends = {it.iteration: 1000.0 + it.iteration * 0.3 for it in its}
    found = detect_incidents(its, ends, {}, 0, None, world_size=1, host_bound=host_bound)
    return [i.verdict.cause if i.verdict is not None else None for i in found.incidents]


def test_every_host_part_grown_alike_on_a_host_bound_job_is_the_host() -> None:
    its = _steps(20.0, 1.5, 270.0, (26.0, 1.95, 351.0))  # each part 1.3×
    assert _detected(its) == [EvidenceKind.HOST_SLOWER]
    assert _detected(its, host_bound=False) == [None]  # no evidence that the GPU waits on the host


def test_only_the_gpu_side_time_grown_keeps_the_old_verdict() -> None:
    its = _steps(20.0, 1.5, 270.0, (20.0, 1.5, 351.0))  # the step's rest 1.3×, the host's parts as they were
    assert _detected(its) == [None]


def test_one_host_part_that_kept_its_level_is_no_host_slowdown() -> None:
    steady = HostParts(20.0, 1.5, 270.0)
    grown = _steps(20.0, 1.5, 270.0, (26.0, 1.5, 351.0))[100:130]  # the time outside the step kept its level
    assert host_slower(steady, grown, 0, None, None) is None
    alike = _steps(20.0, 1.5, 270.0, (25.0, 1.9, 340.0))[100:130]
    e = host_slower(steady, alike, 0, None, None)
    assert e is not None and e.kind is EvidenceKind.HOST_SLOWER and e.worst == pytest.approx(366.9 / 291.5)


def test_the_hosts_slowdown_leads_what_the_gpu_shows_of_itself() -> None:
    """The GPU waits on the host: its power cap is listed, never the cause; the host's own evidence (other
    processes on the rank's CPUs) outranks the proportional growth."""
    host = Evidence(EvidenceKind.HOST_SLOWER, 0, "", 1.3)
    cap = Evidence(EvidenceKind.POWER_CAP, 0, "", 650.0)
    assert decide([cap, host], [0]).cause is EvidenceKind.HOST_SLOWER
    busy = Evidence(EvidenceKind.CPU_CONTENTION, 0, "", 0.6)
    assert decide([host, busy], [0]).cause is EvidenceKind.CPU_CONTENTION
