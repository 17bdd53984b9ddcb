"""A job driven by a Hugging Face or Lightning Trainer gets each remedy in its trainer's own terms
(perfd.analytics.advice.trainer_switches): the Trainer's flags, set as flags (minutes), where it has a
switch; its own code (a LightningModule's) where it has none; a plain loop keeps the PyTorch words and
Megatron-LM its options. One step budget with every part a switch acts on, fitted for each framework."""

from __future__ import annotations

import pytest

from perfd.analytics.advice.remedies import Advice, Effort, FitContext, Framework, JobConfig, RemedyId
from perfd.analytics.advice.remedy_catalog import fit
from perfd.analytics.advice.remedy_said import Say
from perfd.analytics.advice.trainer_switches import SWITCHES
from perfd.analytics.breakdown.budget import BudgetPart, IdleCause, IdleShare, Phase, Source, StepBudget
from perfd.analytics.breakdown.recompute_seen import RecomputeSeen
from perfd.analytics.breakdown.step_parts import Part
from perfd.core.model import HF_TRAINER_FRAMEWORK, LIGHTNING_FRAMEWORK
from perfd.report.data_text import knobs_text
from perfd.report.remedy_text import detail_text, text


def _budget() -> StepBudget:
    """100 ms a step: a data wait, launch gaps, loop synchronisations, exposed communication, slow GEMMs,
    unfused attention, pointwise work and a foreach Adam, each large enough for its remedy."""
    parts = (
        BudgetPart(Part.DATA, 10.0, 0.10, Source.CAPTURE),
        BudgetPart(Part.IDLE_SHORT, 20.0, 0.20, Source.CAPTURE),
        BudgetPart(Part.IDLE_SYNC, 10.0, 0.10, Source.CAPTURE),
        BudgetPart(Part.COMM_EXPOSED, 10.0, 0.10, Source.CAPTURE),
        BudgetPart(Part.LINEAR, 20.0, 0.20, Source.CAPTURE, {"of_ceiling": 0.3, "at_ceiling_ms": 6.0}),
        BudgetPart(Part.ATTENTION, 10.0, 0.10, Source.CAPTURE),
        BudgetPart(Part.POINTWISE, 10.0, 0.10, Source.CAPTURE),
        BudgetPart(Part.OPTIMIZER, 10.0, 0.10, Source.CAPTURE, {"op_ms": {"aten::_foreach_addcdiv_": 8.0}}),
    )
    idle = (IdleShare(IdleCause.LAUNCH, Phase.LAYERS, "", 20.0, 400.0),
            IdleShare(IdleCause.SYNC, Phase.LAYERS, "aten::item", 10.0, 4.0))
    # and a forward recomputed in the backward (activation checkpointing): 8 ms of norm kernels a step
    return StepBudget(100.0, parts, (Source.CAPTURE,), iterations=3.0, idle=idle,
                      recompute=RecomputeSeen(200.0, 8.0, (("norm", 8.0),)))


def _fitted(framework: Framework) -> dict[RemedyId, Advice]:
    return {a.remedy: a for a in fit(FitContext(_budget(), JobConfig(framework=framework, dp=2)))}


def test_framework_of_names_the_trainers() -> None:
    assert Framework.of(HF_TRAINER_FRAMEWORK) is Framework.HF_TRAINER
    assert Framework.of(LIGHTNING_FRAMEWORK) is Framework.LIGHTNING
    assert all(f.hooked for f in (Framework.PYTORCH, Framework.HF_TRAINER, Framework.LIGHTNING))
    assert not Framework.MEGATRON.hooked and not Framework.TORCHTITAN.hooked


@pytest.mark.parametrize("framework", [Framework.HF_TRAINER, Framework.LIGHTNING, Framework.TORCHTITAN])
def test_each_remedy_with_a_switch_says_it_in_the_frameworks_terms(framework: Framework) -> None:
    got = _fitted(framework)
    plain = _fitted(Framework.PYTORCH)
    assert all(not a.flags for a in plain.values())  # a plain loop has no switch: code, as before
    switched = {r: by[framework] for r, by in SWITCHES.items() if framework in by}
    assert switched.keys() <= got.keys()  # the budget calls for every remedy with a switch
    for remedy, sw in switched.items():
        a = got[remedy]
        assert a.action.code is sw.said, remedy
        assert a.flags == sw.flags, remedy
        # a Trainer's flag is a flag; a change of the model or its module is code
        assert a.effort is (Effort.FLAG if sw.flags else Effort.CODE), remedy
        words = text(a.action)
        assert all(f.text() in words for f in sw.flags if sw.said.arity), (remedy, words)
        assert "Megatron" not in words


