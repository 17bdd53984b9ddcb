"""Model FLOPs per training iteration, perfd's own count (docs/design.md §2 "MFU").

Follows Megatron-Core's ``num_floating_point_operations`` (megatron/training/training.py) term by
term, for standard (MHA/GQA) transformers, dense or MoE, with MTP layers:

    per token = 6·h·( f·E·L_dense + f_moe·k·E·L_moe + f_shared·E·L_moe )      # MLP GEMMs
              + 6·(h·(q + 2·kv) + q·h)·L                                      # QKV and output proj
              + 6·mtp·(3·h + 2·h²)                                           # MTP norms and eh proj
              + 6·h·V·(mtp + 1)                                              # logits
              + 6·s·q·L            (core ≥ 0.12: causal mask halves QKᵀ and ·V)
                12·s·q·L           (core ≤ 0.11: no causal halving)
    FLOPs per iteration = per token × T,  T = global_batch · seq

with q = kv_channels·heads, kv = kv_channels·query_groups (kv = q without GQA), E = 3 with SwiGLU
else 2, V = padded vocab, L = num_layers + mtp_num_layers (each MTP layer is one more transformer
layer, dense or MoE like the last decoder layer), L_moe from moe_layer_freq (int: layer i is MoE iff
i % freq == 0; list: the pattern), f_moe = moe_ffn_hidden_size (Megatron falls back to
ffn_hidden_size). Untied embeddings change nothing: one logit GEMM either way (the input embedding
is a lookup, not a GEMM).

Inputs a source did not state are never defaulted: the result is None with the list of what is
missing.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics.steps.hf_spec import SpecReading, is_hf_config, read_hf_config
from perfd.analytics.steps.provenance import Cited, Code, cite
from perfd.core.bounds import SPEC_BOUNDS, in_bounds
from perfd.core.model import ModelSpec, Provenance, TextEnum

FORMULA_CURRENT = "megatron-core>=0.12"
FORMULA_LEGACY = "megatron-core<=0.11"
FORMULA_6N = "6*N*tokens"
FORMULA_TORCHTITAN = "torchtitan (no causal halving)"
FORMULA_STATED = "flops_per_step (step hook)"


@dataclass(frozen=True)
class FormulaInputs:
    """The model shape perfd's formula was evaluated with (the terms of the module docstring)."""

    formula: str
    attn_factor: int
    n_layers: int
    mtp: int
    h: int
    f_dense: int
    e: int
    q: int
    kv: int
    gqa: bool
    v: int
    s: int
    is_moe: bool
    n_moe: int
    topk: int
    f_moe: int | None
    f_shared: int

    def detail(self, batch: str) -> str:
        """The provenance sentence, ``batch`` naming the batch the count is for (``gbs=8``,
        ``tokens=4096``)."""
        mtp = f"+{self.mtp} MTP" if self.mtp else ""
        moe = (f", MoE {self.n_moe} layers top-{self.topk} f_moe={self.f_moe} shared={self.f_shared}"
               if self.is_moe else "")
        return (f"formula:{self.formula} (T·[6hfE·L + 6L(h(q+2kv)+qh) + 6hV] + T·s·L·{self.attn_factor}q; "
                f"L={self.n_layers}{mtp}, h={self.h}, f={self.f_dense}, E={self.e}, q={self.q}, "
                f"kv={self.kv} ({'GQA' if self.gqa else 'MHA'}), V={self.v}, s={self.s}, {batch}{moe})")


@dataclass(frozen=True)
class FlopsResult:
    """FLOPs per iteration (all ranks together), or None with what was missing."""

    flops_per_iteration: float | None
    formula: str | None  # FORMULA_CURRENT | FORMULA_LEGACY | FORMULA_6N | None
    source: Provenance | None
    missing: tuple[str, ...] = ()
    notes: tuple[Cited, ...] = ()  # what the count assumed, or why there is none (Code.FLOPS_*)
    breakdown: dict[str, float] = field(default_factory=dict)  # term -> FLOPs per iteration
    # The formula's inputs (perfd's own count only): what the provenance sentence is written from.
    inputs: FormulaInputs | None = None

    @property
    def available(self) -> bool:
        return self.flops_per_iteration is not None

    def why(self) -> Cited | None:
        """Why the count is absent, as a code (None when it is present): the fields missing, with
        this module's notes on how the spec was read where there are."""
        if self.available:
            return None
        notes = joined(self.notes)
        if self.missing:
            return (cite(Code.MISSING_NOTED, self.missing, notes) if notes
                    else cite(Code.MISSING, self.missing))
        return cite(Code.WHY, notes) if notes else cite(Code.FLOPS_UNKNOWN)


