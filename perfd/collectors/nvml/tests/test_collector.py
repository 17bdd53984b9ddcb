"""NvmlCollector against the fake pynvml: values and units, absent-not-zero, call discipline, GPM,
throttle decoding, process events, XID, lost GPUs, config."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from perfd.collectors.collector import Collected, Registry
from perfd.collectors.nvml import METRIC_NAMES, NvmlCollector, decode_throttle, register
from perfd.collectors.nvml.tests.fake_nvml import (
    FakeDevice,
    FakePynvml,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NotSupported,
)
from perfd.collectors.nvml.wrapper import Nvml
from perfd.core import catalog
from perfd.core.model import Sample

# Names this collector emits that perfd/core/catalog.py does not define yet (reported to the lead;
# the catalog is owned by another change). Keep this list in step with the catalog.
NOT_YET_IN_CATALOG: set[str] = set()

GPM_VALUES = {2: 96.3, 3: 14.2, 5: 93.5, 10: 17.6, 11: 0.0, 12: 1.5, 13: 0.5, 20: 100.0, 21: 50.0}


def make(devices: list[FakeDevice] | None = None, config: dict[str, Any] | None = None,
         names: dict[int, tuple[str | None, str | None]] | None = None,
         env_lookup: Callable[[int], Mapping[str, int | str]] | None = None,
         **fake_kw: Any) -> tuple[NvmlCollector, FakePynvml]:
    fake = FakePynvml(devices, **fake_kw)
    table = names or {}
    col = NvmlCollector(config or {}, nvml=Nvml(module=fake),
                        process_lookup=lambda pid: table.get(pid, (None, None)),
                        user_lookup=lambda pid: "alice" if pid in table else None,
                        env_lookup=env_lookup or (lambda pid: {}))
    return col, fake


def started(devices: list[FakeDevice] | None = None, config: dict[str, Any] | None = None,
            **kw: Any) -> tuple[NvmlCollector, FakePynvml]:
    col, fake = make(devices, config, **kw)
    assert col.probe().available
    col.start()
    return col, fake


def values(c: Collected, name: str, **labels: str) -> list[float]:
    return [s.value for s in c.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def one(c: Collected, name: str, **labels: str) -> float:
    vals = values(c, name, **labels)
    assert len(vals) == 1, (name, vals)
    return vals[0]


def test_values_units_and_labels() -> None:
    dev = FakeDevice(gpm=GPM_VALUES, gpm_ret={60: 3, 61: 3})
    col, _ = started([dev])
    c = col.collect(1000.0)
    assert one(c, "perfd_gpu_utilization_ratio") == pytest.approx(0.55)
    assert one(c, "perfd_gpu_memory_utilization_ratio") == pytest.approx(0.20)
    assert one(c, "perfd_gpu_memory_used_bytes") == dev.mem_used
    assert one(c, "perfd_gpu_memory_total_bytes") == dev.mem_total
    assert one(c, "perfd_gpu_power_watts") == pytest.approx(350.5)
    assert one(c, "perfd_gpu_power_limit_watts") == pytest.approx(700.0)
    assert one(c, "perfd_gpu_energy_joules_total") == pytest.approx(123_456.789)
    assert one(c, "perfd_gpu_temperature_celsius") == 41
    assert one(c, "perfd_gpu_sm_clock_hertz") == 1980e6
    assert one(c, "perfd_gpu_mem_clock_hertz") == 3201e6
    assert one(c, "perfd_gpu_ecc_errors_total", type="corrected") == 2
    assert one(c, "perfd_gpu_ecc_errors_total", type="uncorrected") == 0
    for s in c.samples:
        assert s.time == 1000.0
        assert {"gpu": "0", "uuid": dev.uuid, "model": "NVIDIA H200"}.items() <= s.labels.items()
        assert s.labels["pci_bus_id"] == "00000000:18:00.0"  # DCGM-exporter's join label, from NVML
        assert set(s.labels) <= {"gpu", "uuid", "model", "pci_bus_id", "reason", "type"}, s.labels


def test_every_emitted_name_is_declared_and_in_the_catalog() -> None:
    col, _ = started([FakeDevice(gpm=GPM_VALUES | {60: 1.0, 61: 2.0}, procs=[(1, 10)], xids=[13])])
    names = {s.name for s in col.collect(1.0).samples}
    assert names <= set(METRIC_NAMES)
    assert names == set(METRIC_NAMES)  # the fake serves everything
    missing = set(METRIC_NAMES) - set(catalog.names())
    assert missing <= NOT_YET_IN_CATALOG, missing - NOT_YET_IN_CATALOG


def test_not_supported_is_absent_not_zero_and_never_called_again() -> None:
    col, fake = started(fail={"nvmlDeviceGetPowerUsage": NVMLError_NotSupported,
                              "nvmlDeviceGetTotalEccErrors": NVMLError_NotSupported})
    for t in range(5):
        c = col.collect(float(t))
        assert values(c, "perfd_gpu_power_watts") == []
        assert values(c, "perfd_gpu_ecc_errors_total") == []
        assert values(c, "perfd_gpu_temperature_celsius") == [41]
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1  # the probe only
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 2  # corrected + uncorrected, at probe


def test_newest_variant_is_used_and_older_ones_are_fallbacks() -> None:
    col, fake = started(missing={"nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons",
                                 "nvmlDeviceGetComputeRunningProcesses_v3"})
    c = col.collect(1.0)
    assert one(c, "perfd_gpu_temperature_celsius") == 41
    assert one(c, "perfd_gpu_throttle_reasons") == 0
    assert one(c, "perfd_gpu_processes") == 0
    assert fake.calls["nvmlDeviceGetTemperature"] == 2
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 2
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 0
    # a missing function is counted once per call attempt at probe, then never tried again
    assert col.real is not None
    assert col.real.nvml.errors[("nvmlDeviceGetTemperatureV", "Missing")] == 1


def test_slow_calls_stay_off_the_fast_path() -> None:
    col, fake = started([FakeDevice(gpm=GPM_VALUES)], {"slow_interval_s": 10})
    probe_calls = dict(fake.calls)
    for t in range(10):  # 10 collects, 1 s apart
        col.collect(1000.0 + t)
    made = {fn: n - probe_calls.get(fn, 0) for fn, n in fake.calls.items()}
    assert made["nvmlDeviceGetTotalEnergyConsumption"] == 1  # first collect only
    assert made["nvmlDeviceGetEnforcedPowerLimit"] == 1
    assert made["nvmlDeviceGetTotalEccErrors"] == 2
    for fast in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage",
                 "nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlGpmSampleGet", "nvmlGpmMetricsGet"):
        assert made[fast] == 10, fast
    assert made["nvmlDeviceGetClockInfo"] == 20  # SM + memory clock
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert fake.calls["nvmlDeviceGetFieldValues"] == 0
    col.collect(1010.0)
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] - probe_calls[
        "nvmlDeviceGetTotalEnergyConsumption"] == 2


def test_gpm_metrics_converted() -> None:
    col, _ = started([FakeDevice(gpm=GPM_VALUES, gpm_ret={60: 3, 61: 3})])
    assert col.probe().features["gpm"] is True
    c = col.collect(1.0)  # start() took the first snapshot, so the first collect has a window
    assert one(c, "perfd_gpu_sm_util_ratio") == pytest.approx(0.963)
    assert one(c, "perfd_gpu_sm_occupancy_ratio") == pytest.approx(0.142)
    assert one(c, "perfd_gpu_tensor_util_ratio") == pytest.approx(0.935)
    assert one(c, "perfd_gpu_dram_bw_util_ratio") == pytest.approx(0.176)
    assert one(c, "perfd_gpu_fp64_util_ratio") == 0.0
    assert one(c, "perfd_gpu_fp32_util_ratio") == pytest.approx(0.015)
    assert one(c, "perfd_gpu_fp16_util_ratio") == pytest.approx(0.005)
    assert one(c, "perfd_gpu_pcie_tx_bytes_per_second") == 100 * 2**20  # MiB/s -> bytes/s
    assert one(c, "perfd_gpu_pcie_rx_bytes_per_second") == 50 * 2**20
    # NVLink refused (no NVLink): absent, and no longer requested
    assert values(c, "perfd_gpu_nvlink_rx_bytes_per_second") == []
    assert col.real is not None
    sampler = col.real._gpm[0]
    assert 60 not in {mid for _, mid in sampler.metrics}
    assert len(values(col.collect(2.0), "perfd_gpu_sm_util_ratio")) == 1


def test_gpm_ratio_clamped_and_nan_dropped() -> None:
    col, _ = started([FakeDevice(gpm={2: 100.4, 5: float("nan")})])
    c = col.collect(1.0)
    assert one(c, "perfd_gpu_sm_util_ratio") == 1.0
    assert values(c, "perfd_gpu_tensor_util_ratio") == []


def test_gpm_absent_on_unsupported_device() -> None:
    col, fake = started([FakeDevice(gpm_supported=False, gpm=GPM_VALUES)])
    assert col.probe().features["gpm"] is False
    for t in range(3):
        c = col.collect(float(t))
        assert values(c, "perfd_gpu_sm_util_ratio") == values(c, "perfd_gpu_tensor_util_ratio") == []
    assert fake.calls["nvmlGpmSampleGet"] == 0 and fake.calls["nvmlGpmSampleAlloc"] == 0


def test_gpm_config_off_and_forced() -> None:
    col, fake = started([FakeDevice(gpm=GPM_VALUES)], {"gpm": False})
    assert values(col.collect(1.0), "perfd_gpu_sm_util_ratio") == []
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 0
    col, _ = started([FakeDevice(gpm_supported=False)], {"gpm": True})
    assert col.errors.get("gpm-unsupported") == 1


@pytest.mark.parametrize(("mask", "active"), [
    (0, []),
    (0x1, ["gpu_idle"]),
    (0x4 | 0x40, ["sw_power_cap", "hw_thermal"]),
    (0x1FF, ["gpu_idle", "applications_clocks", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal",
             "hw_thermal", "hw_power_brake", "display_clocks"]),
    (0x200 | 0x8, ["hw_slowdown"]),  # board limit: not in the fixed set, visible in the bitmask only
])
def test_throttle_decoding(mask: int, active: list[str]) -> None:
    assert decode_throttle(mask) == active
    col, _ = started([FakeDevice(throttle=mask)], {"throttle_zeros": False})
    c = col.collect(1.0)
    assert one(c, "perfd_gpu_throttle_reasons") == mask
    got = {s.labels["reason"]: s.value for s in c.samples if s.name == "perfd_gpu_throttle_active"}
    assert got == dict.fromkeys(active, 1.0)


def test_throttle_zeros_by_default() -> None:
    col, _ = started([FakeDevice(throttle=0x4)])
    c = col.collect(1.0)
    got = {s.labels["reason"]: s.value for s in c.samples if s.name == "perfd_gpu_throttle_active"}
    assert len(got) == 9 and got["sw_power_cap"] == 1.0 and got["gpu_idle"] == 0.0


def test_process_events_only_on_change_and_periodically() -> None:
    dev = FakeDevice(procs=[(100, 2 * 2**30)])
    long_cmd = "python train.py --hf-token hf_abcdefghijklmnopqrstuvwxyz " + "--flag " * 60
    names = {100: ("python", long_cmd), 200: ("intruder", "python other.py --password=x")}
    col, _ = started([dev], names=names, env_lookup=lambda pid: {"rank": 0} if pid == 100 else {})

    def events(t: float) -> list[dict[str, Any]]:
        c = col.collect(t)
        return [e for e in c.events if e["kind"] == "gpu_processes"]

    first = events(0.0)
    assert len(first) == 1
    ev = first[0]
    assert ev["labels"] == {"gpu": "0", "uuid": dev.uuid, "model": "NVIDIA H200",
                            "pci_bus_id": "00000000:18:00.0"}
    # The job's rank: its command line, the token's value redacted; cut to 200 characters.
    shown = "python train.py --hf-token <redacted> " + "--flag " * 60
    assert ev["payload"] == [{"pid": 100, "name": "python", "user": "alice", "cmdline": shown[:200],
                              "used_memory_bytes": 2 * 2**30,
                              "rank": 0, "local_rank": None, "world_size": None, "job": None}]
    assert events(1.0) == [] and events(2.0) == []
    dev.procs.append((200, None))  # a foreign process joins
    ev2 = events(3.0)
    assert len(ev2) == 1 and ev2[0]["changed"] is True
    assert [p["name"] for p in ev2[0]["payload"]] == ["python", "intruder"]
    intruder = ev2[0]["payload"][1]
    assert intruder["cmdline"] is None and intruder["user"] == "alice"  # not the job's: no arguments
    assert ev2[0]["payload"][1]["used_memory_bytes"] is None
    assert events(4.0) == []
    periodic = events(63.0)  # 60 s after the last event, unchanged: sent again
    assert len(periodic) == 1 and periodic[0]["changed"] is False
    dev.procs.clear()
    gone = events(64.0)
    assert gone[0]["payload"] == []
    assert one(col.collect(65.0), "perfd_gpu_processes") == 0


def test_process_name_unknown_is_absent() -> None:
    col, _ = started([FakeDevice(procs=[(4242, 1)])])
    ev = next(e for e in col.collect(0.0).events if e["kind"] == "gpu_processes")
    assert ev["payload"][0]["name"] is None and ev["payload"][0]["cmdline"] is None


def test_xid_events() -> None:
    dev = FakeDevice()
    col, _ = started([dev])
    c = col.collect(1.0)
    assert one(c, "perfd_gpu_xid_errors_total") == 0
    assert values(c, "perfd_gpu_xid_last") == []  # none seen: absent, not 0
    dev.xids.extend([79, 48])
    c = col.collect(2.0)
    assert [e["payload"]["xid"] for e in c.events if e["kind"] == "xid"] == [79, 48]
    assert one(c, "perfd_gpu_xid_errors_total") == 2
    assert one(c, "perfd_gpu_xid_last") == 48
    assert col.real is not None and not col.real.nvml.errors  # Timeout ("no event") is not an error


def test_gpu_lost() -> None:
    dev0, dev1 = FakeDevice(index=0, uuid="GPU-a"), FakeDevice(index=1, uuid="GPU-b")
    col, fake = started([dev0, dev1])
    fake.fail["nvmlDeviceGetUtilizationRates"] = NVMLError_GpuIsLost
    c = col.collect(1.0)
    lost = [e for e in c.events if e["kind"] == "gpu_lost"]
    assert [e["labels"]["gpu"] for e in lost] == ["0", "1"]
    assert col.errors["gpu-lost"] == 2
    calls = fake.calls["nvmlDeviceGetUtilizationRates"]
    assert col.collect(2.0).samples == [] and fake.calls["nvmlDeviceGetUtilizationRates"] == calls


def test_no_nvml_probe_reason_and_agent_runs_on() -> None:
    col, _ = make(init_error=NVMLError_LibraryNotFound)
    caps = col.probe()
    assert not caps.available and caps.reason.startswith("NVML not found")
    col.start()
    assert col.collect(1.0) == Collected()
    col.stop()


def test_no_gpu_probe_reason() -> None:
    col, _ = make(devices=[])
    caps = col.probe()
    assert not caps.available and caps.reason.startswith("no NVIDIA GPU")
    assert col.collect(1.0).samples == []


def test_device_selection() -> None:
    devs = [FakeDevice(index=0, uuid="GPU-a"), FakeDevice(index=1, uuid="GPU-b")]
    col, _ = started(devs, {"devices": [1]})
    assert {s.labels["gpu"] for s in col.collect(1.0).samples} == {"1"}
    col, _ = make(devs, {"devices": [5]})
    assert not col.probe().available
    assert col.errors["device-index-out-of-range"] == 1


def test_source_off() -> None:
    col = NvmlCollector({"source": "off"})
    assert col.mode == "off"
    assert not col.probe().available and "off" in col.probe().reason
    assert col.collect(1.0) == Collected()


@pytest.mark.parametrize("cfg", [
    {"gpm": "sometimes"}, {"devices": "0"}, {"devices": [-1]}, {"interval_s": 0}, {"source": "replay:"},
    {"source": "dcgm"}, {"bogus": 1},
])
def test_bad_config_raises(cfg: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="nvml"):
        NvmlCollector(cfg)


def test_config_defaults() -> None:
    col = NvmlCollector({"job": "train-1"})  # the agent adds "job" to every collector's config
    assert col.mode == "real" and col.default_interval_s == 1.0
    assert col.config.slow_interval_s == 10.0 and col.config.gpm is None and col.config.devices is None


def test_register() -> None:
    reg = Registry()
    register(reg)
    assert reg.names() == ["nvml"]
    col = reg.create("nvml", {"source": "off", "interval_s": 0.5})
    assert isinstance(col, NvmlCollector) and col.default_interval_s == 0.5


def test_stop_frees_gpm_buffers() -> None:
    col, fake = started([FakeDevice(gpm=GPM_VALUES)])
    col.collect(1.0)
    col.stop()
    assert fake.calls["nvmlGpmSampleFree"] == 2
    calls = sum(fake.calls.values())
    assert col.collect(2.0) == Collected() and sum(fake.calls.values()) == calls


def test_samples_are_sample_objects() -> None:
    col, _ = started()
    assert all(isinstance(s, Sample) for s in col.collect(1.0).samples)


def test_sample_yaml_is_a_valid_config() -> None:
    import pathlib

    import yaml

    cfg = yaml.safe_load((pathlib.Path(__file__).parents[1] / "sample.yaml").read_text())
    col = NvmlCollector(cfg)
    assert col.mode == "real" and col.config.slow_interval_s == 10.0 and col.config.gpm is None
