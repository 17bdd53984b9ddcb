"""HostCollector: real psutil on this machine (values in range) and a fake for the delta logic."""

from __future__ import annotations

import os
import time
from collections import namedtuple
from typing import Any

import pytest

from perfd.collectors.collector import Collected, Registry
from perfd.collectors.host import METRIC_NAMES, HostCollector, register
from perfd.collectors.host.collector import Deltas, cpu_busy_total
from perfd.core import catalog

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
Mem = namedtuple("Mem", "total available")
Net = namedtuple("Net", "bytes_sent bytes_recv")
Disk = namedtuple("Disk", "read_bytes write_bytes")

NOT_YET_IN_CATALOG: set[str] = set()


def cpu(busy: float, idle: float, guest: float = 0.0) -> Any:
    return CpuTimes(busy, 0, 0, idle, 0, 0, 0, 0, guest, 0)


class FakePs:
    """The psutil functions HostCollector uses, served from attributes the test changes."""

    def __init__(self) -> None:
        self.cpu = cpu(10.0, 90.0)
        self.percpu = [cpu(5.0, 45.0), cpu(5.0, 45.0)]
        self.mem = Mem(total=64 * 2**30, available=48 * 2**30)
        self.net: dict[str, Any] = {"lo": Net(10**9, 10**9), "eth0": Net(1000, 2000)}
        self.disks: dict[str, Any] = {"sda": Disk(0, 0), "sda1": Disk(0, 0), "loop0": Disk(5, 5)}
        self.load = (1.5, 1.0, 0.5)

    def cpu_times(self, percpu: bool = False) -> Any:
        return self.percpu if percpu else self.cpu

    def virtual_memory(self) -> Any:
        return self.mem

    def getloadavg(self) -> tuple[float, float, float]:
        return self.load

    def net_io_counters(self, pernic: bool = False) -> dict[str, Any]:
        return self.net

    def disk_io_counters(self, perdisk: bool = False) -> Any:
        if perdisk:
            return self.disks
        return Disk(sum(d.read_bytes for d in self.disks.values()),
                    sum(d.write_bytes for d in self.disks.values()))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(config: dict[str, Any] | None = None,
         disks: list[str] | None = None) -> tuple[HostCollector, FakePs, Clock]:
    ps, clock = FakePs(), Clock()
    col = HostCollector(config or {}, ps=ps, clock=clock,
                        block_devices=lambda: ["sda"] if disks is None else disks)
    assert col.probe().available
    return col, ps, clock


def by_name(c: Collected) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for s in c.samples:
        out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_first_collect_has_no_rates_then_rates() -> None:
    col, ps, clock = make()
    first = by_name(col.collect(1.0))
    assert set(first) == {"perfd_host_load1", "perfd_host_memory_used_bytes", "perfd_host_memory_total_bytes"}
    assert first["perfd_host_memory_used_bytes"] == [({}, 16 * 2**30)]
    assert first["perfd_host_load1"] == [({}, 1.5)]
    clock.t += 2.0
    ps.cpu = cpu(10.0 + 30.0, 90.0 + 10.0)  # 30 busy of 40 -> 0.75
    ps.net = {"lo": Net(2 * 10**9, 2 * 10**9), "eth0": Net(1000 + 4000, 2000 + 8000)}
    ps.disks = {"sda": Disk(2048, 4096), "sda1": Disk(2048, 4096), "loop0": Disk(10**9, 10**9)}
    got = by_name(col.collect(3.0))
    assert got["perfd_host_cpu_util_ratio"] == [({}, 0.75)]
    assert got["perfd_host_net_rx_bytes_per_second"] == [({"interface": "eth0"}, 4000.0)]
    assert got["perfd_host_net_tx_bytes_per_second"] == [({"interface": "eth0"}, 2000.0)]
    # only whole physical disks: the partition and the loop device are not added again
    assert got["perfd_host_disk_read_bytes_per_second"] == [({}, 1024.0)]
    assert got["perfd_host_disk_write_bytes_per_second"] == [({}, 2048.0)]
    assert set(got) == set(METRIC_NAMES)


