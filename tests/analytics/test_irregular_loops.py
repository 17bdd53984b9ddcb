"""Issue 44 on CPU: a plain PyTorch loop's real step clock, replayed through the aggregator as the
step hook sends it (one record per step: data wait, then compute).

The recording (tests/data/hook/plain_loop_h100/data_steps.json.gz, from tests/gpu/plain_loop_live.py
on an H100): a decoder stack fed by a DataLoader with 2 workers whose samples cost CPU; the GPU waits
on data about a third of the time, in alternating short and long waits; from ~50 s in, for 50 s, the
samples cost three times as much. Each step's row: iteration, begin, data ready, end (after a device
sync, seconds on the loop's clock), whether its batch was made in the slow phase.

The truth is the loop's own clock: the steady data share is Σ wait ÷ Σ step outside the slow stretch
(after WARMUP steps); the slow stretch is the first to the last step whose batch was slow; its cost
is Σ(step − steady mean step) over it. A median of single steps reads this series wrong (the fast
steps: "data loading 0.6% of the step", seen before this was fixed).
"""

from __future__ import annotations

import gzip
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.http import job_summary
from perfd.aggregator.state import AggregatorState
from perfd.model import HOOK_COMPUTE, HOOK_DATA_WAIT, StepRecord, TimerValue
from tests.gpu.plain_loop_live import WARMUP, clean_steps, truth_data

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "hook" / "plain_loop_h100"
RECORDING = DATA / "data_steps.json.gz"
VARLEN = DATA / "varlen_steps.json.gz"
JOB = "plain-data"


def _recording(path: Path = RECORDING) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return dict(json.load(f))


# Two runs of the loop on the H100 (the second 110 s long, its slow phase 40 s from 40 s in).
@pytest.fixture(scope="module", params=["data_steps.json.gz", "data_steps_run2.json.gz"])
def replayed(request: pytest.FixtureRequest) -> tuple[AggregatorState, dict[str, Any]]:
    """The recording as the hook sends it, ingested in the order it arrived and analysed every 50
    records (the live aggregator's refresher)."""
    rec = _recording(DATA / str(request.param))
    rows = rec["steps"]
    st = AggregatorState(min_recompute_s=0.0)
    t0 = time.time() - (rows[-1][3] - rows[0][1]) - 5
    for n, (i, tb, td, te, _slow, _wall) in enumerate(rows, start=1):
        d, s = (td - tb) * 1e3, (te - tb) * 1e3
        timers = {HOOK_DATA_WAIT: TimerValue(d, d, {0: d}),
                  HOOK_COMPUTE: TimerValue(s - d, s - d, {0: s - d})}
        st.ingest_steps("agent-a", [StepRecord(job=JOB, iteration=i, rank=0, end_time=t0 + (te - rows[0][1]),
                                               step_time_ms=s, interval=1, timers=timers)])
        if n % 50 == 0:
            st.analysis(JOB, force=True)
    full = job_summary(st, JOB)  # what GET /api/jobs/<job>/summary serves
    assert full is not None
    return st, {"truth": truth_data(rec), "summary": full["summary"], "report": full["report"]}


def test_the_recording_is_what_the_issue_describes() -> None:
    """Waits that alternate, a third of the time spent waiting, a slow phase of ~200 steps."""
    rows = _recording()["steps"][WARMUP:]
    waits = [(r[2] - r[1]) * 1e3 for r in rows if not r[4]][:400]
    swing = statistics.fmean(abs(b - a) for a, b in itertools.pairwise(waits))
    assert swing > 0.25 * statistics.fmean(waits)  # one step's wait is not the next one's
    assert 0.30 < truth_data(_recording())["data_share"] < 0.40
    assert sum(r[4] for r in rows) > 150


def test_steady_data_share_is_the_loops_own_within_3_points_and_the_class_data_bound(
        replayed: tuple[AggregatorState, dict[str, Any]]) -> None:
    _, got = replayed
    share = got["summary"]["medians"]["data_share"]
    assert share == pytest.approx(got["truth"]["data_share"], abs=0.03)
    assert got["summary"]["bottleneck"] == "data-bound"


