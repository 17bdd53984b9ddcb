"""Peak dense TFLOP/s per GPU model and dtype: the ONE table perfd uses (docs/design.md §2 "MFU").

Keyed by patterns over the NVML device name (``nvmlDeviceGetName``: "NVIDIA H200",
"NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", ...). Values are the
vendor datasheet's *dense* (no 2:4 sparsity) tensor-core figures. A dtype a GPU has no figure
for is absent (``None``), never guessed. A configured explicit peak overrides the table.

The measured ceiling is what a large bf16 matmul actually reached on that model here (an 8192³
bf16 matmul ran at about 790 TFLOP/s on the H200 and the H100 SXM): reported beside MFU so a
reader sees how far the job is from what the chip really delivers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from perfd.analytics.steps.provenance import Cited, Code, cite
from perfd.core.dtypes import DTYPES, normalize_dtype


@dataclass(frozen=True)
class GpuModel:
    """One row of the peak table."""

    model: str  # canonical model name, e.g. "H100 SXM"
    patterns: tuple[str, ...]  # case-insensitive regexes over the NVML device name
    peak_tflops: dict[str, float]  # dtype -> dense TFLOP/s (datasheet); missing dtype = unknown
    measured_ceiling_tflops: dict[str, float] = field(default_factory=dict)  # dtype -> measured
    datasheet: str = ""  # where the figures come from
    nvml_example: str = ""  # a name NVML reports for it (for messages that suggest a spelling)
    memory_gib: float | None = None  # the datasheet's memory (a name that states its size wins: "80GB")


# Order matters: the first row whose pattern matches wins, so specific names come before
# generic ones ("GB200" before "B200", "H100 PCIe"/"H100 NVL" before the SXM row).
GPU_TABLE: tuple[GpuModel, ...] = (
    GpuModel(
        "GB200",
        (r"\bGB200\b",),
        {"bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0},
        datasheet="NVIDIA GB200 NVL72 datasheet, per GPU, dense",
        nvml_example="NVIDIA GB200",
        memory_gib=186,
    ),
    GpuModel(
        "B200",
        (r"(?<![A-Z])B200\b",),
        {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
        datasheet="NVIDIA HGX B200 datasheet, per GPU, dense",
        nvml_example="NVIDIA B200",
        memory_gib=180,
    ),
    GpuModel(
        "H200 NVL",
        (r"\bH200\s+NVL\b",),
        {"bf16": 835.0, "fp16": 835.0, "fp8": 1670.0, "tf32": 418.0, "fp32": 60.0},
        datasheet="NVIDIA H200 NVL datasheet, dense",
        nvml_example="NVIDIA H200 NVL",
        memory_gib=141,
    ),
    GpuModel(
        "H200",
        (r"\bH200\b",),
        {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "tf32": 494.0, "fp32": 67.0},
        measured_ceiling_tflops={"bf16": 790.0},
        datasheet="NVIDIA H200 SXM datasheet, dense",
        nvml_example="NVIDIA H200",
        memory_gib=141,
    ),
    GpuModel(
        "GH200",
        (r"\bGH200\b",),
        {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "tf32": 494.0, "fp32": 67.0},
        datasheet="NVIDIA GH200 datasheet, dense",
        nvml_example="NVIDIA GH200 480GB",
        memory_gib=96,
    ),
    GpuModel(
        "H100 PCIe",
        (r"\bH100\b.*\bPCIe\b",),
        {"bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.0},
        datasheet="NVIDIA H100 PCIe datasheet, dense",
        nvml_example="NVIDIA H100 PCIe",
        memory_gib=80,
    ),
    GpuModel(
        "H100 NVL",
        (r"\bH100\s+NVL\b",),
        {"bf16": 835.0, "fp16": 835.0, "fp8": 1670.0, "tf32": 418.0, "fp32": 60.0},
        datasheet="NVIDIA H100 NVL datasheet, dense",
        nvml_example="NVIDIA H100 NVL",
        memory_gib=94,
    ),
    GpuModel(
        "H100 SXM",
        (r"\bH100\b.*\b(HBM3|SXM\d?)\b", r"\bH100\s+SXM"),
        {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "tf32": 494.0, "fp32": 67.0},
        measured_ceiling_tflops={"bf16": 790.0},
        datasheet="NVIDIA H100 SXM5 datasheet, dense",
        nvml_example="NVIDIA H100 80GB HBM3",
        memory_gib=80,
    ),
    GpuModel(
        "A100",
        (r"\bA100\b",),
        {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
        datasheet="NVIDIA A100 datasheet, dense (no fp8 on Ampere)",
        nvml_example="NVIDIA A100-SXM4-80GB",
    ),
    GpuModel(
        "L40S",
        (r"\bL40S\b",),
        {"bf16": 362.0, "fp16": 362.0, "fp8": 733.0, "tf32": 183.0, "fp32": 91.6},
        datasheet="NVIDIA L40S datasheet, dense",
        nvml_example="NVIDIA L40S",
        memory_gib=48,
    ),
)


def lookup_gpu(nvml_name: str | None) -> GpuModel | None:
    """The table row for an NVML device name, or None when the name is unknown or absent."""
    if not nvml_name:
        return None
    for row in GPU_TABLE:
        if any(re.search(p, nvml_name, flags=re.IGNORECASE) for p in row.patterns):
            return row
    return None


def gpu_suggestions(name: str, n: int = 4) -> tuple[list[str], list[str]]:
    """For a GPU name the table does not know: (the closest known names, the variants it could
    mean). "H100" is ambiguous (PCIe, NVL, SXM), so its variants are listed; "NVIDIA H2000" or
    "RTX 4090" get the nearest spellings by similarity (difflib). Names are NVML spellings, the
    form ``--gpu`` takes."""
    import difflib

    q = name.strip().upper()
    token = q.removeprefix("NVIDIA").strip()
    variants = [r.nvml_example for r in GPU_TABLE
                if token and re.search(rf"(?<![A-Z0-9]){re.escape(token)}(?![0-9])", r.model.upper())]
    known = {r.nvml_example.upper(): r.nvml_example for r in GPU_TABLE}
    known.update({r.model.upper(): r.nvml_example for r in GPU_TABLE})
    close = difflib.get_close_matches(q, list(known), n=n * 2, cutoff=0.4)
    if not close and token:
        close = difflib.get_close_matches(token, list(known), n=n * 2, cutoff=0.3)
    closest: list[str] = []
    for c in close:
        if known[c] not in closest:
            closest.append(known[c])
    return closest[:n], variants


_SIZE = re.compile(r"(\d{2,3})\s*GB\b", re.IGNORECASE)


def gpu_memory_mib(gpu_name: str | None) -> float | None:
    """The GPU's memory in MiB: the size its NVML name states ("NVIDIA H100 80GB HBM3"), else the peak
    table's datasheet figure; None for a GPU neither knows."""
    if not gpu_name:
        return None
    m = _SIZE.search(gpu_name)
    if m:
        return float(m.group(1)) * 1024
    row = lookup_gpu(gpu_name)
    return row.memory_gib * 1024 if row is not None and row.memory_gib else None