def test_counter_reset_skips_the_interval_and_is_counted() -> None:
    col, ps, clock = make()
    ps.net = {"eth0": Net(10**6, 10**6)}
    col.collect(0.0)
    clock.t += 1
    ps.net = {"eth0": Net(100, 10**6 + 500)}  # tx went backwards (interface reset), rx moved on
    got = by_name(col.collect(1.0))
    assert "perfd_host_net_tx_bytes_per_second" not in got
    assert got["perfd_host_net_rx_bytes_per_second"] == [({"interface": "eth0"}, 500.0)]
    assert col.errors["counter-reset"] == 1
    clock.t += 1
    ps.net = {"eth0": Net(1100, 10**6 + 500)}
    tx = by_name(col.collect(2.0))["perfd_host_net_tx_bytes_per_second"]
    assert tx == [({"interface": "eth0"}, 1000.0)]


def test_no_time_passed_gives_no_rate() -> None:
    col, ps, _ = make()
    col.collect(0.0)
    ps.net = {"eth0": Net(10**6, 10**6)}
    assert "perfd_host_net_rx_bytes_per_second" not in by_name(col.collect(0.0))


def test_new_disk_does_not_fake_a_burst() -> None:
    col, ps, clock = make(disks=["sda", "sdb"])
    col.collect(0.0)
    clock.t += 1
    ps.disks = {"sda": Disk(100, 0), "sdb": Disk(10**12, 10**12)}  # sdb appears with a big counter
    got = by_name(col.collect(1.0))
    assert "perfd_host_disk_read_bytes_per_second" not in got
    clock.t += 1
    ps.disks = {"sda": Disk(200, 0), "sdb": Disk(10**12 + 50, 10**12)}
    assert by_name(col.collect(2.0))["perfd_host_disk_read_bytes_per_second"] == [({}, 150.0)]


def test_no_sysfs_falls_back_to_psutil_total() -> None:
    ps, clock = FakePs(), Clock()
    col = HostCollector({}, ps=ps, clock=clock, block_devices=lambda: None)
    col.collect(0.0)
    clock.t += 1
    ps.disks = {"sda": Disk(300, 0)}
    assert by_name(col.collect(1.0))["perfd_host_disk_read_bytes_per_second"] == [({}, 295.0)]


def test_interfaces_bounded_and_excluded() -> None:
    col, ps, clock = make({"max_interfaces": 2})
    ps.net = {n: Net(0, 0) for n in ("lo", "docker0", "veth12ab", "br-1", "eth0", "eth1", "ib0")}
    col.collect(0.0)
    clock.t += 1
    got = by_name(col.collect(1.0))
    names = sorted(lbl["interface"] for lbl, _ in got["perfd_host_net_rx_bytes_per_second"])
    assert names == ["eth0", "eth1"]
    assert col.errors["interfaces-over-cap"] == 1  # ib0, counted once
    clock.t += 1
    col.collect(2.0)
    assert col.errors["interfaces-over-cap"] == 1


def test_explicit_interfaces() -> None:
    col, ps, clock = make({"interfaces": ["ib0", "missing0"]})
    ps.net = {"eth0": Net(0, 0), "ib0": Net(0, 0)}
    col.collect(0.0)
    clock.t += 1
    got = by_name(col.collect(1.0))
    assert [lbl["interface"] for lbl, _ in got["perfd_host_net_rx_bytes_per_second"]] == ["ib0"]


def test_per_cpu_and_guest_time() -> None:
    col, ps, clock = make({"per_cpu": True})
    col.collect(0.0)
    clock.t += 1
    ps.percpu = [cpu(5.0 + 10, 45.0), cpu(5.0, 45.0 + 10)]
    ps.cpu = cpu(10.0 + 10, 90.0 + 10, guest=7.0)  # guest is already inside user: not in the total
    got = by_name(col.collect(1.0))
    assert {lbl.get("cpu", "all"): v for lbl, v in got["perfd_host_cpu_util_ratio"]} == {
        "all": 0.5, "0": 1.0, "1": 0.0}


def test_cpu_busy_total() -> None:
    assert cpu_busy_total(CpuTimes(1, 2, 3, 10, 4, 0, 0, 0, 1, 1)) == (6.0, 20.0)


def test_one_failing_part_does_not_cost_the_others() -> None:
    col, ps, _ = make()

    def boom(pernic: bool = False) -> Any:
        raise PermissionError("no /proc/net/dev")

    ps.net_io_counters = boom  # type: ignore[method-assign]
    got = by_name(col.collect(0.0))
    assert "perfd_host_memory_total_bytes" in got
    assert col.errors["net-failed"] == 1


