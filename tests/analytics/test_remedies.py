"""Remedies fitted to the job (perfd.analytics.advice.remedies): the options a remedy names exist in the job's
Megatron-LM release (checked against the releases' own parsers, recorded in tests/data/megatron_options),
none is already set, what a remedy needs that the job lacks is said, and the predicted gain of every
remedy applied on the H100 contains what the change measured there (docs/evidence/remedies_h100)."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.advice import megatron_options as mo
from perfd.analytics.advice.budget_findings import RemedyRecommendation
from perfd.analytics.advice.remedies import (
    FUSED_POINTWISE,
    Advice,
    FitContext,
    Framework,
    RemedyId,
    run_spread_ms,
)
from perfd.analytics.advice.remedy_catalog import fit
from perfd.analytics.advice.remedy_said import Said, Say
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.finding_types import Recommendation
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_result import RunAnalysis
from perfd.collectors.megatron import parse_file
from perfd.report.remedy_text import worded_remedy
from tests.trace_cache import timeline_class

ROOT = Path(__file__).resolve().parents[2]
KINETO = ROOT / "tests" / "data" / "captures" / "kineto_h100_megatron"
OPTIONS = ROOT / "tests" / "data" / "megatron_options"
EVIDENCE = ROOT / "docs" / "evidence" / "remedies_h100"
H100 = "NVIDIA H100 80GB HBM3"
# (trace, log, the measured run) of each recorded run of the job
RUNS = {
    "run1": (KINETO / "ops_default_rank0.json.gz", KINETO / "ops_megatron.log.gz",
             EVIDENCE / "run1_gather.json"),
    "run2": (KINETO / "ops_live_rank0.json.gz", KINETO / "ops_live_megatron.log.gz",
             EVIDENCE / "run2_verify.json"),
    # the check of the model as it stands: predicted live from a fresh capture, before the changes ran
    "run3": (KINETO / "ops_live3_rank0.json.gz", KINETO / "ops_live3_megatron.log.gz",
             EVIDENCE / "run3_verify.json"),
}


def _analysis(run: str) -> RunAnalysis:
    trace, log, _ = RUNS[run]
    parsed = parse_file(log, job="big2048")
    return analyze_run(
        parsed.job_info,
        parsed.records,
        gpu_name=H100,
        job_name="big2048",
        timeline=timeline_class(str(trace)),
        live=False,
    )


@pytest.fixture(scope="module")
def run1() -> RunAnalysis:
    return _analysis("run1")


def _recorded(release: str) -> dict[str, dict[str, Any]]:
    with gzip.open(OPTIONS / f"{release}.txt.gz", "rt") as f:
        return {r["option"]: r for r in map(json.loads, (x for x in f if x.startswith("{")))}


def _fitted(r: Recommendation) -> Advice:
    """The remedy a recommendation was made of (its words are the report's)."""
    assert isinstance(r, RemedyRecommendation) and r.facts is not None
    return r.facts.advice[0]


def _advice(a: RunAnalysis, **changes: Any) -> list[Advice]:
    b = a.summary.step_budget
    assert b is not None and a.config is not None
    return fit(FitContext(b, dataclasses.replace(a.config, **changes)))


@pytest.mark.slow
def test_every_option_named_exists_in_the_jobs_release_and_none_is_already_set(run1: RunAnalysis) -> None:
    """Megatron-LM 0.20 (the job's log): only the --no-* forms of the fusions exist, and the parser's
    own record says which options take a value. The job runs with attention dropout 0.1, timing level 2,
    micro-batch 4, no Transformer Engine, no Apex."""
    accepted = _recorded("0.20")
    args = run1.config.arguments if run1.config else {}
    recs = [r for r in run1.recommendations if r.remedy]
    assert len(recs) >= 5
    for r in recs:
        for f in [*r.flags, *r.remove]:
            option, _, value = f.partition(" ")
            assert option in accepted, (r.remedy, option)
            assert accepted[option]["takes_value"] == bool(value), (r.remedy, f)
            dest = accepted[option]["dest"]
            assert args.get(dest) != (value or "True"), f"{f} is already set"
        shown = worded_remedy(r)
        for text in (shown.action, shown.detail):
            for bad in (
                "--masked-softmax-fusion",
                "--bias-gelu-fusion",
                "--bias-dropout-fusion",
                "--gradient-accumulation-fusion",
                "--enable-cuda-graph",
            ):
                assert f"{bad} " not in f"{text} " or f"--no-{bad[2:]}" in text, (r.remedy, bad)
    by = {r.remedy: r for r in recs}
    assert by["fused_attention"].needs == ["transformer_engine"]
    assert _fitted(by["fused_attention"]).action.code is Say.FUSED_ATTENTION_INSTALL
    assert by["softmax_fusion"].needs == ["apex"] and by["softmax_fusion"].remove == [
        "--no-masked-softmax-fusion"
    ]
    cost = {k: _fitted(r).cost for k, r in by.items()}
    assert cost["attention_dropout"] is not None and cost["attention_dropout"].code is Say.DROPOUT_COST
    mem = cost["micro_batch"]  # the memory it needs, from the log's report: GiB of 80 GiB
    assert mem is not None and mem.code is Say.MEMORY_PEAK and mem.args[2] == pytest.approx(80, abs=0.5)
    assert cost["timer_sync"] is not None and cost["timer_sync"].code is Say.TIMER_COST  # the timers it takes
    # as the report words them (a golden phrase or two)
    assert "regularisation" in worded_remedy(by["attention_dropout"]).detail
    assert "GiB of 80 GiB" in worded_remedy(by["micro_batch"]).detail
    assert not any("gelu" in " ".join(r.flags) for r in recs)  # no bias here


@pytest.mark.slow
def test_the_same_budget_in_other_releases_names_their_own_options(run1: RunAnalysis) -> None:
    old = {a.remedy: a for a in _advice(run1, version="0.11.0")}
    assert [f.text() for f in old[RemedyId.CE_FUSION].flags] == ["--cross-entropy-loss-fusion"]
    assert "--cross-entropy-fusion-impl" not in _recorded("0.11")
    v10 = {a.remedy: a for a in _advice(run1, version="0.10.0")}
    fa = v10[RemedyId.FUSED_ATTENTION]
    assert [f.option for f in fa.flags] == ["--transformer-impl"]  # --attention-backend came in 0.11
    assert any(n.code is Say.NOT_IN_RELEASE and n.args == ("--attention-backend", "0.10") for n in fa.notes)
    unknown = {a.remedy: a for a in _advice(run1, version=None)}
    assert any(n.code is Say.VERSION_UNKNOWN for n in unknown[RemedyId.ATTENTION_DROPOUT].notes)


@pytest.mark.slow
def test_what_the_job_already_runs_with_is_not_suggested(run1: RunAnalysis) -> None:
    assert run1.config is not None
    args = {
        **run1.config.arguments,
        "attention_dropout": "0.0",
        "cross_entropy_loss_fusion": "True",
        "timing_log_level": "1",
    }
    got = {a.remedy for a in _advice(run1, arguments=args)}
    assert not got & {RemedyId.ATTENTION_DROPOUT, RemedyId.CE_FUSION, RemedyId.TIMER_SYNC}
    with_te = {a.remedy: a for a in _advice(run1, packages={"transformer_engine": "2.9.0", "apex": "absent"})}
    assert (
        with_te[RemedyId.FUSED_ATTENTION].needs == ()
        and with_te[RemedyId.FUSED_ATTENTION].action.code is Say.FUSED_ATTENTION_FLAGS
    )
    full = {a.remedy for a in _advice(run1, memory_mib={"allocated": 12_000.0, "max allocated": 70_000.0})}
    assert RemedyId.MICRO_BATCH not in full  # twice the activations would not fit in 80 GiB


@pytest.mark.slow
def test_recomputation_both_ways(run1: RunAnalysis) -> None:
    """A job recomputing every layer gets selective recomputation back (the repeated forward but core
    attention's); a job short of memory that recomputes nothing gets it as a memory remedy, its cost in
    step time said (a negative range: never promised as a gain)."""
    assert run1.config is not None
    full = {a.remedy: a for a in _advice(run1, arguments={**run1.config.arguments,
                                                          "recompute_granularity": "full"})}
    r = full[RemedyId.RECOMPUTE]
    assert [f.text() for f in r.flags] == ["--recompute-granularity selective"]
    room = r.cost.args[0] if r.cost is not None else None  # the log's peak of the GPU's 80 GiB
    assert r.gain is not None and r.gain.promised
    assert r.cost is not None and r.cost.code is Say.RECOMPUTE_LESS_COST
    assert isinstance(room, Said) and room.code is Say.PEAK_ROOM
    assert room.args[1] == pytest.approx(80, abs=0.5)
    tight = {a.remedy: a for a in _advice(run1, memory_mib={"allocated": 12_000.0,
                                                             "max allocated": 78_000.0})}
    m = tight[RemedyId.RECOMPUTE]
    assert m.gain is not None and m.gain.high_ms < 0 and not m.gain.promised
    assert RemedyId.RECOMPUTE not in {a.remedy for a in _advice(run1)}  # room, nothing recomputed: none


@pytest.mark.slow
def test_megatron_fused_layers_are_transformer_engines_on_the_gpus_side(run1: RunAnalysis) -> None:
    """In Megatron-LM the fused layers are Transformer Engine's, their gain the GPU time of the
    normalisation, activation and pointwise parts × FUSED_POINTWISE (widened by the run-to-run spread),
    not read from the replay: torch.compile's launch model is not theirs."""
    b = run1.summary.step_budget
    assert b is not None
    te = {a.remedy: a for a in _advice(run1)}[RemedyId.FUSED_LAYERS]
    ms = sum(b.ms(p) for p in (Part.NORM, Part.ACTIVATION, Part.POINTWISE))
    spread = run_spread_ms(b.step_ms, b.step_sd_ms)
    assert te.action.code in (Say.TE_LAYERS, Say.TE_LAYERS_INSTALL) and te.replay is None
    assert te.gain is not None
    assert te.gain.low_ms == pytest.approx(ms * FUSED_POINTWISE[0] - spread)
    assert te.gain.high_ms == pytest.approx(ms * FUSED_POINTWISE[1] + spread)


@pytest.mark.slow
def test_the_pytorch_job_gets_the_pytorch_equivalents(run1: RunAnalysis) -> None:
    got = {a.remedy: a for a in _advice(run1, framework=Framework.PYTORCH, version=None, arguments={})}
    assert got[RemedyId.FUSED_ATTENTION].action.code is Say.FUSED_ATTENTION_SDPA
    assert got[RemedyId.FUSED_LAYERS].action.code is Say.FUSED_LAYERS_COMPILE
    assert all(not a.flags for a in got.values())  # no command-line options outside Megatron-LM


def _measured(run: str) -> tuple[float, dict[str, float]]:
    """The run's base step (mean of the job as it ran, before and after the changes) and each applied
    change's steady median, by the remedy it applied."""
    doc = json.loads(RUNS[run][2].read_text())
    got = doc.get("measured") or doc.get("variants") or {}
    bases = [got[k]["steady"]["median_ms"] for k in ("base", "base_again")]
    names = {
        "attention_dropout_0": "attention_dropout",
        "ce_fusion_native": "cross_entropy_fusion",
        "timing_level_1": "timer_sync",
        "mbs_8": "micro_batch",
        "cuda_graph_local": "cuda_graphs",
        "cuda_graphs_unrecommended": "cuda_graphs",
    }
    return sum(bases) / 2, {
        names.get(k, k): v["steady"]["median_ms"]
        for k, v in got.items()
        if v["steady"].get("n") and k not in ("base", "base_again")
    }


def test_run3s_live_ranges_held_its_measurements() -> None:
    """Run 3's ranges were written by the live aggregator before any change ran (plan.json, model v2):
    each measured change lies inside the range given then. The ranges the model gives now from the same
    capture are checked against the same measurements below."""
    plan = json.loads(RUNS["run3"][2].read_text())["plan"]
    base, measured = _measured("run3")
    held = 0
    for remedy, v in plan.items():
        if v.get("gain_ms") and remedy in measured:
            lo, hi = v["gain_ms"]
            assert lo <= base - measured[remedy] <= hi, remedy
            held += 1
    assert held == 4


@pytest.mark.slow
@pytest.mark.parametrize("run", list(RUNS))
def test_each_measured_change_is_inside_its_predicted_range(run: str) -> None:
    """Every remedy applied one at a time on the H100 (attention dropout, micro-batch 8, timer level 1,
    cross-entropy fusion): its measured change of the steady step lies inside the range perfd gives
    from the run's own capture and log (the plan's: a remedy under 1% of the step is in the plan, not
    among the recommendations); no promised gain measured as a loss; CUDA graphs, which perfd does not
    recommend on this job, measured slower."""
    a = _analysis(run)
    base, measured = _measured(run)
    assert a.plan is not None
    by = {i.remedy: i for i in a.plan.items}
    checked = 0
    for remedy, step in measured.items():
        saved = base - step
        if remedy == "cuda_graphs":
            assert remedy not in by and saved < 0
            continue
        if remedy not in by:
            continue  # a variant the run measured that this job's advice does not hold
        lo, hi = by[remedy].gain_ms or (None, None)
        assert lo is not None and hi is not None and lo <= saved <= hi, (run, remedy, lo, saved, hi)
        assert not (lo > 0 and saved < 0)
        checked += 1
    assert checked >= 4


def test_the_options_table_is_what_the_recorded_parsers_say() -> None:
    """perfd.analytics.advice.megatron_options is generated (tools/megatron_options.py --table) from the
    option lists each release's own argument parser printed; regenerated here it is the same file, and it
    holds every option a remedy names."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "megatron_options_tool", ROOT / "tools" / "megatron_options.py"
    )
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    from perfd.analytics.advice.remedies import MEGATRON_OPTIONS

    assert (
        tool.table_text(list(MEGATRON_OPTIONS))
        == (ROOT / "perfd" / "analytics" / "advice" / "megatron_options.py").read_text()
    )
    assert mo.RELEASES[0] == "0.10" and mo.RELEASES[-1] == "0.20"
    assert mo.exists("--no-masked-softmax-fusion", "0.20.0+48a8f53") is True
    assert mo.exists("--masked-softmax-fusion", "0.20.0") is False
    assert (
        mo.exists("--cuda-graph-impl", "0.14.0") is False and mo.exists("--cuda-graph-impl", "0.15.1") is True
    )
    assert mo.exists("--attention-dropout", "0.9.0") is None  # before the recorded releases: unknown
