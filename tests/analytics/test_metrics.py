"""Throughput, MFU, the cross-check, data-loading and exposed-communication shares."""

from __future__ import annotations

from typing import Any

import pytest

from perfd.analytics.common import GRAD_SYNC_TIMERS, PP_P2P_TIMERS
from perfd.analytics.steps.gpus import peak_tflops
from perfd.analytics.steps.metrics import crosscheck_tflops, data_share, exposed_comm, mfu, throughput_per_gpu
from perfd.analytics.steps.provenance import Code
from perfd.core.model import Provenance, StepRecord, TimerValue
from perfd.report.provenance_text import text
from tests.analytics.analytics_helpers import fixture_record, fixture_row

FIXTURE_FLOPS = 55_765_855_371_264


def test_throughput_and_mfu_iteration_38() -> None:
    tput = throughput_per_gpu(FIXTURE_FLOPS, 331.1, 2)
    assert tput.value == pytest.approx(84.213, abs=1e-3)
    m = mfu(tput, peak_tflops("NVIDIA H200", "bf16"))
    assert m.value == pytest.approx(84.213 / 989, rel=1e-4)
    assert 0 < (m.value or 0) < 1  # a ratio, not percent
    assert m.cite.code is Code.MFU and "989" in str(m.cite.args[0])  # the peak table's row, quoted


def test_throughput_missing_inputs_are_absent() -> None:
    for args, name in (((None, 331.1, 2), "model FLOPs"), ((FIXTURE_FLOPS, None, 2), "step time"),
                       ((FIXTURE_FLOPS, 331.1, None), "world size")):
        res = throughput_per_gpu(*args)
        assert res.value is None and res.cite.absent
        assert (res.cite.code, res.cite.args) == (Code.MISSING, ((name,),))
    assert throughput_per_gpu(FIXTURE_FLOPS, 0.0, 2).cite.code is Code.NON_POSITIVE
    assert mfu(throughput_per_gpu(FIXTURE_FLOPS, 331.1, 2), peak_tflops("unknown", "bf16")).value is None


def test_crosscheck_allows_for_log_rounding() -> None:
    # iteration 1: perfd 4.752 vs logged 4.8 is -1.01%, inside the 0.05/4.8 = 1.04% rounding band
    tput = FIXTURE_FLOPS / (5.868 * 1e12 * 2)
    chk = crosscheck_tflops(tput, 4.8)
    assert chk.rel_gap == pytest.approx(-0.0100, abs=2e-4)
    assert chk.tolerance == pytest.approx(0.05 / 4.8)
    assert chk.agrees is True
    bad = crosscheck_tflops(84.2 * 1.02, 84.2)  # 2% off at a large figure: disagrees
    assert bad.agrees is False and bad.tolerance == 0.01
    assert crosscheck_tflops(None, 84.2).agrees is None


def test_data_share_iteration_38() -> None:
    rec = fixture_record(fixture_row(38))
    d = data_share(rec)
    assert d.value == pytest.approx(12.70 / 331.1)
    assert d.cite.code is Code.TIMER_SHARE
    assert d.cite.args == ("megatron", "batch-generator", "max across ranks", 12.70, 331.1,
                           Provenance("megatron", "h200x2_tp1_pp2_gbs64_mbs4.log:1769"))
    del rec.timers["batch-generator"]
    assert data_share(rec).value is None and data_share(rec).cite.code is Code.MEGATRON_NO_DATA_TIMER


def test_exposed_comm_iteration_38_sum_of_max() -> None:
    rec = fixture_record(fixture_row(38))
    c = exposed_comm(rec)
    dp_ms = 0.39 + 0.54  # all-grads-sync max, embedding-grads-all-reduce max
    pp_ms = 8.21 + 0.24 + 10.11 + 0.22 + 56.90 + 4.38
    assert c.method == "sum-of-max"
    assert c.grad_sync.value == pytest.approx(dp_ms / 331.1)
    assert c.pp.value == pytest.approx(pp_ms / 331.1)
    assert c.total.value == pytest.approx((dp_ms + pp_ms) / 331.1)
    assert c.total.cite.code is Code.COMM_SUM_OF_MAX  # maxima of several timers: an upper bound
    assert c.timers_ms["forward-send-backward-recv"] == 56.90


def test_exposed_comm_absent_without_timers() -> None:
    rec = StepRecord(job="j", iteration=1, step_time_ms=100.0,
                     timers={"forward-compute": TimerValue(10.0, 12.0)})
    c = exposed_comm(rec)
    assert c.total.value is None and c.grad_sync.value is None and c.pp.value is None
    assert c.total.cite.code is Code.MEGATRON_NO_COMM_TIMERS and c.total.cite.args == ()
    assert "no communication timers" in text(c.total.cite)  # as the report words it
    # DP-only job: the PP part is absent, not 0
    rec.timers["all-grads-sync"] = TimerValue(5.0, 20.0)
    c = exposed_comm(rec)
    assert c.total.value == pytest.approx(0.2) and c.grad_sync.value == pytest.approx(0.2)
    assert c.total.cite.code is Code.COMM_ONE_MAX  # one timer's max: one rank's time
    assert c.pp.value is None and (c.pp.cite.code, c.pp.cite.args) == (Code.NO_TIMERS, ("pipeline p2p",))


