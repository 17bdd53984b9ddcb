"""Interval arithmetic and the HTA breakdown on hand-built timelines."""

from __future__ import annotations

import random

import pytest

from perfd.capture.analysis import (
    Interval,
    NvtxRange,
    analyze_intervals,
    difference,
    intersection,
    is_nccl,
    is_sendrecv,
    total,
    union,
)
from perfd.capture.timeline_events import KernelEvent, MemEvent

MS = 1e6  # ns per ms


def test_union_nested_overlapping_disjoint_touching() -> None:
    assert union([(0, 10), (2, 5)]) == [(0, 10)]  # nested
    assert union([(0, 5), (3, 8)]) == [(0, 8)]  # overlapping
    assert union([(6, 8), (0, 2)]) == [(0, 2), (6, 8)]  # disjoint, unsorted
    assert union([(0, 2), (2, 4)]) == [(0, 4)]  # touching
    assert union([(0, 10), (1, 2), (3, 4), (9, 12), (20, 21)]) == [(0, 12), (20, 21)]
    assert union([(5, 5), (7, 6)]) == []  # empty and inverted intervals carry no time
    assert union([]) == []
    assert total(union([(0, 10), (2, 5), (8, 15)])) == 15


def test_difference_cases() -> None:
    assert difference([(0, 10)], [(2, 4), (6, 8)]) == [(0, 2), (4, 6), (8, 10)]
    assert difference([(0, 10)], [(0, 10)]) == []  # fully hidden
    assert difference([(0, 10)], [(-5, 20)]) == []
    assert difference([(0, 10)], []) == [(0, 10)]
    assert difference([(0, 4), (6, 10)], [(3, 7)]) == [(0, 3), (7, 10)]  # one b across two a
    assert difference([(0, 2), (5, 7)], [(2, 5)]) == [(0, 2), (5, 7)]  # touching only
    assert difference([(0, 3), (4, 6), (8, 9)], [(1, 5), (5.5, 8.5)]) == [(0, 1), (5, 5.5), (8.5, 9)]


def _covered(merged: list[Interval], grid: range) -> set[int]:
    return {t for t in grid if any(s <= t + 0.5 < e for s, e in merged)}


def random_union(rng: random.Random) -> list[Interval]:
    starts = [rng.randint(0, 180) for _ in range(rng.randint(0, 8))]
    return union((float(s), float(s + rng.randint(0, 20))) for s in starts)


def test_difference_and_intersection_match_brute_force() -> None:
    rng = random.Random(7)
    grid = range(0, 200)
    for _ in range(300):
        a, b = random_union(rng), random_union(rng)
        ca, cb = _covered(a, grid), _covered(b, grid)
        assert _covered(difference(a, b), grid) == ca - cb
        assert _covered(intersection(a, b), grid) == ca & cb
        assert total(difference(a, b)) + total(intersection(a, b)) == total(a)


@pytest.mark.slow
def test_union_scales() -> None:
    rng = random.Random(1)
    ivs = [(s, s + rng.random() * 10) for s in (rng.random() * 1e6 for _ in range(200_000))]
    merged = union(ivs)
    assert all(merged[i][1] < merged[i + 1][0] for i in range(len(merged) - 1))


def test_name_classes() -> None:
    assert is_nccl("ncclDevKernel_AllReduce_Sum_f32_RING_LL") and is_nccl("NCCL_kernel")
    assert not is_nccl("ampere_bf16_s16816gemm")
    assert is_sendrecv("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")
    assert is_sendrecv("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t")
    assert not is_sendrecv("ncclDevKernel_AllReduce_Sum_f32_RING_LL")


def k(dev: int, start_ms: float, end_ms: float, name: str, stream: int = 7,
      pid: int | None = None) -> KernelEvent:
    return KernelEvent(dev, start_ms * MS, end_ms * MS, name, stream, pid)


def test_breakdown_nccl_fully_hidden() -> None:
    kernels = [k(0, 0, 10, "gemm", 7), k(0, 2, 8, "ncclDevKernel_AllReduce", 20)]
    d = analyze_intervals(kernels).device(0)
    assert (d.span_ms, d.busy_ms, d.idle_ms) == (10, 10, 0)
    assert (d.compute_ms, d.comm_ms, d.comm_exposed_ms) == (10, 6, 0)
    assert d.overlap_ratio == 1.0


