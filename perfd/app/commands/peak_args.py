"""`--dtype` and `--peak-tflops` as every command that takes them checks them: refused with one line
(exit status 2) where they cannot be right, never turned into an "MFU unknown" or an MFU above 100%.

Before the analysis: a dtype perfd does not know (``int4``), a peak that is not a positive finite
number (``0``, ``-5``, ``nan``, ``inf``). After it: a peak the job beat (MFU above 100%,
perfd.analytics.thresholds.MFU_POSSIBLE) when the person gave the dtype or the peak — the peak is
wrong, and the line says which number made it and what the log says instead.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from perfd.core.dtypes import DTYPES, normalize_dtype

if TYPE_CHECKING:
    from perfd.analytics.run.run_result import RunAnalysis
    from perfd.core.model import JobInfo


def check_peak_tflops(peak: float | None, flag: str = "--peak-tflops", unit: str = "TFLOP/s per GPU",
                      example: str = "989 for an H100 SXM in bf16") -> str | None:
    """Why ``peak`` cannot be a GPU's peak (not finite, not positive), or None."""
    if peak is None:
        return None
    if not math.isfinite(peak) or peak <= 0:
        return f"{flag} must be a positive number of {unit} (got {peak:g}), e.g. {example}"
    return None


def check_dtype(dtype: str | None, flag: str = "--dtype") -> str | None:
    """Why ``dtype`` is not one perfd has peaks for (one line naming those it takes), or None."""
    if dtype is None or normalize_dtype(dtype) is not None:
        return None
    return (f"unknown {flag} {dtype!r}: it takes {', '.join(DTYPES)} (or torch's names: bfloat16, float16, "
            "float32)")


def check_peak_args(dtype: str | None, peak: float | None) -> str | None:
    """The first reason either flag is refused before the analysis, or None."""
    return check_dtype(dtype) or check_peak_tflops(peak)


def check_mfu_possible(analysis: RunAnalysis, job: JobInfo, dtype: str | None, peak: float | None
                       ) -> str | None:
    """Why the peak the person chose cannot be this job's: its steady MFU is above 100%. None when it
    is not, or when neither flag was given (the table's peak and the log's dtype: then the report says
    the peak is wrong and grades nothing)."""
    from perfd.analytics import thresholds as th
    from perfd.analytics.run.run_analysis import resolve_dtype

    mfu = analysis.summary.median("mfu")
    if (dtype is None and peak is None) or mfu is None or mfu <= th.MFU_POSSIBLE.value:
        return None
    got = analysis.summary.median("model_tflops_per_gpu")
    pk = analysis.peak
    from perfd.report.units import tflops

    achieved = (f"the {tflops(got)} TFLOP/s per GPU the job achieved" if got is not None
                else "what the job achieved")
    if peak is not None:
        return (f"--peak-tflops {peak:g} is below {achieved} (MFU {mfu:.0%}): give the GPU's dense peak for "
                "the job's dtype")
    own, _ = resolve_dtype(job, None)  # the job's own dtype, as its log or model spec says it
    logged = f"; the log trains in {own}" if own is not None and own != normalize_dtype(dtype) else ""
    return (f"--dtype {dtype} gives a peak of {pk.peak_tflops:g} TFLOP/s per GPU ({pk.gpu_model} "
            f"{pk.dtype}), below {achieved} (MFU {mfu:.0%}): it is not the job's dtype{logged}")