def joined(notes: Sequence[Cited]) -> Cited | None:
    """The notes as one, in their order ("; " between, where shown); None without notes."""
    if not notes:
        return None
    out = notes[0]
    for n in notes[1:]:
        out = cite(Code.FLOPS_NOTES, out, n)
    return out


def parse_version(version: str | None) -> tuple[int, int] | None:
    """(major, minor) from a version string like "0.20.0", "0.12.0rc3", "core_r0.11.0"."""
    if not version:
        return None
    m = re.search(r"(\d+)\.(\d+)", version)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2))


def attention_formula(framework_version: str | None,
                      framework: str = "megatron") -> tuple[str, int, Cited | None]:
    """(formula name, core-attention factor 6 or 12, note) for a framework and its version.

    Megatron-Core >= 0.12 halves the core attention for the causal mask; older cores do not, and
    neither does torchtitan (torchtitan/models/utils.py: "we follow the convention and do not account
    for sparsity in causal attention", 6·L·heads·(qk+v head dims)·s per token = 12·s·q·L). Any other
    framework (a plain PyTorch job with the step hook) is counted like current Megatron-Core."""
    if framework == "torchtitan":
        return FORMULA_TORCHTITAN, 12, None
    if framework != "megatron":
        return FORMULA_CURRENT, 6, None
    ver = parse_version(framework_version)
    if ver is None:  # assumed current (>=0.12, causal-halved attention), and noted
        note = (cite(Code.FLOPS_VERSION_UNPARSEABLE, framework_version) if framework_version
                else cite(Code.FLOPS_VERSION_UNKNOWN))
        return FORMULA_CURRENT, 6, note
    if ver <= (0, 11):
        return FORMULA_LEGACY, 12, None
    return FORMULA_CURRENT, 6, None


def moe_layer_pattern(freq: int | list[int], num_layers: int) -> list[int] | Cited:
    """Megatron's MoE layer pattern (1 = MoE layer), or why there is none (a note's code)."""
    if not in_bounds(num_layers, *SPEC_BOUNDS["num_layers"]):  # the list below has one per layer
        return cite(Code.FLOPS_LAYERS_OUT_OF_BOUNDS, num_layers, *SPEC_BOUNDS["num_layers"])
    if isinstance(freq, int):
        if freq <= 0:
            return cite(Code.FLOPS_MOE_FREQ_NOT_POSITIVE, freq)
        return [1 if i % freq == 0 else 0 for i in range(num_layers)]
    pattern = [int(x) for x in freq]
    if len(pattern) != num_layers:
        return cite(Code.FLOPS_MOE_PATTERN_LENGTH, len(pattern), num_layers)
    return pattern


