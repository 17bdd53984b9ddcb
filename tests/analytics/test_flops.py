"""perfd's FLOPs formula: the fixture's numbers, GQA+SwiGLU, MoE, MTP, versions, missing inputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perfd.analytics.steps.flops import (
    FORMULA_6N,
    FORMULA_CURRENT,
    FORMULA_LEGACY,
    megatron_flops,
    model_flops,
    moe_layer_pattern,
    parse_version,
    record_flops,
    six_n_flops,
)
from perfd.analytics.steps.provenance import Code, cite
from perfd.core.model import ModelSpec
from tests.analytics.analytics_helpers import fixture_job

FIXTURE_FLOPS = 55_765_855_371_264  # T·[6hfE·L + 6L(h(q+2kv)+qh) + 6hV] + T·s·L·6q, below


def _reference(a: SimpleNamespace, batch: int, causal_halving: bool = True) -> float:
    """Megatron-Core 0.20 ``transformer_flops`` rewritten term by term (independent of perfd's code)."""
    groups = a.num_query_groups if a.group_query_attention else a.num_attention_heads
    if a.num_experts is None:
        dense, moe, topk, last_moe = a.num_layers, 0, 0, 0
    else:
        pat = ([1 if i % a.moe_layer_freq == 0 else 0 for i in range(a.num_layers)]
               if isinstance(a.moe_layer_freq, int) else list(a.moe_layer_freq))
        moe, topk, last_moe = sum(pat), a.moe_router_topk, pat[-1]
        dense = a.num_layers - moe
    mtp = a.mtp_num_layers or 0
    moe += last_moe * mtp
    dense += (1 - last_moe) * mtp
    layers = a.num_layers + mtp
    moe_ffn = a.moe_ffn_hidden_size if a.moe_ffn_hidden_size is not None else a.ffn_hidden_size
    shared = a.moe_shared_expert_intermediate_size or 0
    ffn_x = 3 if a.swiglu else 2
    q = a.kv_channels * a.num_attention_heads
    kv = a.kv_channels * groups
    core = q * a.seq_length / 2 * 2 if causal_halving else q * a.seq_length * 2
    attn = 3 * 2 * (a.hidden_size * (q + kv + kv) + core + q * a.hidden_size)
    return float(batch * a.seq_length * (
        3 * 2 * a.hidden_size * (a.ffn_hidden_size * ffn_x * dense + moe_ffn * topk * ffn_x * moe
                                 + shared * ffn_x * moe)
        + attn * layers
        + 3 * 2 * mtp * (3 * a.hidden_size + 2 * a.hidden_size * a.hidden_size)
        + 3 * 2 * a.hidden_size * a.padded_vocab_size * (mtp + 1)
    ))


def _args(**kw: object) -> SimpleNamespace:
    base: dict[str, object] = dict(
        num_layers=8, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16, kv_channels=64,
        group_query_attention=False, num_query_groups=1, seq_length=1024, padded_vocab_size=32000,
        swiglu=False, num_experts=None, moe_router_topk=None, moe_layer_freq=None,
        moe_ffn_hidden_size=None, moe_shared_expert_intermediate_size=None, mtp_num_layers=None)
    base.update(kw)
    return SimpleNamespace(**base)


def _spec(a: SimpleNamespace) -> ModelSpec:
    return ModelSpec(num_layers=a.num_layers, hidden_size=a.hidden_size, ffn_hidden_size=a.ffn_hidden_size,
                     num_attention_heads=a.num_attention_heads, kv_channels=a.kv_channels,
                     num_query_groups=a.num_query_groups if a.group_query_attention else None,
                     seq_length=a.seq_length, padded_vocab_size=a.padded_vocab_size, swiglu=a.swiglu,
                     num_experts=a.num_experts, moe_router_topk=a.moe_router_topk,
                     moe_layer_freq=a.moe_layer_freq, moe_ffn_hidden_size=a.moe_ffn_hidden_size,
                     moe_shared_expert_ffn_hidden_size=a.moe_shared_expert_intermediate_size,
                     mtp_num_layers=a.mtp_num_layers)


def test_fixture_flops_match_design_formula() -> None:
    t, h, f, n_layers, q, kv, e, v, s = 64 * 1024, 1024, 4096, 8, 1024, 1024, 2, 32000, 1024
    expected = t * (6 * h * f * e * n_layers + 6 * n_layers * (h * (q + 2 * kv) + q * h) + 6 * h * v) \
        + t * s * n_layers * 6 * q
    assert expected == FIXTURE_FLOPS
    res = megatron_flops(fixture_job().spec, 64, "0.20.0")
    assert res.flops_per_iteration == FIXTURE_FLOPS
    assert res.formula == FORMULA_CURRENT
    assert res.source is not None and "megatron-core>=0.12" in res.source.detail
    assert res.notes == ()
    assert sum(res.breakdown.values()) == FIXTURE_FLOPS
    assert res.flops_per_iteration == _reference(_args(), 64)


def test_fixture_iteration_38_tflops_within_1pct_of_logged() -> None:
    # iteration 38: elapsed 331.1 ms, Megatron logged 84.2 TFLOP/s/GPU, world 2
    res = megatron_flops(fixture_job().spec, 64, "0.20.0")
    assert res.flops_per_iteration is not None
    tflops = res.flops_per_iteration / (0.3311 * 1e12 * 2)
    assert tflops == pytest.approx(84.213, abs=1e-3)
    assert abs(tflops - 84.2) / 84.2 < 0.01


def test_untied_embeddings_do_not_change_flops() -> None:
    spec = fixture_job().spec
    spec.untie_embeddings = True
    assert megatron_flops(spec, 64, "0.20.0").flops_per_iteration == FIXTURE_FLOPS


def test_gqa_swiglu_spec() -> None:
    a = _args(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, kv_channels=128,
              group_query_attention=True, num_query_groups=8, seq_length=8192, padded_vocab_size=128256,
              swiglu=True)
    res = megatron_flops(_spec(a), 512, "0.20.0")
    h, f, n_layers, q, kv, v, s, t = 4096, 14336, 32, 4096, 1024, 128256, 8192, 512 * 8192
    by_hand = t * (6 * h * f * 3 * n_layers + 6 * n_layers * (h * (q + 2 * kv) + q * h) + 6 * h * v) \
        + t * s * n_layers * 6 * q
    assert res.flops_per_iteration == by_hand == _reference(a, 512)
    assert res.source is not None and "GQA" in res.source.detail and "E=3" in res.source.detail
    # GQA lowers the count against MHA by exactly the smaller K/V projections
    mha = megatron_flops(_spec(_args(**{**vars(a), "group_query_attention": False})), 512, "0.20.0")
    assert mha.flops_per_iteration is not None and res.flops_per_iteration is not None
    assert mha.flops_per_iteration - res.flops_per_iteration == t * 6 * n_layers * h * 2 * (q - kv)


@pytest.mark.parametrize("freq", [2, [1, 0, 1, 1]])
def test_moe_topk_spec(freq: int | list[int]) -> None:
    a = _args(num_layers=4, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16, kv_channels=128,
              swiglu=True, num_experts=8, moe_router_topk=2, moe_layer_freq=freq, moe_ffn_hidden_size=1024,
              moe_shared_expert_intermediate_size=512, seq_length=4096, padded_vocab_size=50304)
    res = megatron_flops(_spec(a), 32, "0.20.0")
    assert res.flops_per_iteration == _reference(a, 32)
    n_moe = 2 if freq == 2 else 3
    t, h = 32 * 4096, 2048
    mlp = 6 * h * (8192 * 3 * (4 - n_moe) + 1024 * 2 * 3 * n_moe + 512 * 3 * n_moe)
    assert res.breakdown["mlp"] == t * mlp


def test_moe_ffn_falls_back_to_ffn_hidden_size_like_megatron() -> None:
    a = _args(num_experts=4, moe_router_topk=1, moe_layer_freq=1)
    res = megatron_flops(_spec(a), 64, "0.20.0")
    assert res.flops_per_iteration == _reference(a, 64)
    # top-1 of experts as wide as the dense FFN: same FLOPs as the dense model
    assert res.flops_per_iteration == FIXTURE_FLOPS
    assert res.notes == (cite(Code.FLOPS_MOE_FFN_FALLBACK),)


def test_mtp_layers_add_layers_logits_and_projection() -> None:
    base = megatron_flops(_spec(_args()), 64, "0.20.0")
    a = _args(mtp_num_layers=1)
    res = megatron_flops(_spec(a), 64, "0.20.0")
    assert res.flops_per_iteration == _reference(a, 64)
    assert base.flops_per_iteration is not None and res.flops_per_iteration is not None
    t, h, v = 64 * 1024, 1024, 32000
    one_layer = (base.breakdown["mlp"] + base.breakdown["attention_projections"]
                 + base.breakdown["core_attention"]) / 8
    extra = one_layer + t * 6 * h * v + t * 6 * (3 * h + 2 * h * h)
    assert res.flops_per_iteration - base.flops_per_iteration == pytest.approx(extra, rel=1e-12)


def test_moe_mtp_counts_like_last_layer() -> None:
    a = _args(num_layers=4, num_experts=8, moe_router_topk=2, moe_layer_freq=[0, 0, 0, 1],
              moe_ffn_hidden_size=512, mtp_num_layers=2)
    assert megatron_flops(_spec(a), 8, "0.20.0").flops_per_iteration == _reference(a, 8)


def test_version_switch_attention_term() -> None:
    spec = fixture_job().spec
    old = megatron_flops(spec, 64, "0.11.0")
    new = megatron_flops(spec, 64, "0.12.0")
    assert old.formula == FORMULA_LEGACY and new.formula == FORMULA_CURRENT
    assert old.flops_per_iteration is not None and new.flops_per_iteration is not None
    # ≤ 0.11 counts core attention without the causal halving: 12·q instead of 6·q
    assert old.flops_per_iteration - new.flops_per_iteration == 64 * 1024 * 1024 * 8 * 6 * 1024
    assert old.flops_per_iteration == _reference(_args(), 64, causal_halving=False)
    assert megatron_flops(spec, 64, "0.9.0").formula == FORMULA_LEGACY
    assert megatron_flops(spec, 64, "0.12.0rc3").formula == FORMULA_CURRENT


def test_unknown_version_assumes_current_and_says_so() -> None:
    res = megatron_flops(fixture_job().spec, 64, None)
    assert res.flops_per_iteration == FIXTURE_FLOPS
    assert res.formula == FORMULA_CURRENT
    assert res.notes == (cite(Code.FLOPS_VERSION_UNKNOWN),)
    unparsed = megatron_flops(fixture_job().spec, 64, "main")
    assert unparsed.notes == (cite(Code.FLOPS_VERSION_UNPARSEABLE, "main"),)
    assert parse_version("core_r0.11.0") == (0, 11)
    assert parse_version("garbage") is None


def test_missing_inputs_give_none_and_the_list() -> None:
    spec = ModelSpec(num_layers=8, hidden_size=1024, num_attention_heads=16)
    res = megatron_flops(spec, None, "0.20.0")
    assert res.flops_per_iteration is None
    assert set(res.missing) == {"kv_channels", "seq_length", "padded_vocab_size", "global_batch_size"}
    assert res.why() == cite(Code.MISSING, res.missing)  # why, as a code: the fields missing
    no_ffn = fixture_job().spec
    no_ffn.ffn_hidden_size = None
    assert megatron_flops(no_ffn, 64).missing == ("ffn_hidden_size",)
    moe = fixture_job().spec
    moe.num_experts = 8
    assert set(megatron_flops(moe, 64).missing) == {"moe_router_topk", "moe_layer_freq"}


def test_mla_is_not_guessed() -> None:
    spec = fixture_job().spec
    spec.multi_latent_attention = True
    res = megatron_flops(spec, 64, "0.20.0")
    why = res.why()  # a note of this module's, quoted: the model's attention is not counted
    assert res.flops_per_iteration is None and why is not None and why.code is Code.WHY
    assert why.args == (cite(Code.FLOPS_MLA),)


def test_moe_layer_pattern() -> None:
    assert moe_layer_pattern(2, 5) == [1, 0, 1, 0, 1]
    assert moe_layer_pattern([0, 1], 2) == [0, 1]
    assert moe_layer_pattern([0, 1], 3) == cite(Code.FLOPS_MOE_PATTERN_LENGTH, 2, 3)
    assert moe_layer_pattern(0, 3) == cite(Code.FLOPS_MOE_FREQ_NOT_POSITIVE, 0)


def test_six_n_fallback() -> None:
    res = six_n_flops(1_000_000_000, 65536)
    assert res.flops_per_iteration == 6 * 1e9 * 65536 and res.formula == FORMULA_6N
    assert six_n_flops(None, 100).flops_per_iteration is None
    spec = ModelSpec(seq_length=1024, parameter_count=130_000_000)
    fb = model_flops(spec, 64)
    assert fb.formula == FORMULA_6N and fb.flops_per_iteration == 6 * 130_000_000 * 64 * 1024
    assert "num_layers" in fb.missing  # what kept perfd's own formula out
    # the formula wins when it can run
    full = fixture_job().spec
    full.parameter_count = 130_000_000
    assert model_flops(full, 64).formula == FORMULA_CURRENT
    assert model_flops(ModelSpec(), 64).flops_per_iteration is None


def test_tokens_record_provenance_names_the_tokens_where_the_batch_was() -> None:
    a = _args(num_experts=4, moe_router_topk=2, moe_layer_freq=2, mtp_num_layers=1,
              group_query_attention=True, num_query_groups=4)
    spec = _spec(a)
    per_seq = megatron_flops(spec, 1, "0.20.0")
    got = record_flops(4096.0, None, spec, "0.20.0")
    assert got is not None and got.source is not None and per_seq.source is not None
    assert got.source.detail == (per_seq.source.detail.replace("gbs=1", "tokens=4096")
                                 + " (tokens_per_step from the step hook)")
    assert got.source.detail == (
        "formula:megatron-core>=0.12 (T·[6hfE·L + 6L(h(q+2kv)+qh) + 6hV] + T·s·L·6q; L=8+1 MTP, h=1024, "
        "f=4096, E=2, q=1024, kv=256 (GQA), V=32000, s=1024, tokens=4096, MoE 4 layers top-2 f_moe=4096 "
        "shared=0) (tokens_per_step from the step hook)")
