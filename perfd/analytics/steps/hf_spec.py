"""A Hugging Face model config (``config.to_dict()``, or a ``config.json``) read as perfd's ModelSpec.
Pure.

``StepHook(model=config.to_dict())`` is taken as it is: the fields perfd's FLOPs formula needs are
read under each family's names, everything else in the config (dropout, rope, token ids, ...) is
ignored and listed (:attr:`SpecReading.ignored`, the hook's debug note), never refused. What the
config does not say the way the formula needs it is derived per family (checked against the real
models built on the meta device: tests/analytics/test_hf_configs.py):

- layers, hidden size, heads: ``num_hidden_layers`` / ``n_layer``, ``hidden_size`` / ``n_embd``,
  ``num_attention_heads`` / ``n_head``;
- MLP width (``ffn_hidden_size``): ``intermediate_size``, GPT-2's ``n_inner`` (None: 4·h), OPT's
  ``ffn_dim``, Falcon's ``ffn_hidden_size`` (None: 4·h);
- gated MLP (SwiGLU, or GeGLU with a GELU ``hidden_act``: three matrices either way, the formula's
  E = 3): the families whose MLP has a gate projection (Llama, Mistral, Qwen2/3, Gemma 1-3, Phi-3,
  OLMo 2, Granite); GPT-2, GPT-NeoX, Falcon, OPT and StarCoder2 have a plain two-matrix MLP;
- grouped-query attention: ``num_key_value_heads`` (None: as many as the heads); Falcon's
  ``num_kv_heads`` only with ``new_decoder_architecture`` or without ``multi_query`` (else one);
- head size: ``head_dim`` where the config states it (Gemma's 256 is not hidden ÷ heads), else
  hidden ÷ heads;
- vocabulary: ``vocab_size`` (a Hugging Face model pads nothing itself); tied embeddings:
  ``tie_word_embeddings`` (one logit GEMM either way).

Not read from the config: the sequence length. ``max_position_embeddings`` / ``n_positions`` is the
model's context limit (131072 for Mistral), not the length of the sequences a step trains on, and
the attention term grows with it: give ``seq_length`` beside the config (``{**config.to_dict(),
"seq_length": 2048}``) or per step (``step_end(seq_len=...)``). A config of a family not listed here
is read by the same names when it says whether its MLP is gated (``swiglu``); a mixture-of-experts
config is refused (its expert fields are not the names perfd's spec takes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from perfd.core.model import ModelSpec

# model_type -> whether the MLP is gated (a gate projection beside the up projection).
FAMILIES: dict[str, bool] = {
    "llama": True, "mistral": True, "qwen2": True, "qwen3": True, "gemma": True, "gemma2": True,
    "gemma3_text": True, "phi3": True, "olmo2": True, "granite": True,
    "gpt2": False, "gpt_neox": False, "falcon": False, "opt": False, "starcoder2": False,
}
# Families whose config may leave the MLP width unset (None): 4·h, as their modelling code does.
_FFN_4H = frozenset({"gpt2", "falcon"})
# Fields that make a config one perfd's dense spec cannot read (expert counts and routing).
_MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
_CONTEXT_LIMIT = ("max_position_embeddings", "n_positions")

# perfd's field <- the config's names for it, first present and not None wins.
_NAMES: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "kv_channels": ("head_dim",),
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "vocab_size": ("vocab_size",),
}
# ModelSpec fields a user may put beside the config (what the config cannot say), taken as given.
_GIVEN = ("seq_length", "swiglu", "parameter_count", "padded_vocab_size", "num_query_groups")


@dataclass(frozen=True)
class SpecReading:
    """A model mapping read as a spec: the spec, the mapping's fields perfd did not use, and what
    was derived (each a sentence)."""

    spec: ModelSpec
    ignored: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def is_hf_config(model: Mapping[str, object]) -> bool:
    """A Hugging Face config's dict: ``to_dict()`` and ``config.json`` always hold ``model_type``."""
    return isinstance(model.get("model_type"), str)


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def read_hf_config(cfg: Mapping[str, object]) -> SpecReading:
    """The spec a Hugging Face config defines (module docstring). Raises ValueError for a config it
    cannot read: a mixture of experts, a family not listed that does not say ``swiglu``."""
    family = str(cfg.get("model_type"))
    moe = [k for k in _MOE_FIELDS if cfg.get(k)]
    if moe:
        raise ValueError(f"model: a {family} config with experts ({', '.join(moe)}): perfd reads dense "
                         "Hugging Face configs only; give its spec by perfd's names (num_experts, "
                         "moe_router_topk, moe_ffn_hidden_size, ...)")
    used: set[str] = {"model_type"}
    notes: list[str] = []
    fields: dict[str, object] = {}
    for name, names in _NAMES.items():
        for key in names:
            if key in cfg:
                used.add(key)
                if cfg[key] is not None and name not in fields:
                    fields[name] = cfg[key]
    for name in _GIVEN:
        if name in cfg:
            used.add(name)
            fields[name] = cfg[name]
    h = _int(fields.get("hidden_size"))
    if "ffn_hidden_size" not in fields and family in _FFN_4H and h is not None:
        fields["ffn_hidden_size"] = 4 * h
        notes.append(f"ffn_hidden_size = 4·hidden_size = {4 * h} ({family}: the MLP width left unset)")
    if "swiglu" not in fields:
        gated = FAMILIES.get(family)
        if gated is None:
            raise ValueError(f"model: model_type {family!r} is not a family perfd reads "
                             f"({', '.join(sorted(FAMILIES))}): add swiglu=True or False (whether its MLP "
                             "has a gate projection) to read it by the same names")
        fields["swiglu"] = gated
        act = cfg.get("hidden_act") or cfg.get("hidden_activation") or cfg.get("activation_function")
        if gated:
            kind = "SwiGLU" if str(act) in ("silu", "swish") else "GeGLU" if "gelu" in str(act) else "gated"
            notes.append(f"gated MLP ({kind}, hidden_act {act}): three matrices (E = 3)")
        used.update(k for k in ("hidden_act", "hidden_activation", "activation_function", "activation")
                    if k in cfg)
    if "num_query_groups" not in fields:
        groups = _kv_heads(family, cfg, used)
        if groups is not None:
            fields["num_query_groups"] = groups
    if "tie_word_embeddings" in cfg:
        used.add("tie_word_embeddings")
        fields["untie_embeddings"] = cfg["tie_word_embeddings"] is False
    proj = _int(cfg.get("word_embed_proj_dim"))
    if proj is not None:
        used.add("word_embed_proj_dim")
        if h is not None and proj != h:
            raise ValueError(f"model: an OPT config with word_embed_proj_dim {proj} != hidden_size {h}: its "
                             "input and output projections are not in perfd's formula")
    for key in _CONTEXT_LIMIT:
        if key in cfg and "seq_length" not in fields:
            notes.append(f"{key} ({cfg[key]}) is the context limit, not the steps' sequence length: give "
                         "seq_length, or step_end(seq_len=...)")
    window = cfg.get("sliding_window")
    if isinstance(window, int) and cfg.get("use_sliding_window", True) is not False:
        used.add("sliding_window")
        notes.append(f"sliding-window attention ({window} tokens): longer sequences attend to fewer keys "
                     "than the formula counts")
    ignored = tuple(sorted(k for k in cfg if k not in used))
    if ignored:
        notes.append(f"{len(ignored)} config field(s) not used by the FLOPs formula: {', '.join(ignored)}")
    return SpecReading(ModelSpec(**fields), ignored, tuple(notes))  # type: ignore[arg-type]


def _kv_heads(family: str, cfg: Mapping[str, object], used: set[str]) -> int | None:
    """Key/value heads (perfd's num_query_groups), None where they are the attention heads."""
    if family == "falcon":
        used.update(k for k in ("num_kv_heads", "multi_query", "new_decoder_architecture") if k in cfg)
        if cfg.get("new_decoder_architecture") or not cfg.get("multi_query", True):
            return _int(cfg.get("num_kv_heads")) or _int(cfg.get("num_attention_heads"))
        return 1
    if "num_key_value_heads" in cfg:
        used.add("num_key_value_heads")
        return _int(cfg["num_key_value_heads"])
    return None
