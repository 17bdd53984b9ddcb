"""The peak memory bandwidth table (perfd.analytics.steps.gpus, separate from the FLOP/s table)."""

from __future__ import annotations

import pytest

from perfd.analytics.steps.gpus import MEMORY_BANDWIDTH, peak_memory_bandwidth
from perfd.analytics.steps.provenance import Cited, Code, cite


@pytest.mark.parametrize(("nvml", "model", "tbs"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35),
    ("NVIDIA H100 SXM5 80GB", "H100 SXM", 3.35),
    ("NVIDIA H100 PCIe", "H100 PCIe", 2.0),
    ("NVIDIA H200", "H200", 4.8),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB", 2.0),
    ("NVIDIA B200", "B200", 8.0),
    ("NVIDIA L40S", "L40S", 0.864),
])
def test_table(nvml: str, model: str, tbs: float) -> None:
    res = peak_memory_bandwidth(nvml)
    assert res.gpu_model == model and res.bytes_per_s == pytest.approx(tbs * 1e12)
    assert res.source is not None and res.source.code is Code.FROM_GPU_TABLE
    row = res.source.args[0]
    assert isinstance(row, Cited) and row.code is Code.BANDWIDTH_TABLE and row.args[:2] == (model, tbs)


@pytest.mark.parametrize("nvml", ["NVIDIA A100-PCIE-40GB", "NVIDIA GB200", "NVIDIA GH200 480GB",
                                  "NVIDIA H100", "NVIDIA H100 NVL", "NVIDIA GeForce RTX 4090"])
def test_not_guessed(nvml: str) -> None:
    res = peak_memory_bandwidth(nvml)
    assert res.bytes_per_s is None and res.reason == cite(Code.BANDWIDTH_GPU_UNLISTED, nvml)


def test_override_and_absent_name() -> None:
    assert peak_memory_bandwidth("NVIDIA H200", 1e12).bytes_per_s == 1e12
    assert peak_memory_bandwidth(None, 2e12).source is not None
    assert peak_memory_bandwidth(None).reason == cite(Code.BANDWIDTH_NO_GPU)
    assert peak_memory_bandwidth("NVIDIA H200", 0.0).reason == cite(Code.BANDWIDTH_NOT_POSITIVE, 0.0)
    assert set(MEMORY_BANDWIDTH) == {"H100 PCIe", "H100 SXM", "H200", "A100 80GB", "B200", "L40S"}
