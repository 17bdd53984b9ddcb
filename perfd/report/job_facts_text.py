"""The job's own facts as they read (perfd.analytics.breakdown.job_facts.JobFacts), what its pointwise work
is made of (perfd.analytics.breakdown.pointwise_kinds.PointwiseKind), and what it already does that makes
a remedy moot (perfd.analytics.advice.moot.Moot): the words, declared once, here. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from perfd.analytics.advice.moot import Already, Moot
from perfd.analytics.advice.remedies import RemedyId
from perfd.analytics.breakdown.job_facts import (
    DataParallel,
    JobFacts,
    Loader,
    OptimizerImpl,
    Precision,
    SdpaBackend,
)
from perfd.analytics.breakdown.pointwise_kinds import PointwiseKind

KIND_TEXT: dict[PointwiseKind, str] = {
    PointwiseKind.CROSS_ENTROPY: "cross-entropy",
    PointwiseKind.GELU: "GELU",
    PointwiseKind.SILU: "SiLU and its gate's product",
    PointwiseKind.LAYER_NORM: "LayerNorm",
    PointwiseKind.RMS_NORM: "RMSNorm",
    PointwiseKind.ROTARY: "rotary embeddings",
    PointwiseKind.RESIDUAL: "residual adds",
    PointwiseKind.DROPOUT: "dropout",
    PointwiseKind.CAST: "casts",
    PointwiseKind.GRAD_FILL: "zero-fills of gradients",
    PointwiseKind.LOGITS_GRAD_FILL: "the zero-fill of the logits' gradient",
    PointwiseKind.EMBEDDING: "the embedding's",
    PointwiseKind.COPY: "copies and reshapes",
    PointwiseKind.OTHER: "other",
}
SDPA_TEXT: dict[SdpaBackend, str] = {
    SdpaBackend.FLASH: "FlashAttention", SdpaBackend.CUDNN: "cuDNN",
    SdpaBackend.EFFICIENT: "the memory-efficient kernel", SdpaBackend.MATH: "its math path (unfused)",
    SdpaBackend.UNFUSED: "softmax(QKᵀ)·V written out (unfused)",
}
OPTIMIZER_TEXT: dict[OptimizerImpl, str] = {
    OptimizerImpl.FUSED: "fused", OptimizerImpl.FOREACH: "foreach (multi-tensor)",
    OptimizerImpl.PER_PARAMETER: "a loop per parameter",
}
DP_TEXT: dict[DataParallel, str] = {
    DataParallel.NONE: "no data parallelism (no collective ran)", DataParallel.DDP: "DDP",
    DataParallel.FSDP: "FSDP",
}
PRECISION_TEXT: dict[Precision, str] = {Precision.BF16: "bf16", Precision.FP16: "fp16"}
LOADER_TEXT: dict[Loader, str] = {
    Loader.SINGLE_PROCESS: "a single-process DataLoader (num_workers=0)",
    Loader.MULTIPROCESSING: "a DataLoader with worker processes",
}
# The remedies a fact makes moot, as the finding names them
REMEDY_TEXT: dict[RemedyId, str] = {
    RemedyId.FUSED_LAYERS: "fused layers", RemedyId.FUSED_ATTENTION: "fused attention",
    RemedyId.SOFTMAX_FUSION: "the scale-mask-softmax fusion", RemedyId.FUSED_OPTIMIZER: "a fused optimizer",
    RemedyId.CUDA_GRAPHS: "CUDA graphs",
}
# What the job already does, short (a title) and in full (the observation)
ALREADY_SHORT: dict[Already, str] = {
    Already.COMPILED: "torch.compile", Already.FUSED_ATTENTION: "fused attention",
    Already.FUSED_OPTIMIZER: "a fused optimizer", Already.CUDA_GRAPHS: "CUDA graphs",
}
# The pointwise part's kinds named in its title: those holding this share of it at least, three at most
TITLE_KIND_SHARE = 0.1
TITLE_KINDS = 3


def kinds_of(made_of: Mapping[str, float]) -> list[tuple[PointwiseKind, float]]:
    """The pointwise part's kinds and their ms, largest first (a kind this version does not know: out)."""
    out = [(PointwiseKind(k), v) for k, v in made_of.items() if k in PointwiseKind.__members__.values()]
    return sorted(out, key=lambda kv: -kv[1])


def made_of_text(made_of: Mapping[str, float]) -> str:
    """``cross-entropy 9.9 ms; LayerNorm 9.1 ms; ...``, largest first (under 0.05 ms: left out)."""
    return "; ".join(f"{KIND_TEXT[k]} {v:.1f} ms" for k, v in kinds_of(made_of) if v >= 0.05)