def test_the_hugging_face_trainers_words() -> None:
    got = _fitted(Framework.HF_TRAINER)
    said = {r: text(a.action) for r, a in got.items()}
    assert said[RemedyId.FUSED_LAYERS].startswith("Fused layers: --torch_compile (torch.compile)")
    layers = said[RemedyId.FUSED_LAYERS]
    assert "--use_liger_kernel" in layers and "liger-kernel" in layers
    assert said[RemedyId.CUDA_GRAPHS].startswith("CUDA graphs: --torch_compile_mode reduce-overhead")
    assert said[RemedyId.FUSED_OPTIMIZER].startswith("A fused optimizer: --optim adamw_torch_fused")
    assert "--per_device_train_batch_size" in said[RemedyId.BIGGER_GEMMS]
    assert "--gradient_accumulation_steps" in said[RemedyId.BIGGER_GEMMS]
    assert "--ddp_find_unused_parameters false" in said[RemedyId.OVERLAP_COMM]
    assert "--logging_nan_inf_filter false" in said[RemedyId.TIMER_SYNC]
    cost = got[RemedyId.TIMER_SYNC].cost
    assert cost is not None and cost.code is Say.NAN_FILTER_COST
    # the data loader: its flags set, its note the Trainer's knobs (what the run's data finding names too)
    data = got[RemedyId.DATA_LOADER]
    assert [f.text() for f in data.flags] == [
        "--dataloader_num_workers N", "--dataloader_persistent_workers", "--dataloader_prefetch_factor 4"]
    detail = detail_text(data, 100.0, None)
    assert "--dataloader_num_workers N" in detail and "DataLoader(" not in detail
    assert "effort: a flag (minutes)" in detail


def test_lightnings_words() -> None:
    got = _fitted(Framework.LIGHTNING)
    said = {r: text(a.action) for r, a in got.items()}
    layers = said[RemedyId.FUSED_LAYERS]
    # the network inside compiled, not the LightningModule (its self.log() recompiles when traced)
    assert "self.model = torch.compile(" in layers and "not the LightningModule" in layers
    assert "torch.compile(model)" not in layers
    graphs = said[RemedyId.CUDA_GRAPHS]
    assert 'mode="reduce-overhead"' in graphs and "not the LightningModule" in graphs
    assert "configure_optimizers()" in said[RemedyId.FUSED_OPTIMIZER]
    assert "accumulate_grad_batches" in said[RemedyId.BIGGER_GEMMS]
    assert "log_every_n_steps=N" in said[RemedyId.TIMER_SYNC] and "on_step=False" in said[RemedyId.TIMER_SYNC]
    assert "train_dataloader()" in detail_text(got[RemedyId.DATA_LOADER], 100.0, None)
    assert "pin_memory" not in knobs_text(Framework.LIGHTNING, cpu_only=True)


def test_megatron_keeps_its_options() -> None:
    got = _fitted(Framework.MEGATRON)
    assert got[RemedyId.BIGGER_GEMMS].action.code is Say.BIGGER_GEMMS_MEGATRON
    assert all(f.option.startswith("--") and "_" not in f.option
               for a in got.values() for f in a.flags)


def test_torchtitans_words_are_its_config_keys_each_a_flag() -> None:
    got = _fitted(Framework.TORCHTITAN)
    said = {r: text(a.action) for r, a in got.items()}
    assert said[RemedyId.FUSED_LAYERS].startswith("Fused layers: --compile.enable")
    off = "Activation checkpointing off: --activation_checkpoint.mode none"
    assert said[RemedyId.RECOMPUTE].startswith(off)
    assert next(f.text() for f in got[RemedyId.DATA_LOADER].flags) == "--training.dataloader.num_workers N"
    for r in (RemedyId.FUSED_LAYERS, RemedyId.RECOMPUTE, RemedyId.DATA_LOADER):
        assert got[r].effort is Effort.FLAG, r
    # the recompute's gain is its kernels' time (no replay here): all of it at most, 0.8 of it at least
    g = got[RemedyId.RECOMPUTE].gain
    assert g is not None and g.low_ms <= 6.4 and g.high_ms >= 8.0
    assert "memory" in text(got[RemedyId.RECOMPUTE].cost)
    assert knobs_text(Framework.TORCHTITAN).startswith("torchtitan: --training.dataloader.num_workers N")


def test_a_budget_without_recompute_offers_no_checkpointing_remedy() -> None:
    import dataclasses

    b = dataclasses.replace(_budget(), recompute=RecomputeSeen(0.0, 0.0))
    got = {a.remedy for a in fit(FitContext(b, JobConfig(framework=Framework.TORCHTITAN)))}
    assert RemedyId.RECOMPUTE not in got
