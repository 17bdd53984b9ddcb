"""The dcgm collector against a real prometheus_client HTTP endpoint serving dcgm-exporter's metric
names and labels (as dcgm-exporter 3.x/4.x names them: gpu, UUID, device, modelName, Hostname)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from perfd.agent.node_agent import default_registry
from perfd.collectors.dcgm import SOURCE, DcgmCollector
from perfd.core import catalog, catalog_labels

LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
A100 = {"modelName": "NVIDIA A100-SXM4-80GB", "Hostname": "node-7", "DCGM_FI_DRIVER_VERSION": "550.54.15"}


class Exporter:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.gauges: dict[str, Gauge] = {}
        self.server, self.thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"

    def set(self, field: str, gpu: int, value: float, **extra: str) -> None:
        g = self.gauges.get(field)
        if g is None:
            g = self.gauges[field] = Gauge(field, f"{field} (dcgm-exporter)", LABELS, registry=self.registry)
        g.labels(gpu=str(gpu), UUID=f"GPU-{gpu:04d}", device=f"nvidia{gpu}", **{**A100, **extra}).set(value)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    e = Exporter()
    yield e
    e.close()


def _by(samples: list[Any]) -> dict[tuple[str, str], Any]:
    return {(s.name, s.labels["gpu"]): s for s in samples}


def test_profiling_fields_become_perfd_gpu_series(exporter: Exporter) -> None:
    for gpu, (sm, tensor, dram) in enumerate([(0.81, 0.42, 0.33), (0.12, 0.0, 0.05)]):
        exporter.set("DCGM_FI_PROF_SM_ACTIVE", gpu, sm)
        exporter.set("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu, tensor)
        exporter.set("DCGM_FI_PROF_DRAM_ACTIVE", gpu, dram)
    exporter.set("DCGM_FI_PROF_PCIE_TX_BYTES", 0, 2.5e9)
    exporter.set("DCGM_FI_DEV_GPU_UTIL", 0, 99)  # not a profiling field: not ours to rename
    c = DcgmCollector({"url": exporter.url})
    caps = c.probe()
    assert caps.available and caps.features["perfd_gpu_tensor_util_ratio"]
    assert not caps.features["perfd_gpu_sm_occupancy_ratio"]
    got = _by(c.collect(123.0).samples)
    assert got[("perfd_gpu_sm_util_ratio", "0")].value == 0.81
    assert got[("perfd_gpu_tensor_util_ratio", "1")].value == 0.0  # a real 0 stays 0
    assert got[("perfd_gpu_dram_bw_util_ratio", "1")].value == 0.05
    assert got[("perfd_gpu_pcie_tx_bytes_per_second", "0")].value == 2.5e9
    assert ("perfd_gpu_sm_occupancy_ratio", "0") not in got  # not served: absent, never 0
    s = got[("perfd_gpu_sm_util_ratio", "1")]
    assert s.labels == {"gpu": "1", "uuid": "GPU-0001", "model": "NVIDIA A100-SXM4-80GB", "source": SOURCE}
    assert s.time == 123.0
    for (name, _), smp in got.items():
        assert catalog.get(name).kind == "gauge" and set(smp.labels) <= set(catalog_labels.LABELS)
    assert c.errors == {}


def test_out_of_range_values_are_refused_and_counted(exporter: Exporter) -> None:
    exporter.set("DCGM_FI_PROF_SM_ACTIVE", 0, 1.7)
    exporter.set("DCGM_FI_PROF_SM_ACTIVE", 1, 0.5)
    c = DcgmCollector({"url": exporter.url})
    got = _by(c.collect(1.0).samples)
    assert list(got) == [("perfd_gpu_sm_util_ratio", "1")]
    assert c.errors == {"value-out-of-range": 1}


def test_exporter_without_profiling_fields_or_down(exporter: Exporter) -> None:
    exporter.set("DCGM_FI_DEV_GPU_UTIL", 0, 50)
    c = DcgmCollector({"url": exporter.url})
    caps = c.probe()
    assert not caps.available and "DCGM_FI_PROF_" in caps.reason
    url = exporter.url
    exporter.close()
    down = DcgmCollector({"url": url, "timeout_s": 1})
    assert not down.probe().available
    assert down.collect(1.0).samples == []
    assert any(r.startswith("fetch-failed:") for r in down.errors)


def test_config_is_checked_and_the_agent_knows_the_collector() -> None:
    with pytest.raises(ValueError, match="unknown keys"):
        DcgmCollector({"url": "http://x/metrics", "bogus": 1})
    with pytest.raises(ValueError, match="http"):
        DcgmCollector({"url": "ftp://x"})
    assert "dcgm" in default_registry().names()
    assert isinstance(default_registry().create("dcgm", {"url": "http://127.0.0.1:1/metrics",
                                                         "interval_s": 5}), DcgmCollector)
