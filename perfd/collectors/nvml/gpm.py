"""GPM (GPU Performance Monitoring, Hopper and newer): metrics between two samples.

NVML computes GPM metrics from two ``nvmlGpmSampleGet`` snapshots: the sampler keeps the previous
snapshot and, on every step, takes a new one and asks ``nvmlGpmMetricsGet`` for the metrics over the
window between them (one collect interval). Two sample buffers are allocated once and swapped, so a
step costs one sample (~45 µs on an H200) plus one metrics computation, and no allocation.

GPM is what separates a launch-bound job (NVML "utilization" high, SM util ~0) from a compute-bound
one (docs/design.md §2); PCIe and NVLink rates come from here too, because the direct NVML calls for them
are 1–20 ms each and must never sit on the sampling path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from perfd.collectors.config_values import as_int
from perfd.collectors.nvml.probe import is_permanent
from perfd.collectors.nvml.wrapper import Nvml

_PERCENT = 0.01  # GPM utilisations are 0.0-100.0; perfd ratios are 0-1
# NVML return codes for a metric this device will never give: InvalidArgument, NotSupported.
_REFUSED_FOR_GOOD = frozenset({2, 3})
_MIB = 1024.0 * 1024.0  # GPM PCIe/NVLink rates are MiB/s (nvml.h); perfd reports bytes/s


@dataclass(frozen=True)
class GpmMetric:
    name: str  # catalog name
    const: str  # pynvml constant
    default_id: int  # nvml.h value, used when this pynvml lacks the constant
    scale: float
    ratio: bool


GPM_METRICS: tuple[GpmMetric, ...] = (
    GpmMetric("perfd_gpu_sm_util_ratio", "NVML_GPM_METRIC_SM_UTIL", 2, _PERCENT, True),
    GpmMetric("perfd_gpu_sm_occupancy_ratio", "NVML_GPM_METRIC_SM_OCCUPANCY", 3, _PERCENT, True),
    GpmMetric("perfd_gpu_tensor_util_ratio", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5, _PERCENT, True),
    GpmMetric("perfd_gpu_dram_bw_util_ratio", "NVML_GPM_METRIC_DRAM_BW_UTIL", 10, _PERCENT, True),
    GpmMetric("perfd_gpu_fp64_util_ratio", "NVML_GPM_METRIC_FP64_UTIL", 11, _PERCENT, True),
    GpmMetric("perfd_gpu_fp32_util_ratio", "NVML_GPM_METRIC_FP32_UTIL", 12, _PERCENT, True),
    GpmMetric("perfd_gpu_fp16_util_ratio", "NVML_GPM_METRIC_FP16_UTIL", 13, _PERCENT, True),
    GpmMetric("perfd_gpu_pcie_tx_bytes_per_second", "NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20, _MIB, False),
    GpmMetric("perfd_gpu_pcie_rx_bytes_per_second", "NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21, _MIB, False),
    GpmMetric("perfd_gpu_nvlink_rx_bytes_per_second", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", 60, _MIB,
              False),
    GpmMetric("perfd_gpu_nvlink_tx_bytes_per_second", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", 61, _MIB,
              False),
)


def convert(metric: GpmMetric, raw: float) -> float | None:
    """Raw GPM value -> perfd unit; None for values that cannot be right (NaN, negative)."""
    if not math.isfinite(raw) or raw < 0:
        return None
    value = raw * metric.scale
    # A window's rounding can give 100.2 %; a ratio above 1 would only confuse thresholds.
    return min(value, 1.0) if metric.ratio else value


class _GpmMetric(Protocol):
    """nvmlGpmMetric_t: one metric asked for (metricId), and NVML's answer."""

    metricId: int
    nvmlReturn: int
    value: float


class _GpmMetricsGet(Protocol):
    """nvmlGpmMetricsGet_t: the request nvmlGpmMetricsGet fills in (pynvml's ctypes structure)."""

    version: int
    numMetrics: int
    sample1: object
    sample2: object
    metrics: Sequence[_GpmMetric]


