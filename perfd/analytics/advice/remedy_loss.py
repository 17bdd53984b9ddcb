"""The remedies for the logits and the cross-entropy of a plain PyTorch loop (the registry is
perfd.analytics.advice.remedy_catalog.REMEDIES; Megatron-LM's own fusion is its ce_fusion): a fused or
chunked linear + cross-entropy, and a compiled model that returns only its loss. Each reads the loss's
part of the budget (its log-softmax and NLL kernels, eager or Inductor's: perfd.analytics.breakdown
.op_parts.fused_kernel_part) and the zero gradient a compiled backward fills for outputs the loss does
not use, and names what it removes as atoms the plan counts once. Pure.
"""

from __future__ import annotations

from perfd.analytics.advice.remedies import (
    FUSED_CE_OF_LOSS,
    PACKAGE_CCE,
    PACKAGE_LIGER,
    REMOVED_KERNELS,
    Advice,
    FitContext,
    Framework,
    RemedyId,
    compiled,
    gain_of,
    named,
    op_ms,
    removal,
)
from perfd.analytics.advice.remedy_said import Say, say
from perfd.analytics.advice.trainer_switches import HF_TORCH_COMPILE
from perfd.analytics.breakdown.budget import StepBudget
from perfd.analytics.breakdown.step_parts import Part

LOSS_PASSES = "loss:passes"  # the loss's kernels over the logits (Megatron-LM's fusion names it too)
UNUSED_GRAD = "logits:zero_grad"  # the zero gradient of the logits a compiled model returns

# The zero gradient AOTAutograd materialises, in the compiled backward, for each output the loss does not
# use (op names, lower case: "CompiledFunctionBackward > aten::fill_")
_ZERO_FILLS = ("compiledfunctionbackward > aten::fill_", "compiledfunctionbackward > aten::zero_")

# A framework's words for each remedy, its options in one place (a framework's variant is one more entry)
_FUSED_CE_WORDS: dict[Framework, Say] = {Framework.PYTORCH: Say.FUSED_LINEAR_CE,
                                         Framework.HF_TRAINER: Say.FUSED_LINEAR_CE_HF,
                                         Framework.LIGHTNING: Say.FUSED_LINEAR_CE}
_LOSS_ONLY_WORDS: dict[Framework, Say] = {Framework.PYTORCH: Say.LOSS_ONLY,
                                          Framework.LIGHTNING: Say.LOSS_ONLY}


def unused_gradient_ms(b: StepBudget) -> float:
    """Per step, the fill kernels a compiled backward runs for outputs' gradients nobody gave it."""
    return sum(op_ms(p, *_ZERO_FILLS) for p in b.parts)


def compiled_job(b: StepBudget) -> bool:
    """torch.compile runs the model: its regions' ops in the budget, or the job's facts say so."""
    return compiled(b) or (b.facts is not None and b.facts.compiled is True)


def fused_linear_ce(c: FitContext) -> Advice | None:
    """The output layer and the cross-entropy in one (remedies.FUSED_CE_OF_LOSS): of the loss's kernels a
    share at most, and the zero gradient of the returned logits, which are no longer there. In a compiled
    model it is not offered: torch.compile already fuses the loss's passes into its own kernels, traced into
    Liger's launcher it fails, and called outside the compiled graph the fused loss made nanoGPT's step
    59 ms slower (133.3 -> 192.3 and 191.9 ms, two runs, bases either side: docs/evidence/loops_ab2_h200);
    the zero gradient of the returned logits is :func:`loss_only`'s there. The Trainer's flag stays: Liger
    patches the model itself, and its cost says when compile traces into it."""
    b, cfg = c.budget, c.config
    words = _FUSED_CE_WORDS.get(cfg.framework)
    loss = b.ms(Part.LOSS)
    if words is None or not named(b, loss):
        return None
    if compiled_job(b) and cfg.framework is not Framework.HF_TRAINER:
        return None
    zeros = unused_gradient_ms(b)
    removes = [removal(LOSS_PASSES, loss, FUSED_CE_OF_LOSS)]
    if zeros > 0:
        removes.append(removal(UNUSED_GRAD, zeros, REMOVED_KERNELS))
    basis = say(Say.FUSED_CE_BASIS, loss, *FUSED_CE_OF_LOSS,
                say(Say.ZERO_GRAD_GOES, zeros, *REMOVED_KERNELS) if zeros > 0 else None)
    gain = gain_of(removes, basis)
    cost = say(Say.FUSED_CE_COST_HF, HF_TORCH_COMPILE.option) if cfg.framework is Framework.HF_TRAINER \
        else say(Say.FUSED_CE_COST)
    return Advice(
        RemedyId.CE_FUSION,
        Part.LOSS,
        say(words),
        gain,
        cost=cost,
        needs_one=True,
        removes=tuple(removes),
        requires=(PACKAGE_LIGER, PACKAGE_CCE),
        installs=(PACKAGE_LIGER, PACKAGE_CCE),
    )


def loss_only(c: FitContext) -> Advice | None:
    """A compiled model that returns its logits beside its loss gets a zero gradient for them in every
    backward (the fill kernels under CompiledFunctionBackward): returned no more, they run no more."""
    b, cfg = c.budget, c.config
    words = _LOSS_ONLY_WORDS.get(cfg.framework)
    zeros = unused_gradient_ms(b)
    if words is None or not compiled(b) or not named(b, zeros):
        return None
    removes = (removal(UNUSED_GRAD, zeros, REMOVED_KERNELS),)
    return Advice(RemedyId.LOSS_ONLY, Part.POINTWISE, say(words),
                  gain_of(removes, say(Say.LOSS_ONLY_BASIS, zeros, *REMOVED_KERNELS)), removes=removes)