def megatron_flops(
    spec: ModelSpec,
    global_batch_size: int | None,
    framework_version: str | None = None,
    framework: str = "megatron",
) -> FlopsResult:
    """perfd's FLOPs per iteration with Megatron-Core's formula for ``framework_version`` (the
    attention convention of ``framework``: attention_formula)."""
    missing: list[str] = []
    notes: list[Cited] = []
    for name in ("num_layers", "hidden_size", "num_attention_heads", "kv_channels", "seq_length",
                 "padded_vocab_size"):
        if getattr(spec, name) is None:
            missing.append(name)
    if global_batch_size is None:
        missing.append("global_batch_size")
    if spec.multi_latent_attention:
        return FlopsResult(None, None, None, tuple(missing),
                           (cite(Code.FLOPS_MLA),))
    is_moe = spec.num_experts is not None and spec.num_experts > 0
    if is_moe:
        if spec.moe_router_topk is None:
            missing.append("moe_router_topk")
        if spec.moe_layer_freq is None:
            missing.append("moe_layer_freq")
    if missing:
        return FlopsResult(None, None, None, tuple(missing))
    assert spec.num_layers is not None and spec.hidden_size is not None
    assert spec.num_attention_heads is not None and spec.kv_channels is not None
    assert spec.seq_length is not None and spec.padded_vocab_size is not None
    assert global_batch_size is not None

    n_layers = spec.num_layers
    h = spec.hidden_size
    s = spec.seq_length
    v = spec.padded_vocab_size
    q = spec.kv_channels * spec.num_attention_heads
    groups = spec.num_query_groups if spec.num_query_groups is not None else spec.num_attention_heads
    kv = spec.kv_channels * groups
    e = 3 if spec.swiglu else 2

    # Dense / MoE layer counts, MTP layers counted like the last decoder layer (Megatron's rule).
    if is_moe:
        assert spec.moe_layer_freq is not None and spec.moe_router_topk is not None
        pattern = moe_layer_pattern(spec.moe_layer_freq, n_layers)
        if isinstance(pattern, Cited):
            return FlopsResult(None, None, None, ("moe_layer_freq",), (pattern,))
        n_moe = sum(pattern)
        last_is_moe = pattern[-1]
        topk = spec.moe_router_topk
    else:
        n_moe, last_is_moe, topk = 0, 0, 0
    n_dense = n_layers - n_moe
    mtp = spec.mtp_num_layers or 0
    n_moe += last_is_moe * mtp
    n_dense += (1 - last_is_moe) * mtp
    layers = n_layers + mtp

    f_moe: int | None = spec.moe_ffn_hidden_size
    if is_moe and f_moe is None:
        f_moe = spec.ffn_hidden_size
        if f_moe is not None:
            notes.append(cite(Code.FLOPS_MOE_FFN_FALLBACK))
    need_dense_ffn = n_dense > 0
    if (need_dense_ffn and spec.ffn_hidden_size is None) or (is_moe and f_moe is None):
        return FlopsResult(None, None, None, ("ffn_hidden_size",))
    f_dense = spec.ffn_hidden_size or 0
    f_shared = spec.moe_shared_expert_ffn_hidden_size or 0

    formula, attn_factor, note = attention_formula(framework_version, framework)
    if note:
        notes.append(note)
    tokens = global_batch_size * s

    mlp = 6 * h * (f_dense * e * n_dense + (f_moe or 0) * topk * e * n_moe + f_shared * e * n_moe)
    proj = 6 * (h * (q + 2 * kv) + q * h) * layers
    mtp_extra = 6 * mtp * (3 * h + 2 * h * h)
    logits = 6 * h * v * (mtp + 1)
    core_attn = attn_factor * s * q * layers
    breakdown = {
        "mlp": float(mlp * tokens),
        "attention_projections": float(proj * tokens),
        "core_attention": float(core_attn * tokens),
        "logits": float(logits * tokens),
        "mtp_norms_and_projection": float(mtp_extra * tokens),
    }
    total = float(sum(breakdown.values()))
    gqa = spec.num_query_groups is not None and spec.num_query_groups != spec.num_attention_heads
    inputs = FormulaInputs(formula, attn_factor, n_layers, mtp, h, f_dense, e, q, kv, gqa, v, s,
                           is_moe, n_moe, topk, f_moe, f_shared)
    return FlopsResult(total, formula, Provenance("analytics", inputs.detail(f"gbs={global_batch_size}")),
                       (), tuple(notes), breakdown, inputs)


def six_n_flops(parameter_count: int | None, tokens: int | None) -> FlopsResult:
    """The 6·N·tokens fallback (forward 2N + backward 4N per token; no attention-score term)."""
    missing = [n for n, x in (("parameter_count", parameter_count), ("tokens", tokens)) if x is None]
    if missing:
        return FlopsResult(None, None, None, tuple(missing))
    assert parameter_count is not None and tokens is not None
    return FlopsResult(
        6.0 * parameter_count * tokens,
        FORMULA_6N,
        Provenance("analytics", f"formula:6*N*tokens (N={parameter_count} from config, "
                                f"tokens={tokens}; excludes attention scores)"),
        notes=(cite(Code.FLOPS_6N_NO_ATTENTION),),
    )


