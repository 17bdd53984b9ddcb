"""The peak table: NVML names, dtypes, override, unknown GPUs."""

from __future__ import annotations

import pytest

from perfd.analytics.steps.gpus import lookup_gpu, peak_tflops
from perfd.analytics.steps.provenance import Code, cite
from perfd.core.dtypes import DTYPES, normalize_dtype
from perfd.report.provenance_text import text


@pytest.mark.parametrize(("nvml", "model", "bf16"), [
    ("NVIDIA H200", "H200", 989.0),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA A100-PCIE-40GB", "A100", 312.0),
    ("NVIDIA B200", "B200", 2250.0),
    ("NVIDIA GB200", "GB200", 2500.0),
    ("NVIDIA L40S", "L40S", 362.0),
])
def test_nvml_names(nvml: str, model: str, bf16: float) -> None:
    row = lookup_gpu(nvml)
    assert row is not None and row.model == model
    res = peak_tflops(nvml, "bf16")
    assert res.peak_tflops == bf16 and res.gpu_model == model
    assert res.source == cite(Code.FROM_GPU_TABLE, cite(Code.PEAK_TABLE, model, "bf16", bf16, row.datasheet))
    assert peak_tflops(nvml, "fp16").peak_tflops == bf16


def test_fp8_is_twice_hopper_and_absent_on_ampere() -> None:
    assert peak_tflops("NVIDIA H200", "fp8").peak_tflops == pytest.approx(2 * 989, abs=1)
    assert peak_tflops("NVIDIA B200", "fp8").peak_tflops == 2 * 2250
    a100 = peak_tflops("NVIDIA A100-SXM4-80GB", "fp8")
    assert a100.peak_tflops is None and a100.reason == cite(Code.PEAK_NO_FIGURE, "fp8", "A100")
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32").peak_tflops == 156.0


def test_measured_ceiling() -> None:
    assert peak_tflops("NVIDIA H200", "bf16").measured_ceiling_tflops == 790.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16").measured_ceiling_tflops == 790.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "bf16").measured_ceiling_tflops is None


def test_unknown_gpu_or_dtype_is_absent_not_guessed() -> None:
    res = peak_tflops("NVIDIA GeForce RTX 4090", "bf16")
    assert res.peak_tflops is None and res.reason == cite(Code.PEAK_GPU_UNLISTED, "NVIDIA GeForce RTX 4090")
    # why, as a code and its arguments: each worded where it is shown (perfd.report.provenance_text)
    assert peak_tflops(None, "bf16").reason == cite(Code.PEAK_NO_GPU)
    assert peak_tflops("NVIDIA H200", None).reason == cite(Code.PEAK_NO_DTYPE)
    assert peak_tflops("NVIDIA H200", "int4").reason == cite(Code.PEAK_DTYPE_UNRECOGNISED, "int4", DTYPES)
    assert peak_tflops("NVIDIA H200", "bf16", -1.0).reason == cite(Code.PEAK_NOT_POSITIVE, -1.0)
    why = peak_tflops("NVIDIA H200", "int4").reason
    assert why is not None and text(why) == (  # a golden sentence
        "dtype 'int4' not recognised (--dtype takes one of bf16, fp16, fp8, tf32, fp32)")
    assert lookup_gpu("NVIDIA H100") is None  # SXM or PCIe? not guessed


def test_override_wins() -> None:
    res = peak_tflops("NVIDIA GeForce RTX 4090", "bf16", override=165.0)
    assert res.peak_tflops == 165.0 and res.source == cite(Code.FROM_CONFIG, cite(Code.PEAK_OVERRIDE, 165.0))
    assert text(res.source) == "config:peak_tflops=165 (explicit override)"  # a golden sentence
    assert peak_tflops("NVIDIA H200", "bf16", override=900.0).peak_tflops == 900.0
    assert peak_tflops("NVIDIA H200", "bf16", override=0.0).peak_tflops is None


def test_specific_rows_before_generic() -> None:
    row = lookup_gpu("NVIDIA H200 NVL")
    assert row is not None and row.model == "H200 NVL"
    row = lookup_gpu("NVIDIA GB200")
    assert row is not None and row.model == "GB200"
    assert normalize_dtype("torch.bfloat16") == "bf16" and normalize_dtype("FP8") == "fp8"