@dataclass(frozen=True)
class PeakResult:
    """The peak a job's MFU is measured against, or why there is none."""

    peak_tflops: float | None
    dtype: str | None
    gpu_model: str | None  # canonical row name, or None (unknown GPU / explicit override only)
    measured_ceiling_tflops: float | None
    source: Cited | None  # the table's row or the configured figure (FROM_GPU_TABLE / FROM_CONFIG around it)
    reason: Cited | None = None  # why peak_tflops is None: a code and its arguments (worded where shown)


def peak_tflops(
    gpu_name: str | None,
    dtype: str | None,
    override: float | None = None,
) -> PeakResult:
    """Peak dense TFLOP/s for ``gpu_name`` (NVML name) and ``dtype``; ``override`` wins.

    Never guesses: an unknown GPU, an unknown dtype or a dtype the table has no figure for gives
    ``peak_tflops=None`` with the reason.
    """
    canon = normalize_dtype(dtype)
    row = lookup_gpu(gpu_name)
    ceiling = row.measured_ceiling_tflops.get(canon) if (row is not None and canon) else None
    if override is not None:
        if override <= 0:
            return PeakResult(None, canon, row.model if row else None, ceiling, None,
                              reason=cite(Code.PEAK_NOT_POSITIVE, override))
        return PeakResult(float(override), canon, row.model if row else None, ceiling,
                          cite(Code.FROM_CONFIG, cite(Code.PEAK_OVERRIDE, override)))
    if row is None:
        return PeakResult(None, canon, None, None, None,
                          reason=(cite(Code.PEAK_GPU_UNLISTED, gpu_name) if gpu_name
                                  else cite(Code.PEAK_NO_GPU)))
    if canon is None:
        why = cite(Code.PEAK_NO_DTYPE) if dtype is None else cite(Code.PEAK_DTYPE_UNRECOGNISED, dtype, DTYPES)
        return PeakResult(None, None, row.model, None, None, reason=why)
    value = row.peak_tflops.get(canon)
    if value is None:
        return PeakResult(None, canon, row.model, ceiling, None,
                          reason=cite(Code.PEAK_NO_FIGURE, canon, row.model))
    row_src = cite(Code.PEAK_TABLE, row.model, canon, value, row.datasheet)
    return PeakResult(value, canon, row.model, ceiling, cite(Code.FROM_GPU_TABLE, row_src))


