"""The served model as a serving job's configuration states it (``model:`` of the sglang collector and
of the aggregator's serving analysis): checked by the collector at start-up, read by the analysis
(perfd.analytics.serving.spec), so it sits below both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ServingModelSpec:
    """The served model and its placement. Any field may be None; what needs it is then absent.

    ``params`` (total) sets the weight bytes; ``active_params`` (per token, MoE) the FLOPs (default
    ``params``). KV bytes per token come from ``kv_bytes_per_token`` (whole model, K and V, all
    layers) or from layers × KV heads × head dim (or hidden / heads) × 2 × the KV dtype's bytes.
    ``tp``/``pp``/``gpus`` override what the log's ``server_args`` line says.
    """

    params: float | None = None
    active_params: float | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str | None = None  # weights / compute dtype: bf16, fp16, fp8, fp32
    kv_dtype: str | None = None  # KV cache dtype (SGLang --kv-cache-dtype); default: dtype
    weight_bytes: float | None = None  # all weights, bytes (overrides params × dtype bytes)
    kv_bytes_per_token: float | None = None  # whole model, bytes (overrides the formula)
    tp: int | None = None
    pp: int | None = None
    gpus: int | None = None  # GPUs serving the model in total (overrides tp × pp × DP groups)

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any] | None) -> ServingModelSpec:
        """From a config mapping (unknown keys raise ValueError: a typo must not silently drop MBU)."""
        if not d:
            return cls()
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown model spec key(s) {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(names))}")
        kw: dict[str, Any] = {}
        for k, v in d.items():
            if v is None:
                continue
            if k in ("dtype", "kv_dtype"):
                kw[k] = str(v)
            elif k in ("params", "active_params", "weight_bytes", "kv_bytes_per_token"):
                kw[k] = float(v)
            else:
                kw[k] = int(v)
        return cls(**kw)

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))
