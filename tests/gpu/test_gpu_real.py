"""Real-GPU checks of the NVML path (run on the GPU machine: PERFD_GPU_TESTS=1 pytest -m gpu)."""

from __future__ import annotations

import subprocess
import time

import pytest

from perfd.collectors.nvml import NvmlCollector

pytestmark = pytest.mark.gpu


def _by_name(samples, name):
    return [s for s in samples if s.name == name]


def test_real_nvml_collector_reads_every_gpu_and_agrees_with_nvidia_smi():
    col = NvmlCollector({"source": "real", "gpm": "auto"})
    caps = col.probe()
    assert caps.available, caps.reason
    col.start()
    try:
        col.collect(time.time())
        time.sleep(1.0)  # GPM needs two samples a window apart
        out = col.collect(time.time())
    finally:
        col.stop()
    query = ["nvidia-smi", "--query-gpu=index,memory.total,name", "--format=csv,noheader,nounits"]
    smi = subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip().splitlines()
    totals = _by_name(out.samples, "perfd_gpu_memory_total_bytes")
    assert len(totals) == len(smi)
    for line in smi:
        idx, mem_mib, name = (x.strip() for x in line.split(","))
        (t,) = [s for s in totals if s.labels["gpu"] == idx]
        assert t.labels["model"] == name
        assert abs(t.value / 2**20 - float(mem_mib)) <= 1.0
    # Hopper has GPM: the utilisations are present (absent on older GPUs, never 0-filled).
    if caps.features.get("gpm"):
        assert _by_name(out.samples, "perfd_gpu_sm_util_ratio")
        assert all(0.0 <= s.value <= 1.0 for s in _by_name(out.samples, "perfd_gpu_tensor_util_ratio"))
    # The slow calls stay off the fast path.
    assert col.real is not None
    assert col.real.nvml.calls["nvmlDeviceGetPcieThroughput"] == 0
