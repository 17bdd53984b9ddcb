"""The rules under the job's facts, on names as real traces spell them: what a pointwise op or kernel
computes (perfd.analytics.breakdown.pointwise_kinds), the table of remedies the job's facts make moot
(perfd.analytics.advice.moot), and the facts' JSON (perfd.analytics.breakdown.job_facts)."""

from __future__ import annotations

import json

import pytest

from perfd.analytics.advice.moot import MOOT_BY, Already, moot_by, split
from perfd.analytics.advice.remedies import Advice, RemedyId
from perfd.analytics.advice.remedy_said import Say, say
from perfd.analytics.breakdown.job_facts import (
    DataParallel,
    HostSync,
    JobFacts,
    OptimizerImpl,
    Precision,
    SdpaBackend,
    precision_of,
    sdpa_backend,
)
from perfd.analytics.breakdown.pointwise_kinds import PointwiseKind as K
from perfd.analytics.breakdown.pointwise_kinds import kernel_kind, sequence_kinds
from perfd.analytics.breakdown.step_parts import Part, Phase

# One decoder layer of transformers' eager Llama as the profiler lists its top-level forward ops (views
# left out), from tests/data/loops/hf_clm_h200: the residual add, RMSNorm written out, the projections,
# rotary embeddings for q and k, SDPA, the output projection, the residual, RMSNorm, the SwiGLU MLP.
LLAMA_LAYER = ["aten::add", "aten::to", "aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul",
               "aten::to", "aten::mul", "aten::linear", "aten::linear", "aten::linear",
               "aten::mul", "aten::neg", "aten::cat", "aten::mul", "aten::add",
               "aten::mul", "aten::neg", "aten::cat", "aten::mul", "aten::add",
               "aten::scaled_dot_product_attention", "aten::linear", "aten::add",
               "aten::to", "aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul", "aten::to",
               "aten::mul", "aten::linear", "aten::silu", "aten::linear", "aten::mul", "aten::linear"]


def test_an_eager_llama_layers_pointwise_ops_by_their_neighbours() -> None:
    got = sequence_kinds(LLAMA_LAYER)
    assert got[0] is None  # the residual add before the norm is not the norm's (its own name says)
    assert got[1:9] == [K.RMS_NORM] * 8
    assert got[12:17] == [K.ROTARY] * 5 and got[17:22] == [K.ROTARY] * 5
    assert got[24] is None and got[25:33] == [K.RMS_NORM] * 8
    assert got[36] is K.SILU  # act(gate(x)) * up(x)
    assert got[9] is None and got[22] is None  # the linears and SDPA are other parts'


@pytest.mark.parametrize(("name", "kind"), [
    # inductor's kernels of tests/data/loops/nanogpt_h200, and ATen's
    ("triton_red_fused__log_softmax__log_softmax_backward_data__to_copy_add_arange_eq_expand_nll_loss_"
     "backward_nll_loss_forward_scalar_tensor_view_3", K.CROSS_ENTROPY),
    ("triton_per_fused__to_copy_add_native_layer_norm_backward_view_5", K.LAYER_NORM),
    ("triton_per_fused__to_copy_add_embedding_dense_backward_native_layer_norm_native_layer_norm_backward_"
     "nll_loss_forward_view_10", K.LAYER_NORM),
    ("triton_poi_fused__unsafe_view_gelu_gelu_backward_view_4", K.GELU),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", K.RMS_NORM),
    ("triton_poi_fused__to_copy_view_2", K.CAST),
    ("triton_poi_fused__to_copy_t_4", K.CAST),
    ("triton_poi_fused__to_copy_add_13", K.RESIDUAL),
    ("triton_poi_fused_cat_transpose_view_7", K.COPY),
    ("triton_poi_fused_embedding_1", K.EMBEDDING),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::Tensor"
     "IteratorBase&)>", K.CAST),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::Binary"
     "Functor<float, float, float, at::native::binary_internal::MulFunctor<float> > >", None),
])
def test_a_kernels_kind_by_its_name(name: str, kind: K | None) -> None:
    assert kernel_kind(name) is kind


@pytest.mark.parametrize(("op", "backend"), [
    ("aten::_scaled_dot_product_cudnn_attention", SdpaBackend.CUDNN),
    ("aten::_scaled_dot_product_flash_attention", SdpaBackend.FLASH),
    ("aten::_flash_attention_forward", SdpaBackend.FLASH),
    ("aten::_scaled_dot_product_efficient_attention", SdpaBackend.EFFICIENT),
    ("aten::_scaled_dot_product_attention_math", SdpaBackend.MATH),
    ("aten::scaled_dot_product_attention", None),  # the dispatcher: it names no backend
])
def test_the_sdpa_backend_by_the_op_it_dispatched_to(op: str, backend: SdpaBackend | None) -> None:
    assert sdpa_backend(op) is backend