def model_flops(
    spec: ModelSpec,
    global_batch_size: int | None,
    framework_version: str | None = None,
    framework: str = "megatron",
) -> FlopsResult:
    """perfd's formula first; 6·N·tokens when the formula's inputs are missing but N is known.

    (Megatron's logged throughput, the second preference of docs/design.md §2, is applied per iteration
    by the MFU code, since it is a per-iteration figure, not a FLOPs count.)
    """
    own = megatron_flops(spec, global_batch_size, framework_version, framework)
    if own.available or spec.parameter_count is None:
        return own
    tokens = global_batch_size * spec.seq_length if (global_batch_size and spec.seq_length) else None
    fallback = six_n_flops(spec.parameter_count, tokens)
    if not fallback.available:
        return FlopsResult(None, None, None, tuple(dict.fromkeys(own.missing + fallback.missing)),
                           own.notes)
    return FlopsResult(fallback.flops_per_iteration, fallback.formula, fallback.source, own.missing,
                       (*own.notes, *fallback.notes,
                        cite(Code.FLOPS_FORMULA_UNAVAILABLE, own.missing)))


def _stated(x: float | None) -> float | None:
    """A positive finite count, else None."""
    return x if x is not None and math.isfinite(x) and x > 0 else None


def record_flops(tokens_per_step: float | None, flops_per_step: float | None, spec: ModelSpec,
                 framework_version: str | None = None, framework: str = "megatron") -> FlopsResult | None:
    """FLOPs per step a step record states or implies (the step hook's counts, for the whole job):
    its ``flops_per_step`` (the training script's own count), else its ``tokens_per_step`` × perfd's
    formula per token from the model spec (6·N·tokens with only a parameter count). None when the
    record states neither; an absent result (with what is missing) when it gives tokens without a
    spec to count them with."""
    flops = _stated(flops_per_step)
    if flops is not None:
        return FlopsResult(flops, FORMULA_STATED, Provenance(
            "hook", f"flops_per_step={flops:.6g} stated by the training script (StepHook)"))
    tokens = _stated(tokens_per_step)
    if tokens is None:
        return None
    if spec.seq_length is not None and spec.seq_length > 0:
        per_seq = megatron_flops(spec, 1, framework_version, framework)
        if per_seq.available:
            assert per_seq.flops_per_iteration is not None and per_seq.inputs is not None
            scale = tokens / spec.seq_length
            return FlopsResult(per_seq.flops_per_iteration * scale, per_seq.formula, Provenance(
                "analytics", f"{per_seq.inputs.detail(f'tokens={tokens:.6g}')} "
                             "(tokens_per_step from the step hook)"),
                notes=per_seq.notes, breakdown={k: v * scale for k, v in per_seq.breakdown.items()})
    if spec.parameter_count is not None:
        return six_n_flops(spec.parameter_count, int(tokens))
    own = megatron_flops(spec, 1, framework_version, framework)
    return FlopsResult(None, None, None, own.missing or ("seq_length",),
                       (cite(Code.FLOPS_TOKENS_NO_SPEC),))


class FlopsBasis(TextEnum):
    """Which of the model's FLOPs a part of matmuls is read against (its TFLOP/s: those FLOPs over its
    time): the linear layers' part divides its own, never the model's whole count."""

    # the formula's GEMM terms: every weight matrix, 6 FLOPs per weight per token (forward 2, backward
    # 4): QKV and the attention output projection, the MLP, the logits (LM head), MTP's projection; core
    # attention (QKᵀ and ·V) apart, in attention's part
    GEMMS = "gemms"
    SIX_N = "6n"  # 6·N·tokens: the fallback count, which has no attention term (its N: the config's)
    # every FLOP the count holds, attention's matmuls among them: GEMMs known by kernel name only run them
    WHOLE_MODEL = "model"


