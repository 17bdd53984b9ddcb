"""The NVML wrapper: init reasons, absent-not-zero, counting, log-once."""

from __future__ import annotations

import logging
import sys

import pynvml
import pytest

from perfd.collectors.nvml.probe import Utilization
from perfd.collectors.nvml.tests.fake_nvml import (
    FakeDevice,
    FakePynvml,
    NVMLError_DriverNotLoaded,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NotSupported,
    NVMLError_Timeout,
)
from perfd.collectors.nvml.wrapper import Nvml, error_name


def test_init_ok() -> None:
    nv = Nvml(module=FakePynvml())
    assert nv.init() is None
    assert nv.initialized and nv.device_count() == 1
    assert nv.driver_version() == "580.159.fake"


def test_init_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes "import pynvml" raise ImportError
    reason = Nvml().init()
    assert reason is not None and reason.startswith("NVML not found: python module pynvml")


@pytest.mark.parametrize(("err", "words"), [
    (NVMLError_LibraryNotFound, "libnvidia-ml.so.1"),
    (NVMLError_DriverNotLoaded, "driver is not loaded"),
])
def test_init_no_driver(err: type[Exception], words: str) -> None:
    nv = Nvml(module=FakePynvml(init_error=err))
    reason = nv.init()
    assert reason is not None and reason.startswith("NVML not found") and words in reason
    assert not nv.initialized


def test_init_no_gpu() -> None:
    assert Nvml(module=FakePynvml(devices=[])).init() == "no NVIDIA GPU (NVML reports 0 devices)"


def test_missing_function_is_absent_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    nv = Nvml(module=FakePynvml(missing={"nvmlDeviceGetPowerUsage"}))
    nv.init()
    with caplog.at_level(logging.INFO, logger="perfd.collectors.nvml.wrapper"):
        for _ in range(3):
            assert nv.call("nvmlDeviceGetPowerUsage", object()) is None
    assert nv.errors[("nvmlDeviceGetPowerUsage", "Missing")] == 3
    assert nv.calls["nvmlDeviceGetPowerUsage"] == 3
    assert nv.last_error == "Missing"
    assert sum("nvmlDeviceGetPowerUsage" in r.getMessage() for r in caplog.records) == 1


def test_nvml_errors_become_none_counted_per_function_and_error(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakePynvml(fail={"nvmlDeviceGetPowerUsage": NVMLError_NotSupported,
                            "nvmlDeviceGetTemperature": NVMLError_GpuIsLost})
    nv = Nvml(module=fake)
    nv.init()
    h = nv.call("nvmlDeviceGetHandleByIndex", 0)
    with caplog.at_level(logging.INFO, logger="perfd.collectors.nvml.wrapper"):
        for _ in range(4):
            assert nv.call("nvmlDeviceGetPowerUsage", h) is None
            assert nv.call("nvmlDeviceGetTemperature", h, 0) is None
    assert nv.errors[("nvmlDeviceGetPowerUsage", "NotSupported")] == 4
    assert nv.errors[("nvmlDeviceGetTemperature", "GpuIsLost")] == 4
    assert len([r for r in caplog.records if "treated as absent" in r.getMessage()]) == 2
    util = nv.call("nvmlDeviceGetUtilizationRates", h)
    assert isinstance(util, Utilization) and util.gpu == 55
    assert nv.last_error is None


def test_unexpected_exception_is_contained() -> None:
    nv = Nvml(module=FakePynvml())
    nv.init()
    # wrong arity -> TypeError inside the "library": absent, named, never raised
    assert nv.call("nvmlDeviceGetClockInfo") is None
    assert nv.last_error == "Exception:TypeError"


def test_call_quiet_does_not_count_expected_errors() -> None:
    fake = FakePynvml(fail={"nvmlEventSetWait_v2": NVMLError_Timeout})
    nv = Nvml(module=fake)
    nv.init()
    assert nv.call_quiet("nvmlEventSetWait_v2", ("Timeout",), object(), 0) is None
    assert nv.last_error == "Timeout" and not nv.errors


def test_call_timing_is_measured() -> None:
    ticks = iter(range(0, 10_000_000, 1000))
    nv = Nvml(module=FakePynvml(devices=[FakeDevice()]), clock_ns=lambda: next(ticks))
    nv.init()
    h = nv.call("nvmlDeviceGetHandleByIndex", 0)
    for _ in range(5):
        nv.call("nvmlDeviceGetPowerUsage", h)
    assert nv.cost_us()["nvmlDeviceGetPowerUsage"] == pytest.approx(1.0)  # 1000 ns per call


def test_error_name_for_real_pynvml_classes() -> None:
    assert error_name(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)) == "NotSupported"
    assert error_name(pynvml.NVMLError_GpuIsLost()) == "GpuIsLost"
    assert error_name(pynvml.NVMLError_NoPermission()) == "NoPermission"
    assert error_name(pynvml.NVMLError_FunctionNotFound()) == "FunctionNotFound"
    assert error_name(pynvml.NVMLLibraryMismatchError("x")) == "LibraryMismatch"
    assert error_name(ValueError("x")) == "Exception:ValueError"


def test_real_pynvml_on_this_machine_never_raises() -> None:
    """Whatever this machine has (usually no GPU here), init answers with a reason or None."""
    nv = Nvml()
    reason = nv.init()
    assert reason is None or reason.startswith(("NVML not found", "no NVIDIA GPU", "NVML"))
    nv.shutdown()
