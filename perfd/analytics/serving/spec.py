"""What serving MBU and MFU need: the model (perfd.core.serving_model.ServingModelSpec), the hardware peaks,
and the formulas.

Definitions (per GPU, over wall-clock time of the window):

- **decode MBU** = bytes one decode step must read ÷ step time ÷ (GPUs × peak memory bandwidth).
  Bytes per step = all weights once (W) + the KV cache of every running request (KV tokens in use ×
  KV bytes per token). Steps per second = generated tokens/s ÷ (running requests × tokens per step),
  tokens per step = the speculative ``accept len`` when logged, else 1. With tensor parallelism
  each GPU reads 1/TP of it, except KV heads replicated when TP > KV heads. An estimate: it ignores
  activations and treats every weight as read once per step (for MoE that is an upper bound).
- **decode MFU** = 2 · N_active · generated tokens/s ÷ (GPUs × peak dense FLOP/s);
  **prefill MFU** = the same with computed (non-cached) prompt tokens/s. 2·N per token leaves out
  attention FLOPs (small against 2·N for short contexts; an under-estimate for long ones). Both are
  wall-clock shares: decode MFU + prefill MFU is the job's model FLOPs utilisation.

Absent inputs give absent results, each with the reason (docs/design.md §2: never a silent 0). Sources
and reasons are codes and their numbers (perfd.analytics.steps.provenance: the SG_ codes), worded where
they are shown (perfd.report.serving_report).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfd.analytics.steps.gpus import peak_memory_bandwidth, peak_tflops
from perfd.analytics.steps.provenance import Arg, Cited, Code, cite
from perfd.core.dtypes import normalize_dtype
from perfd.core.serving_model import ServingModelSpec
from perfd.core.serving_records import ServerInfo

DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
# SGLang --kv-cache-dtype values
KV_DTYPE_BYTES: dict[str, float] = {"fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8": 1.0, "bf16": 2.0,
                                    "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0, "fp32": 4.0, "float32": 4.0}
# SGLang --quantization values whose weights are one byte per parameter
FP8_QUANT = frozenset({"fp8", "w8a8_fp8", "modelopt", "modelopt_fp8", "fbgemm_fp8", "compressed-tensors"})


@dataclass(frozen=True)
class MetricValue:
    """A number with where it came from, or None with why it is absent (never a silent 0): each a code
    and its arguments, a source its collector's code around its detail (Code.SG_LOG, ...)."""

    value: float | None
    source: Cited | None = None
    reason: Cited | None = None  # why value is None

    @staticmethod
    def absent(reason: Cited) -> MetricValue:
        return MetricValue(None, None, reason)

    @property
    def present(self) -> bool:
        return self.value is not None

    @property
    def detail(self) -> Arg:
        """The source's detail without its collector (as another source quotes it); "" without one."""
        return self.source.args[0] if self.source is not None else ""


@dataclass(frozen=True)
class Resolved:
    """The numbers MBU/MFU use, per GPU, each with where it came from or why it is absent."""

    weight_bytes_gpu: MetricValue  # weights one GPU holds (and reads once per decode step)
    kv_bytes_per_token_gpu: MetricValue  # KV bytes one GPU holds per token in the pool
    flops_per_token: MetricValue  # whole model
    dtype: str | None


def _dtype(spec: ServingModelSpec, server: ServerInfo | None) -> tuple[str | None, Cited]:
    if spec.dtype:
        return normalize_dtype(spec.dtype), cite(Code.SG_DTYPE_CONFIG)
    raw = server.arg_str("dtype") if server else None
    if raw and raw != "auto":
        return normalize_dtype(raw), cite(Code.SG_DTYPE_SERVER_ARGS)
    if server and server.torch_dtype:
        return normalize_dtype(server.torch_dtype), cite(Code.SG_DTYPE_LOAD_WEIGHT)
    return None, cite(Code.SG_DTYPE_UNKNOWN)


def _cfg(value: float, detail: Cited) -> MetricValue:
    return MetricValue(value, cite(Code.SG_CONFIG, detail))


def _log(value: float, detail: Cited) -> MetricValue:
    return MetricValue(value, cite(Code.SG_LOG, detail))