class MfuConvention(TextEnum):
    """How the model FLOPs an MFU divides by the step were counted: its typed provenance, worded where
    the MFU is shown (perfd.report.grade_text)."""

    # perfd's formula as Megatron-Core >= 0.12 counts (module doc): 6 FLOPs per weight per token (every
    # GEMM, the LM head's among them: 6·N·T for the weights) plus core attention's 6·s·q·L a token, the
    # causal mask counting half of QKᵀ and ·V
    CAUSAL_HALF = "causal-half"
    # the same count made by the step hook from its model= (perfd's formula, in the training process)
    HOOK_CAUSAL_HALF = "hook-causal-half"
    # attention whole (12·s·q·L a token): Megatron-Core <= 0.11, torchtitan
    ATTENTION_WHOLE = "attention-whole"
    SIX_N = "6n"  # 6·N·tokens: no attention term
    STATED = "stated"  # the training script's own flops_per_step: its convention is the script's
    LOGGED = "logged"  # the framework's own logged throughput (Megatron-LM's TFLOP/s per GPU)


_CONVENTION = {FORMULA_CURRENT: MfuConvention.CAUSAL_HALF, FORMULA_LEGACY: MfuConvention.ATTENTION_WHOLE,
               FORMULA_TORCHTITAN: MfuConvention.ATTENTION_WHOLE, FORMULA_6N: MfuConvention.SIX_N}


def mfu_convention(formula: str | None, spec: ModelSpec) -> MfuConvention | None:
    """The convention of a count made by ``formula`` (FlopsResult.formula; None: no count). A count the
    step hook stated follows perfd's formula where the job's spec is its model record's (the hook sends
    one only for a count it made from model=: perfd.hook.wire.KIND_MODEL), else the script's own."""
    if formula == FORMULA_STATED:
        complete = spec.seq_length is not None and megatron_flops(spec, 1, None, "pytorch").available
        return MfuConvention.HOOK_CAUSAL_HALF if complete else MfuConvention.STATED
    return _CONVENTION.get(formula or "")


# The formula's terms (megatron_flops ``breakdown``) that are GEMMs: a weight matrix times the tokens.
GEMM_TERMS: tuple[str, ...] = ("mlp", "attention_projections", "logits", "mtp_norms_and_projection")


@dataclass(frozen=True)
class FlopsSplit:
    """A step's model FLOPs divided by where they run, as shares of the count: the GEMMs' (``basis``)
    and core attention's (None: the count has no attention term), and the attention convention
    (``formula``: causal-halved in Megatron-Core >= 0.12 and for a plain PyTorch job, whole in older
    cores and torchtitan)."""

    gemm_share: float
    attention_share: float | None
    basis: FlopsBasis
    formula: str

    @property
    def causal_halved(self) -> bool:
        return self.formula not in (FORMULA_LEGACY, FORMULA_TORCHTITAN)


def flops_split(result: FlopsResult | None, spec: ModelSpec, framework_version: str | None = None,
                framework: str = "megatron") -> FlopsSplit | None:
    """How ``result``'s FLOPs divide into the GEMMs' and core attention's: its own terms where perfd
    counted it (``breakdown``), else, for a count stated whole (the step hook's ``flops_per_step``) or
    absent, the formula's terms for one sequence of ``spec`` (the same formula the hook counts with:
    its shares do not depend on the batch). A 6·N count is all GEMMs by its own convention; None where
    nothing says how the count divides (a stated count without a complete spec)."""
    if result is not None and result.formula == FORMULA_6N:
        return FlopsSplit(1.0, None, FlopsBasis.SIX_N, FORMULA_6N)
    terms, formula = (result.breakdown, result.formula) if result is not None else ({}, None)
    if not terms or not formula or not result or not result.flops_per_iteration:
        per_seq = megatron_flops(spec, 1, framework_version, framework) if spec.seq_length else None
        if per_seq is None or not per_seq.available:
            return None
        terms, formula = per_seq.breakdown, per_seq.formula
    total = sum(terms.values())
    if total <= 0 or formula is None:
        return None
    return FlopsSplit(sum(terms.get(k, 0.0) for k in GEMM_TERMS) / total,
                      terms.get("core_attention", 0.0) / total, FlopsBasis.GEMMS, formula)