def test_precision_by_the_explicit_spellings_only() -> None:
    assert precision_of("void at::native::FillFunctor<c10::BFloat16>") is Precision.BF16
    assert precision_of("ampere_fp16_s16816gemm_fp16_128x128") is Precision.FP16
    # cuDNN's attention says f16 for a bf16 job too
    assert precision_of("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7") is None


def _advice(r: RemedyId) -> Advice:
    return Advice(r, Part.POINTWISE, say(Say.FUSED_LAYERS_COMPILE), None)


COMPILED = JobFacts(compiled=True, compiled_regions=4.0, compiled_share=0.99, sdpa=SdpaBackend.CUDNN,
                    optimizer=OptimizerImpl.FUSED, cuda_graphs=False)


def test_the_table_drops_what_the_job_already_does() -> None:
    fitted = [_advice(r) for r in (RemedyId.FUSED_LAYERS, RemedyId.FUSED_ATTENTION, RemedyId.DATA_LOADER)]
    kept, moot = split(fitted, COMPILED)
    assert [a.remedy for a in kept] == [RemedyId.DATA_LOADER]
    assert [(m.already, m.dropped) for m in moot] == [
        (Already.COMPILED, (RemedyId.FUSED_LAYERS,)),
        (Already.FUSED_ATTENTION, (RemedyId.FUSED_ATTENTION,)),  # the softmax fusion: not fitted, none
        (Already.FUSED_OPTIMIZER, ()),
    ]


@pytest.mark.parametrize(("facts", "remedy"), [
    (None, RemedyId.FUSED_LAYERS),  # the trace cannot say: the remedy stands
    (JobFacts(compiled=True, compiled_share=0.02), RemedyId.FUSED_LAYERS),  # a few compiled functions
    (JobFacts(optimizer=OptimizerImpl.FOREACH), RemedyId.FUSED_OPTIMIZER),  # fused still saves passes
    (JobFacts(sdpa=SdpaBackend.MATH), RemedyId.FUSED_ATTENTION),  # SDPA's math path is unfused
    (JobFacts(sdpa=SdpaBackend.UNFUSED), RemedyId.SOFTMAX_FUSION),
    (JobFacts(cuda_graphs=None), RemedyId.CUDA_GRAPHS),
])
def test_a_fact_that_does_not_hold_drops_nothing(facts: JobFacts | None, remedy: RemedyId) -> None:
    assert moot_by(remedy, facts) is None
    assert split([_advice(remedy)], facts)[0] == [_advice(remedy)]


def test_cuda_graphs_in_use_make_the_graphs_remedy_moot() -> None:
    assert moot_by(RemedyId.CUDA_GRAPHS, JobFacts(cuda_graphs=True)) is Already.CUDA_GRAPHS
    assert set(MOOT_BY) >= {RemedyId.FUSED_LAYERS, RemedyId.FUSED_ATTENTION, RemedyId.FUSED_OPTIMIZER,
                            RemedyId.CUDA_GRAPHS}


def test_the_facts_read_back_from_json() -> None:
    f = JobFacts(compiled=False, cuda_graphs=False, sdpa=SdpaBackend.FLASH, optimizer=OptimizerImpl.FOREACH,
                 optimizer_class="AdamW", checkpointing=True, data_parallel=DataParallel.DDP,
                 dp_collectives=6.0,
                 precision=Precision.FP16, micro_batches=8.0,
                 syncs=(HostSync("aten::item", Phase.LAYERS, 2.0), HostSync("", Phase.OPTIMIZER, 1.0)),
                 pin_memory=False)
    assert JobFacts.from_json(json.loads(json.dumps(f.to_json()))) == f
    assert JobFacts.from_json(None) is None and JobFacts.from_json([1]) is None
    # a sync of a phase this version does not know is left out; the others read
    d = f.to_json()
    d["syncs"] = [{"owner": "x", "phase": "later", "per_step": 1}, {"owner": "y", "phase": "optimizer",
                                                                    "per_step": 3}]
    got = JobFacts.from_json(d)
    assert got is not None and got.syncs == (HostSync("y", Phase.OPTIMIZER, 3.0),)
