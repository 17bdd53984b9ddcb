from typing import Any

from perfd.analytics.incidents.attribution import (
    GpuSeen,
    RankPlacement,
    foreign_processes,
    gpu_hints,
    gpu_seen,
    place_ranks,
)
from perfd.analytics.incidents.evidence import EvidenceKind as K
from perfd.report.incident_text import gpu_observations, seen_text

PROCS: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("node-a", "0"): [{"pid": 10, "rank": 0, "local_rank": 0, "world_size": 4, "cmdline": "python train.py"}],
    ("node-a", "1"): [{"pid": 11, "rank": 1, "local_rank": 1, "world_size": 4, "cmdline": "python train.py"},
                      {"pid": 99, "rank": None, "name": "python", "cmdline": "python notebook.py"}],
    ("node-b", "0"): [{"pid": 20, "rank": 2, "local_rank": 0, "world_size": 4, "cmdline": "python train.py"},
                      {"pid": 30, "rank": 0, "world_size": 8, "cmdline": "python other_job.py"}],
    ("node-b", "1"): [{"pid": 21, "rank": 3, "local_rank": 1, "world_size": 4, "cmdline": "python train.py"}],
}
VALUES = {
    ("node-a", "0"): {"perfd_gpu_sm_clock_hertz": 1.98e9, "perfd_gpu_temperature_celsius": 50},
    ("node-a", "1"): {"perfd_gpu_sm_clock_hertz": 1.98e9, "perfd_gpu_temperature_celsius": 51},
    ("node-b", "0"): {"perfd_gpu_sm_clock_hertz": 1.98e9, "perfd_gpu_temperature_celsius": 52},
    ("node-b", "1"): {"perfd_gpu_sm_clock_hertz": 1.35e9, "perfd_gpu_temperature_celsius": 78},
}


def test_ranks_are_placed_from_declared_ranks_only_and_other_jobs_are_ignored():
    pl = place_ranks(PROCS, world_size=4)
    assert {r: (p.node, p.gpu) for r, p in pl.items()} == {
        0: ("node-a", "0"), 1: ("node-a", "1"), 2: ("node-b", "0"), 3: ("node-b", "1")}
    assert pl[0].pid == 10  # the other job's rank 0 (world size 8) did not overwrite it


def test_hints_name_the_throttled_gpu_and_the_co_tenant():
    pl = place_ranks(PROCS, world_size=4)
    throttles = {("node-b", "1"): ["hw_thermal", "gpu_idle"]}
    hints = {h.rank: h for h in gpu_hints([3, 1, 0, 7], pl, VALUES, throttles, PROCS)}
    h3 = hints[3]
    assert (h3.node, h3.gpu) == ("node-b", "1")
    # Typed: a hardware slowdown outranks the clock drop and heat it brings (causal order).
    assert [e.kind for e in h3.items] == [K.HW_SLOWDOWN, K.THERMAL, K.CLOCK_DROP]
    by = {e.kind: e for e in h3.items}
    assert by[K.CLOCK_DROP].worst == 1.35e9 and by[K.THERMAL].worst == 78
    assert by[K.HW_SLOWDOWN].detail["reasons"] == ["hw_thermal"]  # gpu_idle is no slowdown
    text = " ".join(gpu_observations(h3))
    assert "SM clock 1350 MHz" in text and "hw_thermal" in text and "gpu_idle" not in text
    assert "78 C against the job's median" in text
    h1 = hints[1]
    (fp,) = h1.items
    assert fp.kind is K.FOREIGN_PROCESS and fp.key == "99" and fp.detail["cmdline"] == "python notebook.py"
    assert "pid 99 (python notebook.py" in " ".join(gpu_observations(h1))
    assert hints[0].items == [] and "looks like the others" in gpu_observations(hints[0])[0]
    assert hints[7].node is None and not hints[7].placed and "unknown" in gpu_observations(hints[7])[0]
    # what each hint's observations are, as a code (their sentences are made where shown)
    assert [gpu_seen(h.placed, h.items) for h in (h3, h1, hints[0], hints[7])] == [
        GpuSeen.ITEMS, GpuSeen.ITEMS, GpuSeen.LIKE_OTHERS, GpuSeen.UNPLACED]
    assert gpu_seen(False, [], cpu_only=True) is GpuSeen.NO_GPU and seen_text(GpuSeen.NO_GPU, h3.items) == []


def test_foreign_processes_excludes_the_jobs_own_ranks():
    pl = RankPlacement(2, "node-b", "0", 20)
    others = foreign_processes(pl, PROCS[("node-b", "0")], [10, 11, 20, 21])
    assert [p["pid"] for p in others] == [30]


def test_a_rank_of_another_job_on_a_shared_gpu_stays_a_foreign_process():
    procs = {("n", "0"): [{"pid": 10, "rank": 0, "job": "mine", "cmdline": "python train.py"},
                          {"pid": 20, "rank": 0, "job": "theirs", "cmdline": "python other.py"}]}
    pl = place_ranks(procs, job="mine")
    assert pl[0].pid == 10  # the other job's rank 0 does not take this job's rank 0
    (h,) = gpu_hints([0], pl, {}, {}, procs)
    (fp,) = h.items
    assert fp.kind is K.FOREIGN_PROCESS and fp.detail["pid"] == 20


def test_the_power_cap_flag_far_below_the_limit_is_no_cap():
    pl = place_ranks(PROCS, world_size=4)
    capped = {("node-b", "1"): ["sw_power_cap"]}
    low = {**VALUES, ("node-b", "1"): {**VALUES[("node-b", "1")], "perfd_gpu_power_watts": 309.0,
                                       "perfd_gpu_power_limit_watts": 700.0}}
    (h,) = gpu_hints([3], pl, low, capped, PROCS)
    assert K.POWER_CAP not in [e.kind for e in h.items]  # 309 W of 700 W: the flag, not a cap
    high = {**VALUES, ("node-b", "1"): {**VALUES[("node-b", "1")], "perfd_gpu_power_watts": 695.0,
                                        "perfd_gpu_power_limit_watts": 700.0}}
    (h,) = gpu_hints([3], pl, high, capped, PROCS)
    assert K.POWER_CAP in [e.kind for e in h.items]