def made_of_title(made_of: Mapping[str, float]) -> str:
    """The kinds that hold the part, for its name: "cross-entropy, LayerNorm, GELU"."""
    kinds = kinds_of(made_of)
    total = sum(v for _k, v in kinds)
    named = [k for k, v in kinds
             if k is not PointwiseKind.OTHER and total > 0 and v / total >= TITLE_KIND_SHARE]
    return ", ".join(KIND_TEXT[k] for k in named[:TITLE_KINDS])


def micro_text(f: JobFacts) -> str:
    n = f.micro_batches
    return f"{n:g} micro-batch{'es' if n != 1 else ''}" if n is not None else ""


def grad_accum_title(f: JobFacts) -> str:
    """The gradient reduction part of a job with no collective: autograd's AccumulateGrad only."""
    n = micro_text(f)
    return "gradient accumulation (autograd's AccumulateGrad" + (f" over {n})" if n else ")")


def grad_accum_holds(f: JobFacts) -> str:
    n = micro_text(f)
    return ("Autograd's AccumulateGrad adding each micro-batch's gradients into .grad"
            + (f" ({n} a step; no collective ran: no data parallelism)" if n
               else " (no collective ran: no data parallelism)") + " takes")


def sync_text(f: JobFacts) -> str:
    if f.syncs is None:
        return ""
    if not f.syncs:
        return "no synchronisation left the GPU idle"
    return "host syncs " + ", ".join(
        f"{s.owner or 'a bare sync'} in the {s.phase.value} phase {s.per_step:g} a step" for s in f.syncs)


def compiled_how(f: JobFacts) -> str:
    """How much of the model is compiled: its regions a step, its share of the kernel time."""
    how = []
    if f.compiled_regions is not None:
        how.append(f"{f.compiled_regions:g} compiled regions a step")
    if f.compiled_share is not None:
        how.append(f"{f.compiled_share:.0%} of the forward-backward kernel time launched by compiled code")
    return ", ".join(how)


def facts_text(f: JobFacts) -> str:
    """The job's facts in one line ("compiled (4 regions a step); SDPA on cuDNN; fused AdamW; ...")."""
    bits: list[str] = []
    if f.compiled is not None:
        if f.compiled:
            how = compiled_how(f)
            bits.append("compiled" + (f" ({how})" if how else ""))
        else:
            bits.append("eager (not compiled)")
    if f.cuda_graphs:
        bits.append("CUDA graphs")
    if f.sdpa is not None:
        bits.append(f"attention: {SDPA_TEXT[f.sdpa]}" if f.sdpa is SdpaBackend.UNFUSED
                    else f"attention: SDPA on {SDPA_TEXT[f.sdpa]}")
    if f.optimizer is not None:
        bits.append(f"optimizer: {OPTIMIZER_TEXT[f.optimizer]} {f.optimizer_class or ''}".rstrip())
    if f.checkpointing:
        bits.append("activation checkpointing")
    if f.precision is not None:
        bits.append(PRECISION_TEXT[f.precision])
    if f.micro_batches is not None:
        bits.append(f"{micro_text(f)} a step")
    if f.data_parallel is not None:
        dp = DP_TEXT[f.data_parallel]
        bits.append(dp + (f" ({f.dp_collectives:g} of its collectives a step)" if f.dp_collectives else ""))
    if f.syncs is not None:
        bits.append(sync_text(f))
    if f.loader is not None:
        bits.append(LOADER_TEXT[f.loader])
    if f.pin_memory is not None:
        bits.append("pinned host memory" if f.pin_memory else "pageable host memory")
    return "; ".join(bits)


def already_text(m: Moot) -> str:
    """What the job already does, with the facts that say so."""
    f = m.facts
    if m.already is Already.COMPILED:
        how = compiled_how(f)
        what = "already compiled" + (f": {how}" if how else "")
    elif m.already is Already.FUSED_ATTENTION and f.sdpa is not None:
        what = f"attention already fused: scaled_dot_product_attention on {SDPA_TEXT[f.sdpa]}"
    elif m.already is Already.FUSED_OPTIMIZER:
        what = f"the optimizer already fused: {f.optimizer_class or 'torch.optim'}(fused=True)"
    else:
        what = "launches already replayed from CUDA graphs"
    if m.dropped:
        what += " (no " + ", ".join(REMEDY_TEXT.get(r, r.value) for r in m.dropped) + " remedy)"
    return what


def already_words(moot: Sequence[Moot]) -> tuple[str, str]:
    """The finding of what the job already does: its title and observation."""
    return ("Already in place: " + ", ".join(ALREADY_SHORT[m.already] for m in moot),
            "No remedy for what the job already does: " + "; ".join(already_text(m) for m in moot) + ".")