# Names other codebases give the spec's fields, accepted by ``model=`` in a mapping of perfd's own
# (a Hugging Face config's dict is read whole, by family: perfd.analytics.steps.hf_spec).
SPEC_ALIASES: dict[str, str] = {
    "num_hidden_layers": "num_layers", "n_layer": "num_layers", "hidden": "hidden_size",
    "n_embd": "hidden_size", "d_model": "hidden_size", "intermediate_size": "ffn_hidden_size",
    "n_inner": "ffn_hidden_size", "num_heads": "num_attention_heads", "n_head": "num_attention_heads",
    "num_key_value_heads": "num_query_groups", "head_dim": "kv_channels", "seq_len": "seq_length",
}
# Known, never read as the sequence length: a model's context limit is not the length of the
# sequences a step trains on (the attention term grows with it).
CONTEXT_LIMIT_FIELDS: tuple[str, ...] = ("max_position_embeddings", "n_positions")


def read_spec(model: ModelSpec | Mapping[str, object]) -> SpecReading:
    """``model`` read as a spec, with what its others define filled in (complete_spec), the fields
    it holds that perfd did not use and the notes on what was derived. A Hugging Face config's dict
    (``config.to_dict()``) is read as it is (hf_spec); any other mapping takes the spec's field
    names or the aliases of SPEC_ALIASES, and a field that is neither is refused (a typo must not
    silently drop a term). Raises ValueError (at construction, never in the loop)."""
    ignored: tuple[str, ...] = ()
    notes: list[str] = []
    if isinstance(model, ModelSpec):
        spec = dataclasses.replace(model)
    elif is_hf_config(model):
        got = read_hf_config(model)
        spec, ignored, notes = got.spec, got.ignored, list(got.notes)
    else:
        known = set(ModelSpec.__dataclass_fields__)
        fields: dict[str, object] = {}
        unknown = []
        for key, value in model.items():
            name = key if key in known else SPEC_ALIASES.get(key)
            if key in CONTEXT_LIMIT_FIELDS:
                notes.append(f"{key} ({value}) is the context limit, not the steps' sequence length: give "
                             "seq_length, or step_end(seq_len=...)")
            elif name is None:
                unknown.append(key)
            elif name not in fields or key == name:  # the spec's own name wins over an alias
                fields[name] = value
        if unknown:
            raise ValueError(f"model: unknown field(s) {sorted(unknown)}; known: {sorted(known)} "
                             f"(or {sorted(SPEC_ALIASES)}, or a Hugging Face config.to_dict())")
        spec = ModelSpec(**fields)  # type: ignore[arg-type]
    h, heads = spec.hidden_size, spec.num_attention_heads
    if spec.ffn_hidden_size is None and isinstance(h, int) and h > 0 and not spec.num_experts:
        # What Megatron-LM fills when --ffn-hidden-size is not given (its arguments.py), which is
        # also the width of the MLP of GPT-2 and of most plain-PyTorch GPTs written after it.
        spec.ffn_hidden_size = megatron_ffn_default(h, spec.swiglu)
        notes.append(f"ffn_hidden_size not given: {spec.ffn_hidden_size} assumed ("
                     + ("Megatron's default with swiglu: 4·hidden_size·2/3, down to a multiple of 64)"
                        if spec.swiglu else "4·hidden_size, Megatron's default)"))
    if spec.kv_channels is None and h and heads and h % heads == 0:
        spec.kv_channels = h // heads
        notes.append(f"kv_channels not given: {spec.kv_channels} assumed (hidden_size ÷ num_attention_heads)")
    if spec.padded_vocab_size is None and spec.vocab_size is not None:
        spec.padded_vocab_size = spec.vocab_size
        notes.append(f"padded_vocab_size not given: vocab_size ({spec.vocab_size}) assumed, the logits' "
                     "width (a plain PyTorch model pads nothing; Megatron's log states its padded size)")
    return SpecReading(spec, ignored, tuple(notes))


