"""Builders for the analytics tests: the fixture's JobInfo and StepRecords from real numbers."""

from __future__ import annotations

from perfd.core.model import (
    JobInfo,
    ModelSpec,
    ParallelLayout,
    Provenance,
    RankValue,
    StepRecord,
    StragglerLine,
    TimerValue,
)
from tests.analytics.megatron_fixture_data import ROWS, TIMER_NAMES

FIXTURE_LOG = "h200x2_tp1_pp2_gbs64_mbs4.log"


def fixture_job(version: str | None = "0.20.0") -> JobInfo:
    """What the fixture's start-up says (arguments block, world-size line, padded vocab line)."""
    return JobInfo(
        framework="megatron",
        framework_version=version,
        torch_version="2.11.0+cu130",
        layout=ParallelLayout(world_size=2, tp=1, pp=2, dp=1, cp=1, ep=1, micro_batch_size=4,
                              global_batch_size=64),
        spec=ModelSpec(num_layers=8, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                       kv_channels=64, num_query_groups=None, seq_length=1024, padded_vocab_size=32000,
                       vocab_size=32000, swiglu=False, untie_embeddings=False),
        timing_log_option="minmax",
        log_interval=1,
        arguments={"bf16": "True", "fp16": "False", "fp8": "None", "overlap_grad_reduce": "False",
                   "decoder_first_pipeline_num_layers": "None",
                   "decoder_last_pipeline_num_layers": "None"},
    )


def fixture_record(row: tuple) -> StepRecord:  # type: ignore[type-arg]
    it, line_no, elapsed, tflops, loss, rtt, timers = row
    rec = StepRecord(
        job="fixture", iteration=it, rank="last", train_iters=40, step_time_ms=elapsed,
        logged_tflops_per_gpu=tflops, global_batch_size=64, lm_loss=loss, interval=1,
        source=Provenance("megatron", f"{FIXTURE_LOG}:{line_no}"),
    )
    for name, mm in zip(TIMER_NAMES, timers, strict=True):
        if mm is not None:
            rec.timers[name] = TimerValue(min_ms=mm[0], max_ms=mm[1])
    if rtt is not None:
        lo, lo_rank, hi, hi_rank = rtt
        rec.straggler = StragglerLine(time=None, quantities={
            "rtt": (RankValue(lo, lo_rank, "ms"), RankValue(hi, hi_rank, "ms"))})
    return rec


def fixture_records() -> list[StepRecord]:
    return [fixture_record(r) for r in ROWS]


def fixture_row(iteration: int) -> tuple:  # type: ignore[type-arg]
    return next(r for r in ROWS if r[0] == iteration)
