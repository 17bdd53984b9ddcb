"""cuBLAS's split-K reductions counted in a capture (perfd.analytics.breakdown.splitk_seen): which
kernels they are, the count a micro-batch where the step's count is one set a micro-batch, and a
record from outside read back or refused."""

from __future__ import annotations

from perfd.analytics.breakdown.splitk_seen import SplitKSeen, is_splitk_reduce


def test_the_reduction_kernel_is_told_from_the_split_gemm_itself() -> None:
    assert is_splitk_reduce("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>")
    assert not is_splitk_reduce("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_splitK_NTN")
    assert not is_splitk_reduce("triton_poi_fused__to_copy_3")


def test_per_microbatch_only_for_one_set_a_micro_batch() -> None:
    assert SplitKSeen(144.0, 1.15).per_microbatch(4) == 36
    assert SplitKSeen(145.0, 1.15).per_microbatch(4) is None  # another GEMM's besides the weights'
    assert SplitKSeen(3.0, 0.1).per_microbatch(4) is None  # under one a micro-batch
    assert SplitKSeen(0.0, 0.0).per_microbatch(4) is None
    assert SplitKSeen(8.0, 0.1).per_microbatch(0) is None


def test_read_back_and_refused() -> None:
    s = SplitKSeen(144.0, 1.15)
    assert SplitKSeen.from_json(s.to_json()) == s
    bad: object
    for bad in (None, [], {"count": "144", "ms": 1.0}, {"count": True, "ms": 1.0}, {"count": 1.0},
                {"count": -1.0, "ms": 1.0}, {"count": 1.0, "ms": -0.5}):
        assert SplitKSeen.from_json(bad) is None, bad