def test_deltas() -> None:
    resets: list[str] = []
    d = Deltas(resets.append)
    assert d.rate("a", 10, 0.0) is None
    assert d.rate("a", 30, 2.0) == 10.0
    assert d.rate("a", 5, 3.0) is None and resets == ["a"]
    assert d.rate("a", 15, 4.0) == 10.0
    d.forget(lambda k: k != "a")
    assert d.rate("a", 100, 5.0) is None


def test_deltas_jitter_is_no_change_not_a_reset() -> None:
    resets: list[str] = []
    d = Deltas(resets.append)
    d.delta("c", 100.0, 0.0, jitter=0.02)
    assert d.delta("c", 99.99, 1.0, jitter=0.02) == (0.0, 1.0) and resets == []
    assert d.delta("c", 99.0, 2.0, jitter=0.02) is None and resets == ["c"]


def test_idle_cpu_busy_time_does_not_step_back() -> None:
    # Found in CI: an idle CPU's busy time computed as total - idle stepped back by an ulp
    # between two reads (idle grew, busy fields did not), and the CPU's series was dropped as
    # a counter reset. Busy summed from its own fields is exactly unchanged.
    before = CpuTimes(0.1, 0.0, 0.2, 1234567.89, 0.7, 0.0, 0.0, 0.0, 0.0, 0.0)
    after = before._replace(idle=1234567.89 + 0.13)
    assert cpu_busy_total(after)[0] == cpu_busy_total(before)[0]
    col, ps, clock = make({"per_cpu": True})
    ps.cpu, ps.percpu = before, [before]
    col.collect(0.0)
    clock.t += 1
    ps.cpu, ps.percpu = after, [after._replace(system=0.19)]  # busy one tick back: noise
    got = by_name(col.collect(1.0))
    assert got["perfd_host_cpu_util_ratio"] == [({}, 0.0), ({"cpu": "0"}, 0.0)]
    assert not col.errors


@pytest.mark.parametrize("cfg", [{"interval_s": 0}, {"interfaces": "eth0"}, {"max_interfaces": -1},
                                 {"exclude_interfaces": "lo"}, {"pid": 1}])
def test_bad_config(cfg: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="host"):
        HostCollector(cfg)


def test_real_psutil_values_in_range() -> None:
    col = HostCollector({"job": "j", "per_cpu": True})
    assert col.probe().available
    col.collect(time.time())
    x = 0
    for i in range(200_000):  # some CPU work so the interval is not empty
        x += i
    time.sleep(0.2)
    got = by_name(col.collect(time.time()))
    overall = [v for lbl, v in got["perfd_host_cpu_util_ratio"] if not lbl]
    assert len(overall) == 1 and 0.0 <= overall[0] <= 1.0
    per = [lbl["cpu"] for lbl, _ in got["perfd_host_cpu_util_ratio"] if lbl]
    assert len(per) == (os.cpu_count() or len(per))
    (_, total), = got["perfd_host_memory_total_bytes"]
    (_, used), = got["perfd_host_memory_used_bytes"]
    assert 0 < used <= total and total > 2**28
    assert got["perfd_host_load1"][0][1] >= 0
    for name in ("perfd_host_net_rx_bytes_per_second", "perfd_host_net_tx_bytes_per_second"):
        for lbl, v in got.get(name, []):
            assert v >= 0 and lbl["interface"] != "lo"
    for name in ("perfd_host_disk_read_bytes_per_second", "perfd_host_disk_write_bytes_per_second"):
        for _, v in got.get(name, []):
            assert v >= 0
    assert all(s.name in METRIC_NAMES for s in col.collect(time.time()).samples)


def test_names_in_catalog() -> None:
    missing = set(METRIC_NAMES) - set(catalog.names())
    assert missing <= NOT_YET_IN_CATALOG, missing - NOT_YET_IN_CATALOG


def test_register() -> None:
    reg = Registry()
    register(reg)
    col = reg.create("host", {"interval_s": 5})
    assert isinstance(col, HostCollector) and col.default_interval_s == 5.0


def test_sample_yaml_is_a_valid_config() -> None:
    import pathlib

    import yaml

    cfg = yaml.safe_load((pathlib.Path(__file__).parents[1] / "sample.yaml").read_text())
    col = HostCollector(cfg)
    assert col.config.interfaces is None and col.config.max_interfaces == 8