def test_one_incident_over_the_slow_phase_and_none_in_the_steady_parts(
        replayed: tuple[AggregatorState, dict[str, Any]]) -> None:
    st, got = replayed
    t = got["truth"]
    (inc,) = st.incidents.incidents(JOB)
    assert abs(inc["first_iteration"] - t["slow_first"]) <= 20
    assert abs(inc["last_iteration"] - t["slow_last"]) <= 20
    assert inc["cost_s"] == pytest.approx(t["cost_s"], rel=0.10)
    assert not inc["open"] and inc["verdict"]["cause"] == "data_wait"


def test_the_alternation_is_not_jitter_and_r1_is_the_data_loader(
        replayed: tuple[AggregatorState, dict[str, Any]]) -> None:
    _, got = replayed
    rep = got["report"]
    assert "step-jitter" not in {f["id"] for f in rep["findings"]}
    r1 = rep["recommendations"][0]
    assert r1["finding_id"] == "data-loading"
    assert "batch-generator" not in r1["detail"]  # the hook's own timer, not Megatron's


# ---- the variable-length loop --------------------------------------------------------------------
# tests/data/hook/plain_loop_h100/varlen_steps.json.gz: the same stack, batch 8, a sequence of 512,
# 1024 or 2048 drawn per step (steps of 18, 31 and 57 ms), ``step_end(tokens=, flops=)`` per step; a
# co-tenant bf16 matmul process on the GPU for ~30 s in the middle. Rows: iteration, begin, data ready,
# end, sequence, FLOPs, wall clock.


def _varlen() -> list[list[Any]]:
    with gzip.open(VARLEN, "rt") as f:
        return list(json.load(f)["steps"])


@pytest.fixture(scope="module")
def varlen() -> dict[str, Any]:
    rows = _varlen()
    st = AggregatorState(min_recompute_s=0.0)
    t0 = time.time() - (rows[-1][3] - rows[0][1]) - 5
    for n, (i, tb, td, te, seq, flops, _wall) in enumerate(rows, start=1):
        d, s = (td - tb) * 1e3, (te - tb) * 1e3
        timers = {HOOK_DATA_WAIT: TimerValue(d, d, {0: d}),
                  HOOK_COMPUTE: TimerValue(s - d, s - d, {0: s - d})}
        # as the hook collector states this step's own work (collectors/hook: the record's counts)
        st.ingest_steps("agent-a", [StepRecord(job="varlen", iteration=i, rank=0, interval=1,
                                               end_time=t0 + (te - rows[0][1]), step_time_ms=s,
                                               timers=timers, flops_per_step=flops,
                                               tokens_per_step=8 * seq)])
        if n % 100 == 0:
            st.analysis("varlen", force=True)
    full = job_summary(st, "varlen")
    assert full is not None
    return {"rows": rows, "summary": full["summary"], "report": full["report"],
            "incidents": st.incidents.incidents("varlen")}


def test_the_varlen_recording_varies_4x_by_design() -> None:
    rows = _varlen()[WARMUP:]
    by_seq = {s: statistics.median((r[3] - r[1]) * 1e3 for r in rows if r[4] == s) for s in (512, 1024, 2048)}
    assert by_seq[2048] > 2.8 * by_seq[512]


def test_varlen_throughput_is_flops_summed_over_time_summed_within_2_percent(varlen: dict[str, Any]) -> None:
    clean = clean_steps(varlen["rows"])
    truth = sum(r[5] for r in clean) / sum(r[3] - r[1] for r in clean) / 1e12
    got = varlen["summary"]["medians"]["model_tflops_per_gpu"]
    assert got == pytest.approx(truth, rel=0.02)
    # a median step against the mean work (what the issue saw: 12% high) is not what is reported
    mean_flops = statistics.fmean(r[5] for r in clean)
    median_step_s = statistics.median(r[3] - r[1] for r in clean)
    assert abs(mean_flops / median_step_s / 1e12 / truth - 1) > 0.05


def test_varlen_steps_sizes_are_not_jitter_and_the_cotenant_is_one_incident(varlen: dict[str, Any]) -> None:
    assert "step-jitter" not in {f["id"] for f in varlen["report"]["findings"]}
    assert varlen["summary"]["step_time_cv"] < 0.10
    clean = {r[0] for r in clean_steps(varlen["rows"])}
    slowed = [r[0] for r in varlen["rows"][WARMUP:] if r[0] not in clean]
    (inc,) = varlen["incidents"]
    assert abs(inc["first_iteration"] - min(slowed)) <= 20 and abs(inc["last_iteration"] - max(slowed)) <= 20