def test_exposed_comm_per_rank_uses_worst_rank() -> None:
    rec = StepRecord(job="j", iteration=1, step_time_ms=200.0, timers={
        "all-grads-sync": TimerValue(per_rank={0: 10.0, 1: 30.0}),
        "params-all-gather": TimerValue(per_rank={0: 25.0, 1: 2.0}),
    })
    c = exposed_comm(rec)
    assert c.method == "per-rank"
    # rank 0: 35 ms, rank 1: 32 ms (the sum of maxima, 55 ms, would overstate)
    assert c.total.value == pytest.approx(35.0 / 200.0)
    assert c.worst_rank == 0
    assert c.total.cite.code is Code.COMM_PER_RANK and c.total.cite.args[2:5] == (0, 35.0, 200.0)


def test_timer_name_sets() -> None:
    assert {"all-grads-sync", "params-all-gather", "embedding-grads-all-reduce",
            "non-tensor-parallel-grads-all-reduce", "layernorm-grads-all-reduce",
            "conditional-embedder-grads-all-reduce"} <= set(GRAD_SYNC_TIMERS)
    assert len(PP_P2P_TIMERS) == 6


# ------------------------------------------------------------- one vocabulary, each source mapped once


def test_each_source_is_read_through_its_own_vocabulary() -> None:
    from perfd.analytics.steps.vocabulary import (
        HOOK_VOCABULARY,
        MEGATRON_VOCABULARY,
        VOCABULARIES,
        vocabulary_of,
    )

    hook = StepRecord(job="j", iteration=7, rank="all", step_time_ms=50.0,
                      timers={"data-wait": TimerValue(10.0, 12.0, {0: 10.0, 1: 12.0})},
                      source=Provenance("hook", "rank1:pid9"))
    d = data_share(hook)
    assert d.value == pytest.approx(12.0 / 50.0)  # the slowest rank's wait
    assert d.cite.code is Code.TIMER_SHARE
    assert d.cite.args[:3] == ("hook", "data-wait", HOOK_VOCABULARY.across_ranks)
    c = exposed_comm(hook)
    assert c.total.value is None and c.total.cite.code is HOOK_VOCABULARY.comm_absent is Code.HOOK_NO_COMM
    # A hook record that never called data_ready(): absent, saying how to get it.
    bare = StepRecord(job="j", iteration=8, rank=0, step_time_ms=50.0, source=Provenance("hook", "r0"))
    assert data_share(bare).value is None
    assert data_share(bare).cite.code is HOOK_VOCABULARY.data_wait_absent is Code.HOOK_NO_DATA_WAIT
    # Megatron's timer name means nothing in a hook record, and the hook's nothing in Megatron's.
    mixed = StepRecord(job="j", iteration=9, step_time_ms=50.0, source=Provenance("megatron", "log:1"),
                       timers={"data-wait": TimerValue(None, 5.0)})
    assert data_share(mixed).value is None
    assert data_share(mixed).cite.code is MEGATRON_VOCABULARY.data_wait_absent is Code.MEGATRON_NO_DATA_TIMER
    titan = StepRecord(job="j", iteration=10, step_time_ms=50.0, source=Provenance("torchtitan", "log:1"))
    titan_wait = data_share(titan).cite
    assert titan_wait.code is VOCABULARIES["torchtitan"].data_wait_absent is Code.TORCHTITAN_NO_DATA
    # the reasons are codes, worded where they are shown (perfd.report.provenance_text)
    assert titan_wait.args == () and titan_wait.absent
    assert set(VOCABULARIES) == {"megatron", "hook", "torchtitan"}
    assert vocabulary_of(StepRecord(job="j", iteration=1)).source == "megatron"  # no provenance: Megatron


def test_torchtitan_crosscheck_allows_two_percent() -> None:
    assert crosscheck_tflops(101.5, 100.0, "torchtitan").agrees is True
    assert crosscheck_tflops(101.5, 100.0).agrees is False  # Megatron's 1%
    assert crosscheck_tflops(103.0, 100.0, "torchtitan").agrees is False


def test_layout_text_leaves_out_what_is_unknown() -> None:
    from perfd.analytics.run.run_summary import JobLayout
    from perfd.report.training_report import layout_text as text_of

    def layout_text(d: dict[str, Any]) -> str:
        return text_of(JobLayout.from_json(d))

    assert layout_text({"tp": 1, "pp": 2, "dp": 1, "world_size": 2, "microbatches": 16}) == \
        "TP=1 PP=2 DP=1, world size 2, 16 micro-batches"
    assert layout_text({"tp": None, "pp": None, "dp": None, "world_size": 1, "microbatches": None}) == \
        "world size 1"
    assert layout_text({}) == "layout unknown"
    assert layout_text({"world_size": 1, "microbatches": 1}) == "world size 1, 1 micro-batch"
