"""What the job already does, as its own trace shows it: compiled or eager, CUDA graphs, the attention
kernel SDPA picked, the optimizer's implementation, activation checkpointing, data parallelism, the
precision its kernels run in, the micro-batches of a step, the host's synchronisations and who makes
them, the data loader. A remedy for something the job already does is moot (the table is
perfd.analytics.advice.moot), and a part of the step is named in the job's terms from these facts
(perfd.report.budget_text). Pure: the types, and the rules that read one name each; perfd.capture's
job_scan walks a trace with them, and pointwise_kinds says what a pointwise kernel is made of.

Every fact is None where the trace cannot say (no host side, no step marks, nothing of the kind ran):
absent, never guessed. Names are matched on lower case and come from real traces (tests/data/loops:
nanoGPT compiled, transformers' Trainer eager; tests/data/captures: Megatron-LM).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from perfd.analytics.breakdown.step_parts import Phase
from perfd.analytics.common import TextEnum
from perfd.core.record_json import JsonRecord, JsonWritten, absent
from perfd.core.typed import obj, objs

E = TypeVar("E", bound=TextEnum)

# A model counts as compiled when at least this share of its forward-backward kernel time was launched
# from compiled code (inductor's Triton kernels, or any kernel under a CompiledFunction): Megatron-LM
# compiles a few fused functions (bias-dropout-add, SwiGLU) and runs the rest eager, under 5% of its
# kernel time on the H100 recordings; nanoGPT's torch.compile(model) launches all of it so. Half
# separates the two with room on both sides.
COMPILED_MODEL_SHARE = 0.5


class SdpaBackend(TextEnum):
    """The kernel core attention runs in: one of SDPA's backends, or softmax(QKᵀ)·V written out."""

    FLASH = "flash"  # FlashAttention (SDPA's flash backend, or the flash-attn package)
    CUDNN = "cudnn"  # cuDNN's fused attention through SDPA
    EFFICIENT = "efficient"  # the memory-efficient (xFormers-derived) kernel through SDPA
    MATH = "math"  # SDPA's reference path: the scores written out, as unfused attention writes them
    UNFUSED = "unfused"  # batched matmuls around a softmax op of the model's own

    @property
    def fused(self) -> bool:
        """One kernel runs QKᵀ, the softmax and ·V: the s×s scores are never written."""
        return self in (SdpaBackend.FLASH, SdpaBackend.CUDNN, SdpaBackend.EFFICIENT)


class OptimizerImpl(TextEnum):
    """How the optimizer step runs over the parameters (torch.optim's implementations)."""

    FUSED = "fused"  # one fused kernel per group of tensors (fused=True: aten::_fused_adamw_)
    FOREACH = "foreach"  # multi-tensor kernels, one per operation (aten::_foreach_*)
    PER_PARAMETER = "per-parameter"  # a loop of kernels per parameter tensor


class DataParallel(TextEnum):
    NONE = "none"  # no collective ran in the trace: one process on one GPU
    DDP = "ddp"  # torch's DistributedDataParallel (its forward, its reducer's all-reduces)
    FSDP = "fsdp"  # FullyShardedDataParallel / fully_shard (all-gathers, reduce-scatters)


class Precision(TextEnum):
    """The reduced precision the step's kernels run in: autocast's dtype, or the model's own where it
    is cast whole (a trace shows the kernels, not which of the two chose them)."""

    BF16 = "bf16"
    FP16 = "fp16"


class Loader(TextEnum):
    """torch's DataLoader iterator, as the profiler names its ``__next__``."""

    SINGLE_PROCESS = "single-process"  # num_workers=0: the batch is made on the training thread
    MULTIPROCESSING = "multiprocessing"  # worker processes make the batches ahead


@dataclass(frozen=True)
class HostSync(JsonRecord):
    """Synchronisations the device stood idle after, of one owner in one phase: the op that made them
    (``aten::item``; "" or the runtime call for a bare one) and how many a step."""

    owner: str = field(metadata=absent(""))
    phase: Phase = field()
    per_step: float = field()


