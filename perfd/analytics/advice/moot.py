"""No remedy for what the job already does: the one table of each remedy and the fact of the job's own
trace (perfd.analytics.breakdown.job_facts) that makes it moot, applied where the remedies are fitted
(perfd.analytics.advice.budget_findings.fitted: the recommendations and the plan alike), never as a
check inside each remedy. A remedy the table drops is named in the budget's findings with what the job
does instead (:class:`Moot`: typed, worded by perfd.report.budget_text). Pure.

A fact the trace cannot say (None) makes nothing moot: the remedy stands as the budget fits it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from perfd.analytics.advice.remedies import Advice, RemedyId
from perfd.analytics.breakdown.job_facts import JobFacts, OptimizerImpl
from perfd.analytics.common import TextEnum


class Already(TextEnum):
    """What the job already does that a remedy would have it do."""

    COMPILED = "compiled"  # torch.compile(model): its pointwise chains fused by inductor
    FUSED_ATTENTION = "fused_attention"  # SDPA on a fused backend (flash, cuDNN, memory-efficient)
    FUSED_OPTIMIZER = "fused_optimizer"  # torch.optim's fused=True
    CUDA_GRAPHS = "cuda_graphs"  # its launches replayed from CUDA graphs


def _fused_attention(f: JobFacts) -> bool:
    return f.sdpa is not None and f.sdpa.fused


# The table: each remedy, what the job does that makes it moot, and the fact that says so. Fused
# attention makes the fused scale-mask-softmax moot too (nothing of softmax(QKᵀ) is left to fuse). The
# foreach optimizer does not make the fused one moot: the fused kernel makes one pass where foreach makes
# one per operation (perfd.analytics.advice.remedies.FUSED_ADAM_SAVES).
MOOT_BY: Mapping[RemedyId, tuple[Already, Callable[[JobFacts], bool]]] = {
    RemedyId.FUSED_LAYERS: (Already.COMPILED, lambda f: f.compiled_model),
    RemedyId.FUSED_ATTENTION: (Already.FUSED_ATTENTION, _fused_attention),
    RemedyId.SOFTMAX_FUSION: (Already.FUSED_ATTENTION, _fused_attention),
    RemedyId.FUSED_OPTIMIZER: (Already.FUSED_OPTIMIZER, lambda f: f.optimizer is OptimizerImpl.FUSED),
    RemedyId.CUDA_GRAPHS: (Already.CUDA_GRAPHS, lambda f: f.cuda_graphs is True),
}


@dataclass(frozen=True)
class Moot:
    """Something the job already does, the facts that say so, and the remedies the budget had fitted
    that it makes moot (none: the facts alone name it; the remedy's own check left it out already)."""

    already: Already
    facts: JobFacts
    dropped: tuple[RemedyId, ...] = ()


def moot_by(remedy: RemedyId, facts: JobFacts | None) -> Already | None:
    """What the job already does that makes ``remedy`` moot; None: nothing (or the trace cannot say)."""
    entry = MOOT_BY.get(remedy)
    if facts is None or entry is None:
        return None
    already, holds = entry
    return already if holds(facts) else None


def split(advice: Sequence[Advice], facts: JobFacts | None) -> tuple[list[Advice], tuple[Moot, ...]]:
    """The remedies that stand, and what the job already does of the table's (each once, in the table's
    order), with the remedies of ``advice`` it drops."""
    kept = [a for a in advice if moot_by(a.remedy, facts) is None]
    if facts is None:
        return kept, ()
    done: dict[Already, list[RemedyId]] = {}
    for r in MOOT_BY:
        already = moot_by(r, facts)
        if already is not None:
            done.setdefault(already, [])
    for a in advice:
        already = moot_by(a.remedy, facts)
        if already is not None:
            done[already].append(a.remedy)
    return kept, tuple(Moot(k, facts, tuple(v)) for k, v in done.items())
