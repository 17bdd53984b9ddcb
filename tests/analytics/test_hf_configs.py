"""Hugging Face configs taken as they are: ``StepHook(model=config.to_dict())`` for the common decoder
families (tests/data/hf_configs: each config class's ``to_dict()`` at its defaults, transformers
5.23; make_configs.py writes them).

Each is read without a refusal, its unused fields listed, and its FLOPs checked against an
independent count: the real model built from the same config on the meta device (no weights),
6 × its GEMM weights (every ``nn.Linear`` and GPT-2 ``Conv1D`` weight, the logit layer once whether
tied or not; embeddings are lookups, norms and biases no GEMMs) × tokens, plus the causal attention
(QKᵀ and ·V, 2·s·q each forward per token, halved for the mask, ×3 with the backward: 6·s·q·L per
token, q = heads × the attention module's own head size).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.steps.flops import megatron_flops, read_spec, record_flops, token_flops
from perfd.analytics.steps.hf_spec import FAMILIES
from perfd.hook import StepHook

DATA = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
CONFIGS = sorted(p.stem for p in DATA.glob("*.json"))
SEQ, BATCH = 2048, 4


def config(stem: str) -> dict[str, Any]:
    return dict(json.loads((DATA / f"{stem}.json").read_text()))


def test_the_recorded_configs_are_the_families_the_issue_names() -> None:
    named = {"llama", "mistral", "qwen2", "gpt2", "gpt_neox", "gemma", "phi3", "falcon", "opt"}
    assert named <= set(CONFIGS) and set(CONFIGS) <= set(FAMILIES)


@pytest.mark.parametrize("stem", CONFIGS)
def test_a_config_is_read_as_it_is_its_other_fields_listed(stem: str) -> None:
    cfg = config(stem)
    got = read_spec(cfg)  # no refusal, whatever else the config holds
    spec = got.spec
    assert spec.swiglu is FAMILIES[cfg["model_type"]]
    assert None not in (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size, spec.num_attention_heads,
                        spec.kv_channels, spec.padded_vocab_size)
    assert spec.seq_length is None  # the context limit is not read as the sequence length...
    assert any("context limit" in n for n in got.notes)  # ...and the note says so
    # the rest of the config is listed, not refused: dropout, token ids, rope, the HF dtype, ...
    assert "transformers_version" in got.ignored and "dtype" in got.ignored
    assert any(n.startswith(f"{len(got.ignored)} config field(s) not used") for n in got.notes)
    assert "num_hidden_layers" not in got.ignored and "vocab_size" not in got.ignored
    # with the sequence length beside it, the FLOPs per step are counted
    tf = token_flops({**cfg, "seq_length": SEQ})
    assert tf.flops(BATCH * SEQ, SEQ) > 0 and not any("context limit" in n for n in tf.notes)


def test_what_each_family_says_its_own_way() -> None:
    falcon = read_spec(config("falcon")).spec  # multi_query without the new architecture: one KV head
    assert (falcon.num_query_groups, falcon.ffn_hidden_size, falcon.kv_channels) == (1, 4 * 4544, 64)
    gemma = read_spec(config("gemma")).spec  # head_dim 256 is not hidden ÷ heads (3072 ÷ 16)
    assert (gemma.kv_channels, gemma.swiglu, gemma.untie_embeddings) == (256, True, False)
    gpt2 = read_spec(config("gpt2")).spec  # n_inner None: 4h
    assert (gpt2.ffn_hidden_size, gpt2.num_query_groups, gpt2.swiglu) == (3072, None, False)
    mistral = read_spec(config("mistral"))
    assert mistral.spec.num_query_groups == 8 and any("sliding-window" in n for n in mistral.notes)
    assert read_spec(config("opt")).spec.ffn_hidden_size == 3072
    assert read_spec(config("llama")).spec.untie_embeddings is True


def test_configs_it_cannot_read_are_refused_with_what_to_give() -> None:
    with pytest.raises(ValueError, match="swiglu=True or False"):
        read_spec({**config("llama"), "model_type": "new_family"})
    assert read_spec({**config("llama"), "model_type": "new_family", "swiglu": True}).spec.swiglu is True
    with pytest.raises(ValueError, match="experts"):
        read_spec({**config("mistral"), "model_type": "mixtral", "num_local_experts": 8})
    with pytest.raises(ValueError, match="word_embed_proj_dim"):
        read_spec({**config("opt"), "word_embed_proj_dim": 512})
    with pytest.raises(ValueError, match="unknown field"):  # not a HF config: a typo is still refused
        read_spec({"layers": 2})


def test_the_hook_takes_a_config_dict_and_notes_what_it_ignored(tmp_path: Path) -> None:
    cfg = config("qwen2")
    model = {**cfg, "seq_length": SEQ}
    hook = StepHook(str(tmp_path / "none.sock"), tokens_per_step=BATCH * SEQ, model=model, cuda=False,
                    enabled=False)
    want = megatron_flops(read_spec(model).spec, BATCH, None, "pytorch").flops_per_iteration
    assert hook.flops_per_step == pytest.approx(want)
    assert any("not used by the FLOPs formula" in n for n in hook.model_notes)


def _gemm_weights(model: Any, transformers: Any) -> int:
    conv1d = transformers.pytorch_utils.Conv1D
    torch = pytest.importorskip("torch")
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, (torch.nn.Linear, conv1d)))


def _head_size(model: Any) -> int:
    for name, m in model.named_modules():
        if name.endswith(("self_attn", "attn", "attention", "self_attention")):
            for attr in ("head_dim", "head_size"):
                v = getattr(m, attr, None)
                if isinstance(v, int):
                    return v
    raise AssertionError("no attention module with a head size")


# One xdist worker takes every config: importing torch and transformers is ~5.8 s of CPU, building a
# model on the meta device ~0.06 s; spread over 8 workers each paid the import (47.7 s of the suite's CPU).
@pytest.mark.slow
@pytest.mark.xdist_group("hf_meta_models")
@pytest.mark.parametrize("stem", CONFIGS)
def test_flops_match_the_real_model_built_on_the_meta_device(stem: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.data.hf_configs.make_configs import FAMILIES as CLASSES

    config_cls, model_cls = CLASSES[stem]
    cfg_dict = config(stem)
    hf = getattr(transformers, config_cls).from_dict(cfg_dict)
    with torch.device("meta"):
        model = getattr(transformers, model_cls)(hf)
    n = _gemm_weights(model, transformers)
    layers = hf.num_hidden_layers if hasattr(hf, "num_hidden_layers") else hf.n_layer
    heads = hf.num_attention_heads if hasattr(hf, "num_attention_heads") else hf.n_head
    q = heads * _head_size(model)
    tokens = BATCH * SEQ
    reference = 6 * n * tokens + 6 * SEQ * q * layers * tokens
    spec = read_spec({**cfg_dict, "seq_length": SEQ}).spec
    got = megatron_flops(spec, BATCH, None, "pytorch").flops_per_iteration
    assert got == pytest.approx(reference, rel=1e-9), (stem, got, reference)
    # the hook's per-step count from tokens (what the aggregator reads as the record's FLOPs)
    per_step = record_flops(tokens, None, spec, None, "pytorch")
    assert per_step is not None and per_step.flops_per_iteration == pytest.approx(reference, rel=1e-9)


@pytest.mark.slow
@pytest.mark.xdist_group("hf_meta_models")
def test_a_config_overridden_from_a_string_keeps_its_stale_head_dim_and_so_does_the_model() -> None:
    """run_clm.py's ``--config_overrides hidden_size=768,...,num_attention_heads=12`` on LlamaConfig()
    (the recorded Trainer run, tests/data/loops/hf_clm_h200): ``update_from_string`` leaves the default's
    ``head_dim`` (128, from 4096 / 32) in place, and the model is built with it (q_proj 768 → 1536: 137.8M
    parameters, not the 110M hidden ÷ heads would give). perfd reads head_dim as the config states it:
    866.45M FLOPs a token at 1,024, the real model's count, not 640M."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.CONFIG_MAPPING["llama"]()
    hf.update_from_string("hidden_size=768,intermediate_size=2048,num_hidden_layers=12,num_attention_heads=12,"
                          "num_key_value_heads=12,max_position_embeddings=1024,vocab_size=16000")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    assert hf.head_dim == 128 and _head_size(model) == 128
    seq, tokens = 1024, 32 * 1024
    n = _gemm_weights(model, transformers)
    reference = 6 * n * tokens + 6 * seq * hf.num_attention_heads * 128 * hf.num_hidden_layers * tokens
    spec = read_spec({**hf.to_dict(), "seq_length": seq}).spec
    per_step = record_flops(tokens, None, spec, None, "pytorch")
    got = per_step.flops_per_iteration if per_step is not None else None
    assert got is not None and got == pytest.approx(reference, rel=1e-9)
    assert got / tokens == pytest.approx(866_451_456, rel=1e-9)
