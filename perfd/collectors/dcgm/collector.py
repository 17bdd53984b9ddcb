"""DCGM profiling fields from a running dcgm-exporter's /metrics, as perfd's GPU activity series.

On GPUs without GPM (A100, L40S, ...) NVML gives no SM / tensor / DRAM activity, but DCGM does, and
clusters often run dcgm-exporter already. This collector scrapes it and renames its profiling
fields to the catalog's ``perfd_gpu_*`` series, labelled ``source="dcgm-exporter"`` so every value
names where it came from. DCGM_FI_PROF_* are averages over DCGM's own sampling window, 0–1 (the
``*_BYTES`` ones bytes/s), the same units as the GPM-derived series. A field the exporter does not
serve is absent, never 0.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from perfd.collectors.collector import Capabilities, Collected, Collector
from perfd.collectors.config_values import as_float
from perfd.core.model import Sample

SOURCE = "dcgm-exporter"
# dcgm-exporter field name -> perfd catalog name (both in their base units).
FIELDS: dict[str, str] = {
    "DCGM_FI_PROF_SM_ACTIVE": "perfd_gpu_sm_util_ratio",
    "DCGM_FI_PROF_SM_OCCUPANCY": "perfd_gpu_sm_occupancy_ratio",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "perfd_gpu_tensor_util_ratio",
    "DCGM_FI_PROF_DRAM_ACTIVE": "perfd_gpu_dram_bw_util_ratio",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "perfd_gpu_fp16_util_ratio",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "perfd_gpu_fp32_util_ratio",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "perfd_gpu_fp64_util_ratio",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "perfd_gpu_pcie_tx_bytes_per_second",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "perfd_gpu_pcie_rx_bytes_per_second",
    "DCGM_FI_PROF_NVLINK_TX_BYTES": "perfd_gpu_nvlink_tx_bytes_per_second",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "perfd_gpu_nvlink_rx_bytes_per_second",
}
# Ratios outside [0, 1] are not DCGM profiling values: refused and counted, never clipped.
_RATIO = {n for n in FIELDS.values() if n.endswith("_ratio")}
MAX_BYTES = 8 << 20  # a dcgm-exporter page of 8 GPUs is ~100 KiB


@dataclass
class DcgmConfig:
    url: str = "http://127.0.0.1:9400/metrics"  # dcgm-exporter's default address
    timeout_s: float = 2.0

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> DcgmConfig:
        known = {"url", "timeout_s", "interval_s"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"dcgm collector: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        cfg = cls(url=str(d.get("url", cls.url)), timeout_s=as_float(d.get("timeout_s", cls.timeout_s)))
        if not cfg.url.startswith(("http://", "https://")):
            raise ValueError(f"dcgm collector: url must be http(s)://..., got {cfg.url!r}")
        if cfg.timeout_s <= 0:
            raise ValueError("dcgm collector: timeout_s must be > 0")
        return cfg


def samples_from_exposition(text: str, now: float) -> tuple[list[Sample], dict[str, int]]:
    """perfd samples from a dcgm-exporter page, and problems counted by reason."""
    out: list[Sample] = []
    problems: dict[str, int] = {}
    for fam in text_string_to_metric_families(text):
        name = FIELDS.get(fam.name)
        if name is None:
            continue
        for s in fam.samples:
            if s.name != fam.name:
                continue
            gpu = s.labels.get("gpu")
            if gpu is None:
                problems["no-gpu-label"] = problems.get("no-gpu-label", 0) + 1
                continue
            value = float(s.value)
            if value != value or (name in _RATIO and not 0.0 <= value <= 1.0) or value < 0:
                problems["value-out-of-range"] = problems.get("value-out-of-range", 0) + 1
                continue
            labels = {"gpu": gpu, "source": SOURCE}
            if s.labels.get("UUID"):
                labels["uuid"] = s.labels["UUID"]
            if s.labels.get("modelName"):
                labels["model"] = s.labels["modelName"]
            out.append(Sample(name, value, now, labels))
    return out, problems


class DcgmCollector(Collector):
    name = "dcgm"
    default_interval_s = 1.0

    def __init__(self, config: Mapping[str, object] | None = None) -> None:
        super().__init__()
        self.cfg = DcgmConfig.from_dict(dict(config or {}))

    def _fetch(self) -> str | None:
        try:
            with urllib.request.urlopen(self.cfg.url, timeout=self.cfg.timeout_s) as resp:
                data: bytes = resp.read(MAX_BYTES + 1)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.count_error(f"fetch-failed:{type(exc).__name__}", f"{self.cfg.url}: {exc}")
            return None
        if len(data) > MAX_BYTES:
            self.count_error("response-too-large", self.cfg.url)
            return None
        return data.decode("utf-8", "replace")

    def probe(self) -> Capabilities:
        text = self._fetch()
        if text is None:
            return Capabilities(False, f"no dcgm-exporter at {self.cfg.url}")
        try:
            samples, _ = samples_from_exposition(text, 0.0)
        except ValueError as exc:
            return Capabilities(False, f"{self.cfg.url} is not a Prometheus exposition: {exc}")
        if not samples:
            return Capabilities(False, f"{self.cfg.url} serves no DCGM profiling field "
                                "(DCGM_FI_PROF_*: enable them in dcgm-exporter's counters file)")
        fields = {s.name for s in samples}
        return Capabilities(True, features={n: n in fields for n in FIELDS.values()})

    def collect(self, now: float) -> Collected:
        text = self._fetch()
        if text is None:
            return Collected()
        try:
            samples, problems = samples_from_exposition(text, now)
        except ValueError as exc:
            self.count_error("bad-exposition", str(exc))
            return Collected()
        for reason, n in problems.items():
            for _ in range(n):
                self.count_error(reason)
        return Collected(samples=samples)