class GpmSampler:
    """Per-device GPM state: two sample buffers, the previous one valid or not."""

    def __init__(self, nvml: Nvml, handle: object) -> None:
        self._nvml = nvml
        self._handle = handle  # NVML's device handle
        self._prev: object | None = None  # GPM sample buffers (nvmlGpmSampleAlloc), opaque
        self._cur: object | None = None
        self._have_prev = False
        self.enabled = False
        self.metrics = tuple((m, as_int(nvml.const(m.const, m.default_id))) for m in GPM_METRICS)
        self.errors: dict[str, int] = {}  # "<catalog name>:<error>" -> count, for metrics NVML refused

    def start(self) -> bool:
        """Allocate the two buffers and take the first snapshot. False when GPM cannot be used."""
        self._prev = self._nvml.call("nvmlGpmSampleAlloc")
        self._cur = self._nvml.call("nvmlGpmSampleAlloc")
        if self._prev is None or self._cur is None or self._nvml.const("c_nvmlGpmMetricsGet_t", None) is None:
            self.close()
            return False
        self.enabled = True
        self._have_prev = self._snapshot(self._prev)
        return self.enabled

    def _snapshot(self, buf: object) -> bool:
        self._nvml.call("nvmlGpmSampleGet", self._handle, buf)
        err = self._nvml.last_error
        if err is not None and is_permanent(err):
            self.close()
        return err is None

    def step(self) -> dict[str, float]:
        """Take a snapshot; metrics (catalog name -> value) over the window since the last one."""
        if not self.enabled or self._cur is None:
            return {}
        if not self._snapshot(self._cur):
            self._have_prev = False  # the next good snapshot starts a new window
            return {}
        out: dict[str, float] = {}
        if self._have_prev:
            out = self._metrics(self._prev, self._cur)
        # The new snapshot becomes the base of the next window: swap the buffers.
        self._prev, self._cur = self._cur, self._prev
        self._have_prev = True
        return out

    def _metrics(self, sample1: object, sample2: object) -> dict[str, float]:
        # The structure's class is pynvml's (start() checked it is there): a ctypes Structure, with
        # the fields _GpmMetricsGet names.
        struct_cls = cast("Callable[[], _GpmMetricsGet]", self._nvml.const("c_nvmlGpmMetricsGet_t", None))
        mg = struct_cls()
        mg.version = as_int(self._nvml.const("NVML_GPM_METRICS_GET_VERSION", 1))
        mg.numMetrics = len(self.metrics)
        mg.sample1 = sample1
        mg.sample2 = sample2
        for i, (_, mid) in enumerate(self.metrics):
            mg.metrics[i].metricId = mid
        if self._nvml.call("nvmlGpmMetricsGet", mg) is None:
            if is_permanent(self._nvml.last_error):
                self.close()
            return {}
        out: dict[str, float] = {}
        refused: set[int] = set()
        for i, (m, mid) in enumerate(self.metrics):
            entry = mg.metrics[i]
            ret = int(entry.nvmlReturn)
            if ret != 0:
                # e.g. NVLink metrics on a board without NVLink: that metric is absent, not 0.
                key = f"{m.name}:{ret}"
                self.errors[key] = self.errors.get(key, 0) + 1
                if ret in _REFUSED_FOR_GOOD:
                    refused.add(mid)
                continue
            value = convert(m, float(entry.value))
            if value is not None:
                out[m.name] = value
        if refused:  # stop asking for metrics this device will never give
            self.metrics = tuple((m, mid) for m, mid in self.metrics if mid not in refused)
            if not self.metrics:
                self.close()
        return out

    def close(self) -> None:
        for buf in (self._prev, self._cur):
            if buf is not None:
                self._nvml.call("nvmlGpmSampleFree", buf)
        self._prev = self._cur = None
        self._have_prev = False
        self.enabled = False