# --- peak memory bandwidth (for serving MBU) -------------------------------------------------
# A separate table from the FLOP/s rows above: bandwidth differs between variants the peak table
# groups together (an A100 40GB has 1.555 TB/s, the 80GB 2.0 TB/s), so it is keyed by its own
# patterns over the NVML name. Datasheet HBM/GDDR bandwidth in bytes/s; a GPU not listed is absent.
MEMORY_BANDWIDTH: dict[str, tuple[tuple[str, ...], float, str]] = {
    # model: (NVML name patterns, bytes/s, datasheet)
    "H100 PCIe": ((r"\bH100\b.*\bPCIe\b",), 2.0e12, "NVIDIA H100 PCIe datasheet: 2.0 TB/s"),
    "H100 SXM": ((r"\bH100\b.*\b(HBM3|SXM\d?)\b", r"\bH100\s+SXM"), 3.35e12,
                 "NVIDIA H100 SXM5 datasheet: 3.35 TB/s"),
    "H200": ((r"(?<![A-Z])H200\b",), 4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s"),
    "A100 80GB": ((r"\bA100\b.*\b80GB\b",), 2.0e12, "NVIDIA A100 80GB datasheet: ~2.0 TB/s"),
    "B200": ((r"(?<![A-Z])B200\b",), 8.0e12, "NVIDIA HGX B200 datasheet: 8 TB/s per GPU"),
    "L40S": ((r"\bL40S\b",), 0.864e12, "NVIDIA L40S datasheet: 864 GB/s"),
}


@dataclass(frozen=True)
class BandwidthResult:
    """Peak memory bandwidth a serving job's MBU is measured against, or why there is none."""

    bytes_per_s: float | None
    gpu_model: str | None
    source: Cited | None  # the bandwidth table's row or the configured figure
    reason: Cited | None = None  # why bytes_per_s is None: a code and its arguments


def peak_memory_bandwidth(gpu_name: str | None, override_bytes_per_s: float | None = None) -> BandwidthResult:
    """Datasheet memory bandwidth for an NVML device name; ``override_bytes_per_s`` wins. Never
    guessed: an unknown GPU gives ``bytes_per_s=None`` with the reason."""
    if override_bytes_per_s is not None:
        if override_bytes_per_s <= 0:
            return BandwidthResult(None, None, None, cite(Code.BANDWIDTH_NOT_POSITIVE, override_bytes_per_s))
        src = cite(Code.FROM_CONFIG, cite(Code.BANDWIDTH_OVERRIDE, override_bytes_per_s))
        return BandwidthResult(float(override_bytes_per_s), None, src)
    if not gpu_name:
        return BandwidthResult(None, None, None, cite(Code.BANDWIDTH_NO_GPU))
    for model, (patterns, bw, sheet) in MEMORY_BANDWIDTH.items():
        if any(re.search(p, gpu_name, flags=re.IGNORECASE) for p in patterns):
            src = cite(Code.FROM_GPU_TABLE, cite(Code.BANDWIDTH_TABLE, model, bw / 1e12, sheet))
            return BandwidthResult(bw, model, src)
    return BandwidthResult(None, None, None, cite(Code.BANDWIDTH_GPU_UNLISTED, gpu_name))
