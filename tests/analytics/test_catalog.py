"""The metric catalog: naming conventions, no duplicates, bounded labels, lookups, docs table."""

from __future__ import annotations

import re

import pytest

from perfd.app.commands.catalog_docs import render_markdown
from perfd.core import catalog, catalog_labels

REQUIRED = [
    "perfd_job_mfu_ratio", "perfd_job_step_time_seconds", "perfd_job_model_tflops_per_gpu",
    "perfd_job_logged_tflops_per_gpu", "perfd_job_comm_exposed_ratio", "perfd_job_comm_exposed_dp_ratio",
    "perfd_job_comm_exposed_pp_ratio", "perfd_job_pp_bubble_analytic_ratio",
    "perfd_job_pp_stage_idle_max_ratio",
    "perfd_job_pp_stage_idle_min_ratio", "perfd_job_data_loading_ratio", "perfd_job_straggler_ratio",
    "perfd_job_iteration", "perfd_job_lm_loss", "perfd_job_bottleneck_info",
    "perfd_gpu_utilization_ratio", "perfd_gpu_memory_used_bytes", "perfd_gpu_memory_total_bytes",
    "perfd_gpu_power_watts", "perfd_gpu_energy_joules_total", "perfd_gpu_temperature_celsius",
    "perfd_gpu_sm_clock_hertz", "perfd_gpu_mem_clock_hertz", "perfd_gpu_throttle_reasons",
    "perfd_gpu_throttle_active", "perfd_gpu_ecc_errors_total", "perfd_gpu_sm_util_ratio",
    "perfd_gpu_sm_occupancy_ratio", "perfd_gpu_tensor_util_ratio", "perfd_gpu_dram_bw_util_ratio",
    "perfd_gpu_fp16_util_ratio", "perfd_gpu_fp32_util_ratio", "perfd_gpu_pcie_rx_bytes_per_second",
    "perfd_gpu_pcie_tx_bytes_per_second", "perfd_gpu_nvlink_rx_bytes_per_second",
    "perfd_gpu_nvlink_tx_bytes_per_second", "perfd_gpu_processes", "perfd_host_cpu_util_ratio",
    "perfd_host_memory_used_bytes", "perfd_host_net_rx_bytes_per_second",
    "perfd_host_disk_read_bytes_per_second",
    "perfd_agent_collector_errors_total", "perfd_agent_samples_total",
]

# unit -> the suffix the name must end with (counters add _total after it)
UNIT_SUFFIX = {
    "ratio": "_ratio", "seconds": "_seconds", "bytes": "_bytes",
    "bytes_per_second": "_bytes_per_second", "watts": "_watts", "joules": "_joules", "celsius": "_celsius",
    "hertz": "_hertz", "info": "_info", "tflops": "_tflops_per_gpu",
}


def test_required_names_present() -> None:
    assert set(REQUIRED) <= set(catalog.names())


def base_of(name: str) -> str:
    return name.removesuffix("_total")


def test_names_follow_conventions() -> None:
    names = catalog.names()
    assert len(names) == len(set(names)), "duplicate metric names"
    for m in catalog.CATALOG:
        domain = r"perfd_(job|serving|gpu|host|agent|aggregator|engine)_"
        # perfd_build_info is the Prometheus convention for a build's info metric (<namespace>_build_info)
        pattern = domain + r"[a-z0-9]+(_[a-z0-9]+)*"
        assert m.name == "perfd_build_info" or re.fullmatch(pattern, m.name), m.name
        if m.unit == "times":  # a quotient that can exceed 1: _times; the older ones still end in _ratio
            assert base_of(m.name).endswith(("_times", "_ratio")), m.name
        assert m.kind in ("gauge", "counter", "histogram")
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        base = m.name.removesuffix("_total")
        if m.unit in UNIT_SUFFIX:
            assert base.endswith(UNIT_SUFFIX[m.unit]), (m.name, m.unit)
        # a name that claims a unit must declare it
        for unit, suffix in UNIT_SUFFIX.items():
            if base.endswith(suffix) and suffix != "_ratio":
                assert m.unit == unit, (m.name, m.unit)
        if base.endswith("_ratio"):
            assert m.unit in ("ratio", "times"), m.name
        assert m.description and m.source


def test_labels_are_bounded_and_never_job() -> None:
    for m in catalog.CATALOG:
        assert "job" not in m.labels, m.name  # reserved by Prometheus: the label is job_name
        assert set(m.labels) <= set(catalog_labels.LABELS), (m.name, m.labels)
        assert len(m.labels) == len(set(m.labels))
        if m.name.startswith(("perfd_job_", "perfd_serving_")):
            assert m.labels[0] == "job_name"
        if m.name.startswith("perfd_gpu_"):
            assert m.labels[:2] == ("node", "gpu")


def test_get_and_markdown() -> None:
    assert catalog.get("perfd_job_mfu_ratio").unit == "ratio"
    with pytest.raises(KeyError, match="not in the perfd catalog"):
        catalog.get("perfd_job_mfu_percent")
    md = render_markdown()
    lines = md.strip().splitlines()
    assert lines[0].startswith("| name |") and len(lines) == 2 + len(catalog.CATALOG)
    assert "`perfd_gpu_power_watts`" in md
