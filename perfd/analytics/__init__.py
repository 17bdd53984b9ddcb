"""perfd analytics: pure functions over plain data (no I/O).

Public entry points:
- ``analyze_run(job, records, gpu_name=None, peak_tflops=None, dtype=None) -> RunAnalysis``
- ``model_flops`` / ``megatron_flops`` / ``six_n_flops`` (flops), ``peak_tflops`` / ``lookup_gpu`` (gpus)
- per-iteration metrics in ``metrics``, ``pipeline``, ``stragglers``, ``bottleneck``, ``steady``.
"""

from perfd.analytics.advice.findings import grade_mfu
from perfd.analytics.breakdown.bottleneck import Bottleneck, GpmReading, classify, classify_gpm
from perfd.analytics.common import MetricValue
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.analytics.steps.flops import FlopsResult, megatron_flops, model_flops, six_n_flops
from perfd.analytics.steps.gpus import GpuModel, PeakResult, lookup_gpu, peak_tflops
from perfd.analytics.steps.run_analysis import IterationResult, RunAnalysis, analyze_run

__all__ = [
    "Bottleneck",
    "Finding",
    "FlopsResult",
    "GpmReading",
    "GpuModel",
    "IterationResult",
    "MetricValue",
    "PeakResult",
    "Recommendation",
    "RunAnalysis",
    "analyze_run",
    "classify",
    "classify_gpm",
    "grade_mfu",
    "lookup_gpu",
    "megatron_flops",
    "model_flops",
    "peak_tflops",
    "six_n_flops",
]