def test_breakdown_partially_exposed_multi_stream() -> None:
    kernels = [
        k(0, 0, 4, "gemm", 7), k(0, 1, 3, "softmax", 13),  # nested compute on two streams
        k(0, 3, 9, "ncclDevKernel_AllReduce", 20),  # overlaps compute for 1 ms, exposed for 5
        k(0, 12, 14, "gemm", 7),  # after a 3 ms gap
        k(0, 13, 15, "ncclDevKernel_SendRecv", 21),  # exposed 1 ms
    ]
    mem = [MemEvent(0, 9 * MS, 11 * MS, "memcpy"), MemEvent(0, 10 * MS, 11.5 * MS, "memset")]
    d = analyze_intervals(kernels, mem).device(0)
    assert d.span_ms == 15
    # Busy counts every GPU activity once: kernels [0,9) ∪ [12,15), the copy and set [9,11.5).
    assert d.busy_ms == 4 + 5 + 2.5 + 3 and d.kernel_ms == 4 + 5 + 3
    assert d.idle_ms == 0.5 and d.idle_gaps == 1 and d.idle_short_ms == 0.5
    assert d.compute_ms == 6 and d.comm_ms == 8
    assert d.comm_exposed_ms == 5 + 1
    assert d.overlap_ratio == pytest.approx(1 - 6 / 8)
    assert d.memcpy_ms == 2.5
    assert d.sendrecv_ms == 2
    assert d.kernel_count == 5
    top = {t.name: t for t in d.top_kernels}
    assert top["gemm"].count == 2 and top["gemm"].total_ms == 6 and top["gemm"].share == pytest.approx(6 / 12)
    assert d.top_kernels[0].name == "gemm"


def test_breakdown_without_communication_and_memcpy_only_device() -> None:
    a = analyze_intervals([k(0, 0, 5, "gemm")], [MemEvent(1, 0, 2 * MS)])
    d0, d1 = a.devices
    assert d0.overlap_ratio is None and d0.comm_ms == 0 and d0.sendrecv_ms == 0
    assert (d1.device, d1.span_ms, d1.busy_ms, d1.idle_ms, d1.memcpy_ms) == (1, 2, 2, 0, 2)


def test_devices_are_separate() -> None:
    a = analyze_intervals([k(1, 0, 5, "gemm"), k(0, 10, 12, "gemm"), k(1, 20, 21, "nccl_x")])
    assert [d.device for d in a.devices] == [0, 1]
    assert a.device(0).span_ms == 2 and a.device(1).span_ms == 21 and a.device(1).busy_ms == 6


def test_nvtx_attribution() -> None:
    kernels = [k(0, 0, 10, "gemm", pid=100), k(1, 0, 10, "gemm", pid=200)]
    nvtx = [
        NvtxRange(0, 4 * MS, "forward", pid=100),
        NvtxRange(4 * MS, 9 * MS, "backward", pid=100),
        NvtxRange(0, 2 * MS, "forward", pid=100),
        NvtxRange(0, 3 * MS, "forward", pid=200),
        NvtxRange(0, 1 * MS, "gpu_range", device=1),
        NvtxRange(0, 5 * MS, "everyone"),
        NvtxRange(5 * MS, 5 * MS, "empty", pid=100),
    ]
    a = analyze_intervals(kernels, [], nvtx)
    d0 = {n.name: (n.count, n.total_ms) for n in a.device(0).nvtx}
    d1 = {n.name: (n.count, n.total_ms) for n in a.device(1).nvtx}
    assert d0 == {"forward": (2, 6), "backward": (1, 5), "everyone": (1, 5)}
    assert d1 == {"forward": (1, 3), "gpu_range": (1, 1), "everyone": (1, 5)}


def test_to_json_shape() -> None:
    a = analyze_intervals([k(0, 0, 1, "gemm"), k(0, 0.5, 2, "ncclDevKernel_AllReduce")], source="x.sqlite",
                          rank=3)
    j = a.to_json()
    assert j["source"] == "x.sqlite" and j["rank"] == 3
    devices = j["devices"]
    assert isinstance(devices, list)
    [dev] = devices
    assert set(dev) >= {"device", "span_ms", "busy_ms", "idle_ms", "compute_ms", "comm_ms", "comm_exposed_ms",
                        "overlap_ratio", "memcpy_ms", "sendrecv_ms", "top_kernels", "nvtx"}
    assert dev["comm_exposed_ms"] == pytest.approx(1.0) and dev["overlap_ratio"] == pytest.approx(1 - 1 / 1.5)
    assert dev["top_kernels"][0] == {"name": "ncclDevKernel_AllReduce", "count": 1, "total_ms": 1.5,
                                     "share": 0.75}
    assert "rank" not in analyze_intervals([]).to_json()