@dataclass(frozen=True)
class JobFacts(JsonWritten):
    """What the job does, each fact None where the trace cannot say."""

    compiled: bool | None = None  # inductor's Triton kernels or CompiledFunction ops ran
    compiled_regions: float | None = None  # compiled forward regions a step (graph breaks make more)
    compiled_share: float | None = None  # of the forward-backward kernel time, what compiled code launched
    cuda_graphs: bool | None = None  # cudaGraphLaunch calls
    sdpa: SdpaBackend | None = None
    optimizer: OptimizerImpl | None = None
    optimizer_class: str | None = None  # torch.optim's class ("AdamW", from Optimizer.step#AdamW.step)
    checkpointing: bool | None = None  # forward ops run again under the backward (activation checkpointing)
    data_parallel: DataParallel | None = None  # None: collectives ran, no wrapper named (Megatron-LM's own)
    dp_collectives: float | None = None  # a step: DDP's all-reduces (its buckets), FSDP's gathers, scatters
    precision: Precision | None = None
    micro_batches: float | None = None  # forward-backward passes between two optimizer steps
    syncs: tuple[HostSync, ...] | None = None  # None: no host side; (): none left the GPU idle
    loader: Loader | None = None
    pin_memory: bool | None = None

    @property
    def compiled_model(self) -> bool:
        """The model itself is compiled, not a few functions of it (COMPILED_MODEL_SHARE)."""
        return bool(self.compiled) and (self.compiled_share or 0.0) >= COMPILED_MODEL_SHARE

    @property
    def single_device(self) -> bool:
        """No collective ran: no data parallelism, no framework's own (Megatron-LM's) communication."""
        return self.data_parallel is DataParallel.NONE

    @staticmethod
    def from_json(v: object) -> JobFacts | None:
        """Back from :meth:`to_json`; None for anything else (a breakdown written before the facts). A
        fact this version does not know (a newer backend, a value that is not one) reads as unknown."""
        if not isinstance(v, Mapping):
            return None
        d = obj(v)
        syncs = d.get("syncs")
        return JobFacts(
            compiled=_bool(d.get("compiled")), compiled_regions=_num(d.get("compiled_regions")),
            compiled_share=_num(d.get("compiled_share")), cuda_graphs=_bool(d.get("cuda_graphs")),
            sdpa=_enum(SdpaBackend, d.get("sdpa")), optimizer=_enum(OptimizerImpl, d.get("optimizer")),
            optimizer_class=str(d["optimizer_class"]) if isinstance(d.get("optimizer_class"), str) else None,
            checkpointing=_bool(d.get("checkpointing")),
            data_parallel=_enum(DataParallel, d.get("data_parallel")),
            dp_collectives=_num(d.get("dp_collectives")), precision=_enum(Precision, d.get("precision")),
            micro_batches=_num(d.get("micro_batches")),
            syncs=tuple(s for x in objs(syncs) if (s := HostSync.from_json(x)) is not None)
            if isinstance(syncs, list) else None,
            loader=_enum(Loader, d.get("loader")), pin_memory=_bool(d.get("pin_memory")),
        )


def _bool(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def _enum(cls: type[E], v: object) -> E | None:
    try:
        return cls(str(v)) if v is not None else None
    except ValueError:
        return None


# --- the rules, one name each -------------------------------------------------------------------------
COMPILED_OPS = ("compiledfunction", "compiledfunctionbackward")  # AOTAutograd's autograd.Function
COMPILED_FORWARD = "compiledfunction"  # one a compiled forward region (graph breaks split a model in more)
COMPILED_ANNOTATION = "torch-compiled region"  # dynamo's record_function around a compiled frame
GRAPH_LAUNCHES = ("cudagraphlaunch", "cugraphlaunch")
CHECKPOINT = ("checkpointfunction", "torch/utils/checkpoint.py", "checkpoint_function")
# Ops a forward pass runs and a backward node never does: found under a backward node, they are the
# forward run again for activation checkpointing (non-reentrant checkpointing names no function)
FORWARD_ONLY = frozenset({"aten::linear", "aten::layer_norm", "aten::rms_norm", "aten::embedding",
                          "aten::scaled_dot_product_attention", "aten::dropout", "aten::gelu", "aten::silu"})
_SDPA: tuple[tuple[str, SdpaBackend], ...] = (
    ("_scaled_dot_product_flash_attention", SdpaBackend.FLASH),
    ("_flash_attention_forward", SdpaBackend.FLASH),
    ("flash_attn::", SdpaBackend.FLASH), ("flashattnfunc", SdpaBackend.FLASH),
    ("_scaled_dot_product_cudnn_attention", SdpaBackend.CUDNN),
    ("_cudnn_attention_forward", SdpaBackend.CUDNN),
    ("_scaled_dot_product_efficient_attention", SdpaBackend.EFFICIENT),
    ("_efficient_attention_forward", SdpaBackend.EFFICIENT),
    ("_scaled_dot_product_attention_math", SdpaBackend.MATH),
)
_FUSED_OPTIMIZER = ("aten::_fused_adam", "aten::_fused_sgd", "aten::_fused_adagrad")
_FOREACH = "aten::_foreach_"
_STEP_MARK = "optimizer.step#"  # torch.optim's record_function: Optimizer.step#AdamW.step
_DDP = ("distributeddataparallel", "c10d::reducer", "ddp::")
_FSDP = ("fullyshardeddataparallel", "fsdp::", "fsdp.", "fully_shard")
_COLLECTIVE_OPS = ("c10d::", "nccl:")
_DDP_COLLECTIVES = ("c10d::allreduce_", "nccl:all_reduce")
_FSDP_COLLECTIVES = ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "c10d::allgather_into_tensor",
                     "c10d::reduce_scatter_tensor")
