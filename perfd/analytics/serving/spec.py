"""What serving MBU and MFU need: the model (perfd.serving_model.ServingModelSpec), the hardware peaks,
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

Absent inputs give absent results, each with the reason (docs/design.md §2: never a silent 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfd.analytics.common import MetricValue
from perfd.analytics.steps.gpus import peak_memory_bandwidth, peak_tflops
from perfd.dtypes import normalize_dtype
from perfd.model import Provenance
from perfd.serving_model import ServingModelSpec
from perfd.serving_records import ServerInfo

DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
# SGLang --kv-cache-dtype values
KV_DTYPE_BYTES: dict[str, float] = {"fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8": 1.0, "bf16": 2.0,
                                    "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0, "fp32": 4.0, "float32": 4.0}
# SGLang --quantization values whose weights are one byte per parameter
FP8_QUANT = frozenset({"fp8", "w8a8_fp8", "modelopt", "modelopt_fp8", "fbgemm_fp8", "compressed-tensors"})


@dataclass(frozen=True)
class Resolved:
    """The numbers MBU/MFU use, per GPU, each with where it came from or why it is absent."""

    weight_bytes_gpu: MetricValue  # weights one GPU holds (and reads once per decode step)
    kv_bytes_per_token_gpu: MetricValue  # KV bytes one GPU holds per token in the pool
    flops_per_token: MetricValue  # whole model
    dtype: str | None


def _dtype(spec: ServingModelSpec, server: ServerInfo | None) -> tuple[str | None, str]:
    if spec.dtype:
        return normalize_dtype(spec.dtype), "config dtype"
    raw = server.arg_str("dtype") if server else None
    if raw and raw != "auto":
        return normalize_dtype(raw), "server_args dtype"
    if server and server.torch_dtype:
        return normalize_dtype(server.torch_dtype), "'Load weight end' dtype"
    return None, "dtype unknown (server_args dtype 'auto' or absent): give the model dtype"


def _cfg(value: float, detail: str) -> MetricValue:
    return MetricValue(value, Provenance("config", detail))


def _log(value: float, detail: str) -> MetricValue:
    return MetricValue(value, Provenance("sglang-log", detail))


def _weights_total(spec: ServingModelSpec, server: ServerInfo | None, dtype: str | None,
                   dsrc: str) -> MetricValue | None:
    """All weights from the config (None when the config says nothing about them)."""
    if spec.weight_bytes is not None:
        return _cfg(spec.weight_bytes, f"weight_bytes={spec.weight_bytes:g}")
    if spec.params is None:
        return None
    quant = server.arg_str("quantization") if server else None
    if quant and quant in FP8_QUANT:
        return _cfg(spec.params, f"params={spec.params:g} × 1 B (quantization {quant})")
    if quant:
        return MetricValue.absent(f"quantization {quant!r}: bytes per weight unknown; give weight_bytes")
    if dtype is None or dtype not in DTYPE_BYTES:
        return MetricValue.absent(f"weight bytes: {dsrc}")
    b = DTYPE_BYTES[dtype]
    return _cfg(spec.params * b, f"params={spec.params:g} × {b:g} B ({dtype}, {dsrc})")


def _kv_total(spec: ServingModelSpec, server: ServerInfo | None, dtype: str | None) -> MetricValue | None:
    """KV bytes per token of the whole model from the config (None when it says nothing)."""
    if spec.kv_bytes_per_token is not None:
        return _cfg(spec.kv_bytes_per_token, f"kv_bytes_per_token={spec.kv_bytes_per_token:g}")
    head_dim = spec.head_dim
    if head_dim is None and spec.hidden_size and spec.num_attention_heads:
        head_dim = spec.hidden_size // spec.num_attention_heads
    if spec.num_layers is None and spec.num_kv_heads is None and head_dim is None:
        return None
    kv_raw = spec.kv_dtype or (server.arg_str("kv_cache_dtype") if server else None)
    if kv_raw in (None, "auto"):
        kv_b, kv_what = DTYPE_BYTES.get(dtype or ""), f"KV dtype = model dtype {dtype}"
    else:
        assert kv_raw is not None
        kv_b = KV_DTYPE_BYTES.get(kv_raw.lower()) or DTYPE_BYTES.get(normalize_dtype(kv_raw) or "")
        kv_what = f"KV dtype {kv_raw}"
    missing = [n for n, v in (("layers", spec.num_layers), ("kv heads", spec.num_kv_heads),
                              ("head dim (or hidden and heads)", head_dim), ("KV dtype bytes", kv_b))
               if not v]
    if missing:
        return MetricValue.absent(f"KV bytes per token: {', '.join(missing)} unknown")
    assert spec.num_layers and spec.num_kv_heads and head_dim and kv_b
    return _cfg(2.0 * spec.num_layers * spec.num_kv_heads * head_dim * kv_b,
                f"2 × {spec.num_layers} layers × {spec.num_kv_heads} KV heads × {head_dim} head dim × "
                f"{kv_b:g} B ({kv_what})")


def resolve(spec: ServingModelSpec, server: ServerInfo | None = None, gpus_per_group: int | None = None,
            gpus_reason: str = "GPUs per DP group unknown") -> Resolved:
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
        w = (MetricValue(w.value / gpg, Provenance("config", f"{w.source.detail if w.source else ''} ÷ {gpg} "
                                                             "GPUs"))
             if gpg else MetricValue.absent(f"weights per GPU: {gpus_reason}"))
    elif w is None:
        if server and server.weight_bytes_per_gpu:
            w = _log(server.weight_bytes_per_gpu, "'Load weight end' mem "
                                                  f"usage={server.weight_bytes_per_gpu / 2**30:.2f}"
                                                  " GB per GPU")
        else:
            w = MetricValue.absent("weight bytes unknown: give --model-params (or the log's 'Load weight "
                                   "end ... mem usage' line)")
    kv = _kv_total(spec, server, dtype)
    if kv is not None and kv.value is not None:
        rep = tp / spec.num_kv_heads if spec.num_kv_heads and tp and tp > spec.num_kv_heads else 1.0
        what = kv.source.detail if kv.source else ""
        what += f" × {rep:g} (KV heads replicated)" if rep > 1 else ""
        kv = (MetricValue(kv.value * rep / gpg, Provenance("config", f"{what} ÷ {gpg} GPUs")) if gpg
              else MetricValue.absent(f"KV per GPU: {gpus_reason}"))
    elif kv is None:
        if server and server.kv_pool_bytes_per_gpu and server.kv_pool_tokens:
            kv = _log(server.kv_pool_bytes_per_gpu / server.kv_pool_tokens,
                      f"'KV Cache is allocated' {server.kv_pool_bytes_per_gpu / 2**30:.2f} GB ÷ "
                      f"{server.kv_pool_tokens} tokens per GPU")
        else:
            kv = MetricValue.absent("KV bytes per token unknown: give layers, KV heads, head dim (or "
                                    "--kv-bytes-per-token), or keep the log's 'KV Cache is allocated' line")
    n = spec.active_params or spec.params
    which = "active_params" if spec.active_params else "params"
    fl = (_cfg(2.0 * n, f"2 × {which}={n:g} FLOPs per token") if n
          else MetricValue.absent("model parameter count unknown (--model-params)"))
    return Resolved(w, kv, fl, dtype)


def gpus_per_group(spec: ServingModelSpec, server: ServerInfo | None, groups: int) -> tuple[int | None, str]:
    """GPUs behind one logging scheduler (one DP group), and how that was decided."""
    if spec.gpus:
        return (spec.gpus // max(groups, 1) or None), f"config gpus={spec.gpus} over {groups} DP group(s)"
    tp = spec.tp or (server.arg_int("tp_size") if server else None)
    pp = spec.pp or (server.arg_int("pp_size") if server else None) or None
    if tp is None:
        return None, "tensor-parallel size unknown (no server_args line; give --tp or --gpus)"
    if server and server.arg_str("enable_dp_attention") == "True" and not spec.gpus:
        return None, "DP attention shares the TP GPUs between DP groups: give --gpus"
    return tp * (pp or 1), f"TP={tp} × PP={pp or 1} per DP group"


@dataclass(frozen=True)
class Peaks:
    flops: float | None  # FLOP/s per GPU
    bandwidth: float | None  # bytes/s per GPU
    flops_source: str
    bandwidth_source: str


def peaks(gpu_name: str | None, dtype: str | None, peak_tflops_override: float | None = None,
          bandwidth_override: float | None = None) -> Peaks:
    pk = peak_tflops(gpu_name, dtype, peak_tflops_override)
    bw = peak_memory_bandwidth(gpu_name, bandwidth_override)
    return Peaks(pk.peak_tflops * 1e12 if pk.peak_tflops else None,
                 bw.bytes_per_s,
                 str(pk.source) if pk.source else (pk.reason or "peak FLOP/s unknown"),
                 str(bw.source) if bw.source else (bw.reason or "peak bandwidth unknown"))


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
