"""A report speaks of the job's own framework: a one-GPU plain-PyTorch loop under the step hook (before,
its HTML and text reports said "Megatron's elapsed time per iteration", a communication badge, and to
pass --timing-log-option all) reads in the hook's terms, a Hugging Face Trainer's job in the Trainer's;
a Megatron-LM job's words stay its own. The loop is the plain PyTorch loop recorded on an H100
(tests/data/hook/plain_loop_h100/data_steps.json.gz), fed as the hook's records."""

from __future__ import annotations

import gzip
import html
import json
import re

import pytest

from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_result import RunAnalysis
from perfd.core.model import (
    HOOK_COMPUTE,
    HOOK_DATA_WAIT,
    JobInfo,
    ParallelLayout,
    Provenance,
    StepRecord,
    TimerValue,
)
from perfd.report import build_report, render_text
from perfd.report.html import page_from_json, render_html
from perfd.report.training_report import analysis_json
from tests.integrations.integrations_helpers import ROOT

LOOP = ROOT / "tests" / "data" / "hook" / "plain_loop_h100" / "data_steps.json.gz"
T0 = 1_795_000_000.0
# A peak that puts the loop's median MFU in the 30–40% band (its model's FLOPs are the loop's own count):
# the band named for communication, which one GPU does not have.
PEAK_TFLOPS = 0.06


def _analysis(framework: str, world_size: int = 1) -> RunAnalysis:
    with gzip.open(LOOP, "rt") as f:
        rows = json.load(f)["steps"]
    recs = []
    for i, tb, td, te, tokens, flops, *_ in rows:
        d, s = (td - tb) * 1e3, (te - tb) * 1e3
        recs.append(StepRecord(job="loop", iteration=int(i), rank=0, end_time=T0 + te, step_time_ms=s,
                               interval=1, timers={HOOK_DATA_WAIT: TimerValue(d, d, {0: d}),
                                       HOOK_COMPUTE: TimerValue(s - d, s - d, {0: s - d})},
                               source=Provenance("hook", "rank0:pid7"), fields={"timing": "cuda", "pid": "7"},
                               tokens_per_step=float(tokens), flops_per_step=float(flops)))
    job = JobInfo(framework=framework, layout=ParallelLayout(world_size=world_size))
    return analyze_run(job, recs, peak_tflops=PEAK_TFLOPS, dtype="bf16", job_name="loop")


@pytest.fixture(scope="module")
def plain() -> RunAnalysis:
    return _analysis("pytorch")


def _html(a: RunAnalysis) -> str:
    return html.unescape(render_html(page_from_json(analysis_json(a))))


def _text(a: RunAnalysis) -> str:
    """The text report with its wrapped lines joined (a sentence may break anywhere)."""
    return " ".join(render_text(build_report(a), a).split())


def test_a_one_gpu_pytorch_job_reads_in_the_hooks_terms(plain: RunAnalysis) -> None:
    rep = build_report(plain)
    assert rep.summary.status == "communication-overhead"  # the grade, as the API serves it
    text = _text(plain)
    page = _html(plain)
    assert "Megatron" not in text and "--timing-log-option" not in text
    assert "--timing-log-option" not in page
    # The metrics table's definitions name every source a metric has (Megatron's among them): the only
    # place the page may say Megatron.
    assert "Megatron" not in re.sub(r"<div class=src>.*?</div>", "", page)
    assert "Step time per iteration (the step hook's period" in page
    assert "the job runs on one rank" in page  # no per-rank heat map: nothing to compare, no flag to pass
    # The 30–40% band is named for communication: one rank has none to expose, so neither the badge nor
    # the status says it is the job's.
    assert 'class="badge communication-overhead">fair</span>' in page
    assert "status: fair — MFU 30–40%: a band usually due to communication overhead — not here" in text
    assert "DataLoader(num_workers=N" in text  # the plain loop's own data loader


def test_a_hugging_face_trainers_job_gets_the_trainers_flags() -> None:
    a = _analysis("hf_trainer")
    text = _text(a)
    assert "--dataloader_num_workers N --dataloader_persistent_workers" in text
    assert "DataLoader(" not in text and "Megatron" not in text
    assert "Step time per iteration (the step hook's period" in _html(a)


def test_a_multi_rank_hook_job_without_per_rank_times_is_told_to_hook_every_rank() -> None:
    page = _html(_analysis("lightning", world_size=4))
    assert "hook every rank" in page and "--timing-log-option" not in page


def test_the_throughput_check_and_the_slow_rank_name_the_jobs_own_source() -> None:
    """The check against the logged throughput names whose figure it is; the way to name a slow rank is
    the job's framework's (a Megatron flag only for Megatron-LM)."""
    from perfd.analytics.advice.remedies import Framework
    from perfd.analytics.run.run_facts import SpreadFacts
    from perfd.analytics.run.run_grade import CrosscheckFacts, CrosscheckRecommendation
    from perfd.report.finding_text import recommendation_words
    from perfd.report.grade_text import crosscheck_words, worded_recommendation

    def check(framework: Framework) -> CrosscheckFacts:
        return CrosscheckFacts(n_checked=10, n_disagree=2, max_gap=0.05, tflops=300.0, logged_tflops=280.0,
                               formula="f", framework=framework)

    assert crosscheck_words(check(Framework.MEGATRON))[0].endswith("with Megatron's logged throughput")
    assert crosscheck_words(check(Framework.TORCHTITAN))[0].endswith("with torchtitan's logged tflops")
    rec = worded_recommendation(CrosscheckRecommendation("", "tflops-crosscheck", 0, "", "", None,
                                                         facts=check(Framework.TORCHTITAN)))
    assert "Megatron" not in rec.action
    assert "--timing-log-option all" in recommendation_words(SpreadFacts(fraction=0.5))[0]
    for f in (Framework.PYTORCH, Framework.HF_TRAINER, Framework.LIGHTNING, Framework.TORCHTITAN):
        action = recommendation_words(SpreadFacts(fraction=0.5, framework=f))[0]
        assert "step hook on every rank" in action and "--timing-log-option" not in action


def test_a_small_throughput_reads_in_significant_digits(plain: RunAnalysis) -> None:
    """A job well under 1 TFLOP/s per GPU (a CPU job's 0.048) read "0.0 TFLOP/s per GPU" in the headline,
    the metrics and the MFU finding: two significant digits below 1 TFLOP/s, wherever it is shown."""
    got = plain.summary.median("model_tflops_per_gpu")
    assert got is not None and 0.01 < got < 0.1
    text, page = _text(plain), _html(plain)
    assert f"{got:.2g} TFLOP/s per GPU" in build_report(plain).summary.headline
    assert f"= {got:.2g} TFLOP/s per GPU" in text
    for shown in (text, page):
        assert "0.0 TFLOP/s" not in shown and "0.00 " not in shown

    from perfd.report.training_report import format_value
    from perfd.report.units import tflops

    assert format_value(0.048, "tflops") == "0.048 TFLOP/s"
    assert format_value(82.84, "tflops") == "82.8 TFLOP/s"
    assert tflops(0.0) == "0.0" and tflops(0.00123) == "0.0012" and tflops(412.3, 0) == "412"