def _absent(code: Code, *args: Arg) -> MetricValue:
    return MetricValue.absent(cite(code, *args))


def _weights_total(spec: ServingModelSpec, server: ServerInfo | None, dtype: str | None,
                   dsrc: Cited) -> MetricValue | None:
    """All weights from the config (None when the config says nothing about them)."""
    if spec.weight_bytes is not None:
        return _cfg(spec.weight_bytes, cite(Code.SG_WEIGHT_BYTES, spec.weight_bytes))
    if spec.params is None:
        return None
    quant = server.arg_str("quantization") if server else None
    if quant and quant in FP8_QUANT:
        return _cfg(spec.params, cite(Code.SG_PARAMS_QUANT, spec.params, quant))
    if quant:
        return _absent(Code.SG_QUANT_UNKNOWN, quant)
    if dtype is None or dtype not in DTYPE_BYTES:
        return _absent(Code.SG_NO_WEIGHT_DTYPE, dsrc)
    b = DTYPE_BYTES[dtype]
    return _cfg(spec.params * b, cite(Code.SG_PARAMS_DTYPE, spec.params, b, dtype, dsrc))


def _kv_total(spec: ServingModelSpec, server: ServerInfo | None, dtype: str | None) -> MetricValue | None:
    """KV bytes per token of the whole model from the config (None when it says nothing)."""
    if spec.kv_bytes_per_token is not None:
        return _cfg(spec.kv_bytes_per_token, cite(Code.SG_KV_BYTES, spec.kv_bytes_per_token))
    head_dim = spec.head_dim
    if head_dim is None and spec.hidden_size and spec.num_attention_heads:
        head_dim = spec.hidden_size // spec.num_attention_heads
    if spec.num_layers is None and spec.num_kv_heads is None and head_dim is None:
        return None
    kv_raw = spec.kv_dtype or (server.arg_str("kv_cache_dtype") if server else None)
    if kv_raw in (None, "auto"):
        kv_b, kv_what = DTYPE_BYTES.get(dtype or ""), cite(Code.SG_KV_DTYPE_MODEL, str(dtype))
    else:
        assert kv_raw is not None
        kv_b = KV_DTYPE_BYTES.get(kv_raw.lower()) or DTYPE_BYTES.get(normalize_dtype(kv_raw) or "")
        kv_what = cite(Code.SG_KV_DTYPE_GIVEN, kv_raw)
    missing = [n for n, v in (("layers", spec.num_layers), ("kv heads", spec.num_kv_heads),
                              ("head dim (or hidden and heads)", head_dim), ("KV dtype bytes", kv_b))
               if not v]
    if missing:
        return _absent(Code.SG_KV_MISSING, tuple(missing))
    assert spec.num_layers and spec.num_kv_heads and head_dim and kv_b
    return _cfg(2.0 * spec.num_layers * spec.num_kv_heads * head_dim * kv_b,
                cite(Code.SG_KV_FORMULA, spec.num_layers, spec.num_kv_heads, head_dim, kv_b, kv_what))


GPUS_UNKNOWN = cite(Code.SG_GPUS_UNKNOWN)  # why the GPUs per DP group are absent, when no one says