# by a part of the iterator's class name that torchdata's stateful iterators keep
# (``_StatefulSingleProcessDataLoaderIter``, torchtitan's)
_LOADER = (("multiprocessingdataloaderiter", Loader.MULTIPROCESSING),
           ("singleprocessdataloaderiter", Loader.SINGLE_PROCESS))
_PIN_OPS = ("aten::pin_memory", "aten::_pin_memory")


def is_compiled_op(name: str) -> bool:
    low = name.lower()
    return low in COMPILED_OPS or low.startswith(COMPILED_ANNOTATION)


def is_compiled_kernel(name: str) -> bool:
    """Inductor's generated kernels (triton_poi_fused_*, triton_red_*, triton_per_*, triton_tem_*)."""
    return name.startswith("triton_")


def is_graph_launch(call: str) -> bool:
    return call.lower() in GRAPH_LAUNCHES


def is_checkpoint(name: str) -> bool:
    low = name.lower()
    return any(k in low for k in CHECKPOINT)


def sdpa_backend(op: str) -> SdpaBackend | None:
    """The SDPA backend an op runs (its dispatch to the kernel: aten::_scaled_dot_product_cudnn_attention)."""
    low = op.lower()
    return next((b for key, b in _SDPA if key in low), None)


def optimizer_kind(op: str) -> OptimizerImpl | None:
    """The implementation an op inside the optimizer's step belongs to (None: it says none by itself)."""
    low = op.lower()
    if low.startswith(_FUSED_OPTIMIZER):
        return OptimizerImpl.FUSED
    if low.startswith(_FOREACH):
        return OptimizerImpl.FOREACH
    return None


def optimizer_class(annotation: str) -> str | None:
    """``Optimizer.step#AdamW.step`` → ``AdamW``."""
    if not annotation.lower().startswith(_STEP_MARK):
        return None
    cls = annotation.split("#", 1)[1].split(".", 1)[0]
    return cls or None


def wrapper(name: str) -> DataParallel | None:
    """The data-parallel wrapper a range names (its forward, its hooks), or None."""
    low = name.lower()
    if any(k in low for k in _FSDP):
        return DataParallel.FSDP
    if any(k in low for k in _DDP):
        return DataParallel.DDP
    return None


def is_collective_op(name: str) -> bool:
    return name.lower().startswith(_COLLECTIVE_OPS)


def is_dp_collective(name: str, dp: DataParallel) -> bool:
    """One of the wrapper's own collectives: DDP's bucket all-reduces, FSDP's gathers and scatters."""
    low = name.lower()
    return low.startswith(_DDP_COLLECTIVES if dp is DataParallel.DDP else _FSDP_COLLECTIVES)


def loader_kind(annotation: str) -> Loader | None:
    low = annotation.lower()
    if not low.startswith("enumerate(dataloader)"):
        return None
    return next((k for key, k in _LOADER if key in low), None)


def is_pin_op(name: str) -> bool:
    return name.lower() in _PIN_OPS


def precision_of(kernel: str) -> Precision | None:
    """The reduced precision a kernel's name says it runs in (None: it does not say). cuDNN's attention
    kernels say "f16" for bf16 too: only the explicit spellings count."""
    low = kernel.lower()
    if "bf16" in low or "bfloat16" in low:
        return Precision.BF16
    if "c10::half" in low or "__half" in low or "fp16" in low or "float16" in low:
        return Precision.FP16
    return None
