"""The job's own facts from its trace (perfd.capture.job_scan, perfd.analytics.breakdown.job_facts), no
remedy for what the job already does (perfd.analytics.advice.moot), and the parts named in the job's terms
(perfd.report.budget_text), on the two published loops recorded on one H200 (tests/data/loops: nanoGPT's
train.py, torch.compile'd; transformers' run_clm.py, eager) against what their meta.json says each job
does, and on a Megatron-LM recording (tests/data/captures), whose remedies and words stay as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfd.analytics.advice.budget_findings import (
    BudgetContext,
    BudgetFinding,
    BudgetSaid,
    plan_of,
    remedies,
)
from perfd.analytics.advice.capture_findings import CaptureDiagnosis, diagnose_capture
from perfd.analytics.advice.moot import Already, split
from perfd.analytics.advice.remedies import RemedyId
from perfd.analytics.breakdown.budget import StepBudget
from perfd.analytics.breakdown.capture_budget import from_capture
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.analytics.breakdown.job_facts import (
    DataParallel,
    HostSync,
    JobFacts,
    Loader,
    OptimizerImpl,
    Precision,
    SdpaBackend,
)
from perfd.analytics.breakdown.pointwise_kinds import PointwiseKind
from perfd.analytics.breakdown.step_parts import Part, Phase
from perfd.capture.bookkeeping import device_summary
from perfd.report.budget_text import part_title, worded_budget
from perfd.report.grade_text import worded, worded_recommendation
from perfd.report.remedy_text import worded_plan
from tests.trace_cache import analyze_chrome_trace

# Its tests share what the module computes once: one xdist worker runs them (conftest.py)
pytestmark = pytest.mark.xdist_group("job_facts")

DATA = Path(__file__).resolve().parents[1] / "data"
NANOGPT = DATA / "loops" / "nanogpt_h200"
HF = DATA / "loops" / "hf_clm_h200"
MEGATRON = DATA / "captures" / "kineto_h100_megatron" / "ops_default_rank0.json.gz"


def _meta(folder: Path) -> dict[str, object]:
    facts = json.loads((folder / "meta.json").read_text())["facts"]
    assert isinstance(facts, dict)
    return facts


@pytest.fixture(scope="module")
def nanogpt() -> DeviceBreakdown:
    return analyze_chrome_trace(NANOGPT / "trace.json.xz").device(0)


@pytest.fixture(scope="module")
def hf() -> DeviceBreakdown:
    return analyze_chrome_trace(HF / "trace.json.xz").device(0)


@pytest.fixture(scope="module")
def megatron() -> DeviceBreakdown:
    return analyze_chrome_trace(MEGATRON).device(0)


def _diagnosis(d: DeviceBreakdown) -> CaptureDiagnosis:
    diag = diagnose_capture([d], label="trace.json.xz")
    diag.findings = [worded(f) for f in diag.findings]
    diag.recommendations = [worded_recommendation(r) for r in diag.recommendations]
    return diag


def _budget(d: DeviceBreakdown) -> StepBudget:
    b = from_capture(d, d.trace_steps, basis="trace.json.xz", steps_from="trace")
    assert b is not None
    return b


def test_nanogpt_facts_are_what_its_meta_says(nanogpt: DeviceBreakdown) -> None:
    meta = _meta(NANOGPT)
    f = nanogpt.facts
    assert f is not None
    assert f.compiled is meta["compiled"] is True and f.compiled_model
    # one CompiledFunction a forward (no graph break), four forwards a step
    assert f.compiled_regions == 4.0 and f.compiled_share is not None and f.compiled_share > 0.95
    assert f.sdpa is SdpaBackend.CUDNN and str(meta["sdpa"]).startswith("cudnn")
    assert (f.optimizer, f.optimizer_class) == (OptimizerImpl.FUSED, "AdamW")  # "AdamW fused=True"
    assert f.precision is Precision.BF16 and meta["autocast"] == "bf16"
    assert f.micro_batches == meta["micro_batches_per_step"] == 4
    assert f.data_parallel is DataParallel.NONE and meta["ddp"] is False
    assert f.cuda_graphs is False and f.checkpointing is False
    # loss.item() once an iteration, in the optimizer phase (log_interval=1)
    assert f.syncs == (HostSync("aten::item", Phase.OPTIMIZER, 1.0),)
    assert f.loader is None and f.pin_memory is True  # memmap get_batch, pinned, no DataLoader


def test_hf_facts_are_what_its_meta_says(hf: DeviceBreakdown) -> None:
    meta = _meta(HF)
    f = hf.facts
    assert f is not None
    assert f.compiled is meta["compiled"] is False and not f.compiled_model and f.compiled_regions is None
    assert f.sdpa is SdpaBackend.CUDNN and str(meta["sdpa"]).startswith("cudnn")
    assert f.precision is Precision.BF16 and str(meta["autocast"]).startswith("bf16")
    assert f.micro_batches == meta["micro_batches_per_step"] == 4
    assert f.data_parallel is DataParallel.NONE and meta["ddp"] is False
    assert f.loader is Loader.SINGLE_PROCESS and f.pin_memory is True  # num_workers 0, pin_memory True
    assert f.optimizer is OptimizerImpl.FUSED  # the Trainer's default adamw_torch_fused
    assert f.syncs and all(s.per_step > 0 for s in f.syncs)


@pytest.mark.parametrize("job", ["nanogpt", "hf"])
def test_attention_through_a_fused_sdpa_backend_is_fused_whatever_the_loss_softmax(
        job: str, request: pytest.FixtureRequest) -> None:
    d: DeviceBreakdown = request.getfixturevalue(job)
    # the cross-entropy's log-softmax kernels ran (the loss's part), none of attention's own
    assert d.parts_ms.get("loss", 0.0) > 3.0 and not d.softmax_ms
    assert d.attention_fused and d.facts is not None and d.facts.sdpa is not None
    att = _budget(d).get(Part.ATTENTION)
    assert att is not None and att.detail.get("fused") is True


def _remedies(diag: CaptureDiagnosis) -> set[RemedyId]:
    got = {RemedyId(r.remedy) for r in diag.recommendations if r.remedy}
    for f in diag.findings:  # the smaller remedies' finding names its own in its evidence
        got |= {RemedyId(x["remedy"]) for x in f.evidence.get("remedies", []) if isinstance(x, dict)}
    return got


def test_no_remedy_for_what_nanogpt_already_does(nanogpt: DeviceBreakdown) -> None:
    diag = _diagnosis(nanogpt)
    got = _remedies(diag)
    assert not got & {RemedyId.FUSED_LAYERS, RemedyId.FUSED_ATTENTION, RemedyId.FUSED_OPTIMIZER}
    words = " ".join(f"{r.action} {r.detail}" for r in diag.recommendations)
    words += " ".join(f.observation for f in diag.findings if f.id.startswith("budget-minor"))
    assert "torch.compile(model)" not in words and "scaled_dot_product_attention" not in words
    plan = worded_plan(plan_of(BudgetContext(_budget(nanogpt))))
    assert plan is None or not {i.remedy for i in plan.items} & {RemedyId.FUSED_LAYERS.value,
                                                                  RemedyId.FUSED_ATTENTION.value}


def test_no_fused_attention_remedy_for_a_job_on_sdpa(hf: DeviceBreakdown) -> None:
    diag = _diagnosis(hf)
    got = _remedies(diag)
    assert RemedyId.FUSED_ATTENTION not in got
    assert RemedyId.FUSED_LAYERS in got  # eager: torch.compile is still its remedy
    for r in diag.recommendations:
        assert "scaled_dot_product_attention" not in r.action and "sdpa" not in r.action.lower()


def test_what_the_job_already_does_is_said_where_its_remedy_is_dropped(nanogpt: DeviceBreakdown) -> None:
    b = _budget(nanogpt)
    fs, _recs = remedies(BudgetContext(b))
    (already,) = [f for f in fs if isinstance(f, BudgetFinding) and f.facts is not None
                  and f.facts.said is BudgetSaid.ALREADY]
    assert already.facts is not None
    by = {m.already: m for m in already.facts.moot}
    assert set(by) == {Already.COMPILED, Already.FUSED_ATTENTION, Already.FUSED_OPTIMIZER}
    assert by[Already.COMPILED].dropped == (RemedyId.FUSED_LAYERS,)  # fitted, then dropped
    assert by[Already.COMPILED].facts.compiled_regions == 4.0
    shown = worded_budget(already)
    assert shown.title.startswith("Already in place: torch.compile")
    assert "4 compiled regions a step" in shown.observation and "cuDNN" in shown.observation


def test_gradient_accumulation_is_autograds_over_the_micro_batches(nanogpt: DeviceBreakdown,
                                                                   hf: DeviceBreakdown) -> None:
    for d in (nanogpt, hf):
        b = _budget(d)
        p = b.get(Part.GRAD_REDUCE)
        assert p is not None
        want = "gradient accumulation (autograd's AccumulateGrad over 4 micro-batches)"
        assert part_title(p, b.facts) == want
    (f,) = [f for f in _diagnosis(nanogpt).findings if f.id.startswith("budget-grad_reduce")]
    assert "AccumulateGrad" in f.observation
    assert "main_grad" not in f.observation + f.title and "data-parallel machinery" not in f.observation


def _made_of(d: DeviceBreakdown) -> list[PointwiseKind]:
    p = _budget(d).get(Part.POINTWISE)
    assert p is not None
    made = p.detail.get("made_of")
    assert isinstance(made, dict) and sum(made.values()) == pytest.approx(p.ms)
    return [PointwiseKind(k) for k in made]  # largest first


def test_nanogpt_pointwise_is_its_gelu_and_layer_norm_beside_its_loss(nanogpt: DeviceBreakdown) -> None:
    # inductor's log-softmax kernels are the loss's own part (cross-entropy), not pointwise work
    assert nanogpt.parts_ms.get("loss", 0.0) > 9.0
    kinds = _made_of(nanogpt)
    assert set(kinds[:3]) == {PointwiseKind.GELU, PointwiseKind.LAYER_NORM, PointwiseKind.CAST}
    assert PointwiseKind.LOGITS_GRAD_FILL in kinds and PointwiseKind.CROSS_ENTROPY not in kinds[:3]
    (f,) = [f for f in _diagnosis(nanogpt).findings if f.id.startswith("budget-pointwise")]
    for words in ("GELU", "LayerNorm", "the zero-fill of the logits' gradient"):
        assert words in f.observation
    assert "residual adds, hidden dropout, casts, reshapes" not in f.observation
    assert f.title.startswith("Pointwise: ")


def test_hf_pointwise_is_its_rotary_rms_norm_and_silu(hf: DeviceBreakdown) -> None:
    kinds = _made_of(hf)
    assert kinds[:2] == [PointwiseKind.ROTARY, PointwiseKind.RMS_NORM]
    assert PointwiseKind.SILU in kinds and PointwiseKind.RESIDUAL in kinds
    (f,) = [f for f in _diagnosis(hf).findings if f.id.startswith("budget-pointwise")]
    assert "rotary embeddings" in f.observation and "RMSNorm" in f.observation and "SiLU" in f.observation


def test_the_facts_travel_as_json_and_an_older_breakdown_still_reads(nanogpt: DeviceBreakdown) -> None:
    back = DeviceBreakdown.from_json(json.loads(json.dumps(nanogpt.to_json())))
    assert back is not None and back.facts == nanogpt.facts and back.made_of == nanogpt.made_of
    (summary,) = device_summary(type("A", (), {"devices": (nanogpt,)})())  # the agent's event payload
    sent = DeviceBreakdown.from_json(json.loads(json.dumps(summary)))
    assert sent is not None and sent.facts is not None and sent.facts.sdpa is SdpaBackend.CUDNN
    old = {k: v for k, v in nanogpt.to_json().items() if k not in ("facts", "made_of")}
    before = DeviceBreakdown.from_json(old)
    assert before is not None and before.facts is None and before.made_of == {}
    b = _budget(nanogpt)
    assert StepBudget.from_json(json.loads(json.dumps(b.to_json()))) == b
    kept = b.to_json()
    del kept["facts"]
    got = StepBudget.from_json(kept)
    assert got is not None and got.facts is None
    assert JobFacts.from_json({"sdpa": "a-newer-backend", "micro_batches": "4"}) == JobFacts()


@pytest.mark.slow
def test_megatron_keeps_its_remedies_and_words(megatron: DeviceBreakdown) -> None:
    """Megatron-LM compiles a few fused functions and runs the rest eager, with torch's foreach AdamW and
    its own collectives: nothing of the table is moot, and its parts keep their words."""
    f = megatron.facts
    assert f is not None and f.compiled and not f.compiled_model
    assert f.sdpa is SdpaBackend.UNFUSED and f.optimizer is OptimizerImpl.FOREACH and f.data_parallel is None
    assert not megatron.attention_fused
    b = _budget(megatron)
    assert split([], b.facts) == ([], ())
    grad, pointwise = b.get(Part.GRAD_REDUCE), b.get(Part.POINTWISE)
    assert grad is not None and part_title(grad, b.facts).startswith("gradient accumulation (main_grad +=")
    assert pointwise is not None and part_title(pointwise, b.facts) == "other pointwise"
