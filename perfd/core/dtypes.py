"""The dtype names perfd speaks (a job's compute dtype, the peak table's keys) and the spellings
accepted for them: read by the collectors that take a job's dtype (the step hook, torchtitan) and by
the analysis, so it sits below both.
"""

from __future__ import annotations

# Canonical dtype names and the spellings accepted for them.
_DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "fp8": "fp8",
    "float8": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "hybrid": "fp8",  # Megatron --fp8-format hybrid
    "tf32": "tf32",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
}

DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "tf32", "fp32")


def normalize_dtype(dtype: str | None) -> str | None:
    """Canonical dtype name ("bf16", "fp16", "fp8", "tf32", "fp32") or None if unknown."""
    if dtype is None:
        return None
    return _DTYPE_ALIASES.get(dtype.strip().lower())
