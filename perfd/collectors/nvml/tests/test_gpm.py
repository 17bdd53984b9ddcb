"""GPM against pynvml's real ctypes structures (no GPU needed: only the library call is faked).

The fake module in fake_nvml.py mimics the struct with plain Python objects; this test makes sure
the sampler fills pynvml's actual ``c_nvmlGpmMetricsGet_t`` correctly (field names, types, sample
pointers) and reads the answers back, so a typo cannot hide until the first run on a GPU.
"""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from perfd.collectors.nvml.gpm import GPM_METRICS, GpmSampler, convert
from perfd.collectors.nvml.tests.fake_nvml import FakeDevice, FakePynvml
from perfd.collectors.nvml.wrapper import Nvml


class CtypesGpm(FakePynvml):
    """The fake, but with pynvml's real GPM structs, sample handles and metric ids."""

    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION

    def __init__(self) -> None:
        super().__init__([FakeDevice()])
        self.seen: list[Any] = []
        for m in GPM_METRICS:
            setattr(self, m.const, getattr(pynvml, m.const))

    def nvmlGpmSampleAlloc(self) -> Any:
        return pynvml.c_nvmlGpmSample_t()  # an opaque (here NULL) handle, as pynvml returns

    def nvmlGpmSampleGet(self, h: Any, s: Any) -> Any:
        return s

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        assert isinstance(mg, pynvml.c_nvmlGpmMetricsGet_t)
        assert mg.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        self.seen = [mg.metrics[i].metricId for i in range(mg.numMetrics)]
        for i in range(mg.numMetrics):
            mg.metrics[i].nvmlReturn = 0
            mg.metrics[i].value = float(mg.metrics[i].metricId)  # value = its id, to check mapping
        return mg


def test_sampler_fills_real_ctypes_struct() -> None:
    fake = CtypesGpm()
    nv = Nvml(module=fake)
    assert nv.init() is None
    sampler = GpmSampler(nv, nv.call("nvmlDeviceGetHandleByIndex", 0))
    assert sampler.start()
    out = sampler.step()
    assert fake.seen == [getattr(pynvml, m.const) for m in GPM_METRICS]
    for m in GPM_METRICS:
        expected = convert(m, float(getattr(pynvml, m.const)))
        assert out[m.name] == pytest.approx(expected), m.name
    assert out["perfd_gpu_sm_util_ratio"] == pytest.approx(0.02)  # id 2 -> 2 % -> 0.02
    assert out["perfd_gpu_nvlink_rx_bytes_per_second"] == 60 * 2**20
    sampler.close()
    assert not sampler.enabled


def test_metric_ids_match_pynvml() -> None:
    for m in GPM_METRICS:
        assert getattr(pynvml, m.const) == m.default_id, m.const