def resolve(spec: ServingModelSpec, server: ServerInfo | None = None, gpus_per_group: int | None = None,
            gpus_reason: Cited = GPUS_UNKNOWN) -> Resolved:
    """Per-GPU weight bytes and KV bytes per token, and FLOPs per token.

    The config (``spec``) wins; what it does not state comes from the log's start-up lines, which
    are per GPU already: ``Load weight end ... mem usage=X GB`` (weights) and ``KV Cache is
    allocated. #tokens: N, K size/V size`` (KV bytes per token, replication included).
    """
    dtype, dsrc = _dtype(spec, server)
    tp = spec.tp or (server.arg_int("tp_size") if server else None)
    gpg = gpus_per_group
    w = _weights_total(spec, server, dtype, dsrc)
    if w is not None and w.value is not None:
        w = (_cfg(w.value / gpg, cite(Code.SG_PER_GPU, w.detail, gpg))
             if gpg else _absent(Code.SG_WEIGHTS_PER_GPU_UNKNOWN, gpus_reason))
    elif w is None:
        if server and server.weight_bytes_per_gpu:
            gib = server.weight_bytes_per_gpu / 2**30
            w = _log(server.weight_bytes_per_gpu, cite(Code.SG_WEIGHTS_LOGGED, gib))
        else:
            w = _absent(Code.SG_WEIGHTS_UNKNOWN)
    kv = _kv_total(spec, server, dtype)
    if kv is not None and kv.value is not None:
        rep = tp / spec.num_kv_heads if spec.num_kv_heads and tp and tp > spec.num_kv_heads else 1.0
        what = cite(Code.SG_KV_REPLICATED, kv.detail, rep) if rep > 1 else kv.detail
        kv = (_cfg(kv.value * rep / gpg, cite(Code.SG_PER_GPU, what, gpg)) if gpg
              else _absent(Code.SG_KV_PER_GPU_UNKNOWN, gpus_reason))
    elif kv is None:
        if server and server.kv_pool_bytes_per_gpu and server.kv_pool_tokens:
            kv = _log(server.kv_pool_bytes_per_gpu / server.kv_pool_tokens,
                      cite(Code.SG_KV_LOGGED, server.kv_pool_bytes_per_gpu / 2**30, server.kv_pool_tokens))
        else:
            kv = _absent(Code.SG_KV_UNKNOWN)
    n = spec.active_params or spec.params
    which = "active_params" if spec.active_params else "params"
    fl = (_cfg(2.0 * n, cite(Code.SG_FLOPS_PER_TOKEN, which, n)) if n
          else _absent(Code.SG_PARAMS_UNKNOWN))
    return Resolved(w, kv, fl, dtype)


def gpus_per_group(spec: ServingModelSpec, server: ServerInfo | None, groups: int
                   ) -> tuple[int | None, Cited]:
    """GPUs behind one logging scheduler (one DP group), and how that was decided (or why not)."""
    if spec.gpus:
        return (spec.gpus // max(groups, 1) or None), cite(Code.SG_GPUS_CONFIG, spec.gpus, groups)
    tp = spec.tp or (server.arg_int("tp_size") if server else None)
    pp = spec.pp or (server.arg_int("pp_size") if server else None) or None
    if tp is None:
        return None, cite(Code.SG_TP_UNKNOWN)
    if server and server.arg_str("enable_dp_attention") == "True" and not spec.gpus:
        return None, cite(Code.SG_DP_ATTENTION)
    return tp * (pp or 1), cite(Code.SG_GPUS_TP_PP, tp, pp or 1)


@dataclass(frozen=True)
class Peaks:
    flops: float | None  # FLOP/s per GPU
    bandwidth: float | None  # bytes/s per GPU
    flops_source: Cited  # the peak's source (quoted), or why there is none
    bandwidth_source: Cited


def peaks(gpu_name: str | None, dtype: str | None, peak_tflops_override: float | None = None,
          bandwidth_override: float | None = None) -> Peaks:
    pk = peak_tflops(gpu_name, dtype, peak_tflops_override)
    bw = peak_memory_bandwidth(gpu_name, bandwidth_override)
    flops_src = pk.source or pk.reason or cite(Code.SG_PEAK_FLOPS_UNKNOWN)
    bw_src = bw.source or bw.reason or cite(Code.SG_PEAK_BANDWIDTH_UNKNOWN)
    return Peaks(pk.peak_tflops * 1e12 if pk.peak_tflops else None, bw.bytes_per_s, flops_src, bw_src)


def decode_step_rate(gen_tps: float | None, running: float | None, accept_len: float | None) -> float | None:
    """Decode steps per second of one scheduler: tokens/s ÷ (running requests × tokens per step)."""
    if gen_tps is None or running is None or running <= 0 or not math.isfinite(gen_tps):
        return None
    per_step = accept_len if accept_len is not None and accept_len > 0 else 1.0
    return gen_tps / (running * per_step)


def decode_bytes_per_step(res: Resolved, kv_tokens: float | None) -> float | None:
    """Bytes one decode step reads on one GPU: its weights + its share of the running requests' KV."""
    if res.weight_bytes_gpu.value is None or res.kv_bytes_per_token_gpu.value is None or kv_tokens is None:
        return None
    return res.weight_bytes_gpu.value + kv_tokens * res.kv_bytes_per_token_gpu.value