def megatron_ffn_default(hidden_size: int, swiglu: bool) -> int:
    """The MLP width Megatron-LM gives a model whose ``--ffn-hidden-size`` is not set: 4·h, or with
    ``--swiglu`` two thirds of it (three matrices instead of two, about the same parameters), down to
    a multiple of 64."""
    return int(4 * hidden_size * 2 / 3 / 64) * 64 if swiglu else 4 * hidden_size


def complete_spec(model: ModelSpec | Mapping[str, object]) -> ModelSpec:
    """The spec with the fields its others define filled in: kv_channels = hidden_size ÷
    num_attention_heads (the head size, by definition, where it divides), padded_vocab_size =
    vocab_size (a plain PyTorch model pads nothing; Megatron's padding is its own and its log states
    the padded size). ``model``: see read_spec. Fields that nothing defines (seq_length, ...) stay
    absent."""
    return read_spec(model).spec


@dataclass(frozen=True)
class TokenFlops:
    """FLOPs of a step as a function of its tokens and sequence length, for one model:
    ``tokens · (per_token + per_token_per_position · seq_length)`` (the core attention grows with the
    sequence; everything else is per token). What ``StepHook(model=...)`` uses per step."""

    per_token: float
    per_token_per_position: float
    spec: ModelSpec
    formula: str
    notes: tuple[str, ...] = ()  # how ``model`` was read (read_spec): fields ignored, values derived

    def flops(self, tokens: float, seq_length: float) -> float:
        return tokens * (self.per_token + self.per_token_per_position * seq_length)


def token_flops(model: ModelSpec | Mapping[str, object], framework: str = "pytorch") -> TokenFlops:
    """perfd's formula (Megatron-Core's, docs/design.md §2) split into its per-token and per-position
    parts. Needs every field but seq_length; raises ValueError naming what is missing."""
    reading = read_spec(model)
    spec = reading.spec
    probe = dataclasses.replace(spec, seq_length=1)
    got = megatron_flops(probe, 1, None, framework)
    if not got.available or got.flops_per_iteration is None or got.formula is None:
        missing = [m for m in got.missing if m != "global_batch_size"]
        # a refusal at construction, said here (the count's notes are codes, worded by the report)
        why = (("missing " + ", ".join(missing)) if missing
               else "multi-latent attention is not in perfd's formula" if spec.multi_latent_attention
               else "no formula applies")
        if "kv_channels" in missing:
            why += " (kv_channels = hidden_size ÷ num_attention_heads: give both, heads dividing hidden)"
        if "padded_vocab_size" in missing:
            why += " (vocab_size will do)"
        raise ValueError(f"model: cannot count FLOPs per step: {why}")
    core = got.breakdown.get("core_attention", 0.0)  # attn_factor · q · L at s = 1, one token
    return TokenFlops(got.flops_per_iteration - core, core, spec, got.formula, reading.notes)


def flops_for_tokens(model: ModelSpec | Mapping[str, object], tokens_per_step: float,
                     seq_length: float | None = None) -> float:
    """The whole job's model FLOPs per step for ``tokens_per_step`` tokens of sequences of
    ``seq_length`` (default: the spec's): perfd's formula from the model's shape. Raises ValueError
    (at construction, not in the loop) naming what is missing or unknown, rather than sending steps
    with no FLOPs."""
    tf = token_flops(model)
    seq = seq_length if seq_length is not None else tf.spec.seq_length
    if seq is None or not seq > 0:
        raise ValueError("model: cannot count FLOPs per step: missing seq_length (give it in model=, or "
                         "per step: step_end(seq_len=...))")
    if not (isinstance(tokens_per_step, (int, float)) and math.isfinite(tokens_per_step)
            and tokens_per_step > 0):
        raise ValueError(f"model: cannot count FLOPs per step: tokens_per_step {tokens_per_step!r} is not "
                         "a positive number")
    return tf.flops(float(tokens_per_step), float(seq))
