"""The ``host`` collector: CPU, load, memory, network and disk rates of the node, via psutil.

Rates come from counter deltas between two collects, over a monotonic clock. The first collect has
no previous value, so its rates are absent (not 0); a counter that went backwards (wrap, interface
or disk reset, hot-plug) skips that interval for that counter and is counted, never turned into a
negative or huge rate. Label sets stay bounded: per-CPU values are off by default, interfaces are
capped, disks are summed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from perfd.collectors.collector import Capabilities, Collected, Collector
from perfd.collectors.config_values import as_float
from perfd.core.model import Sample

# Interfaces that only duplicate traffic already counted elsewhere (container veth pairs, bridges)
# or never leave the node (lo).
DEFAULT_EXCLUDE = ("lo", "veth", "docker", "br-", "virbr")
# Block devices that are not physical disks, or are layered on them (device-mapper, md RAID) and
# would double count their traffic.
VIRTUAL_DISK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")

METRIC_NAMES = (
    "perfd_host_cpu_util_ratio", "perfd_host_load1", "perfd_host_memory_used_bytes",
    "perfd_host_memory_total_bytes", "perfd_host_net_rx_bytes_per_second",
    "perfd_host_net_tx_bytes_per_second",
    "perfd_host_disk_read_bytes_per_second", "perfd_host_disk_write_bytes_per_second",
)


def list_block_devices() -> list[str] | None:
    """Whole block devices (``/sys/block``), without virtual ones; None where there is no sysfs."""
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return None
    return sorted(n for n in names if not n.startswith(VIRTUAL_DISK_PREFIXES))


@dataclass
class HostConfig:
    interval_s: float = 1.0
    per_cpu: bool = False
    interfaces: tuple[str, ...] | None = None  # None: auto (all but excluded, capped)
    exclude_interfaces: tuple[str, ...] = DEFAULT_EXCLUDE
    max_interfaces: int = 8
    disk_refresh_s: float = 60.0

    @classmethod
    def from_dict(cls, cfg: Mapping[str, object]) -> HostConfig:
        # "job" is added by the agent to every collector's config; host metrics are per node.
        known = {"interval_s", "per_cpu", "interfaces", "exclude_interfaces", "max_interfaces",
                 "disk_refresh_s", "job"}
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"host: unknown config key(s) {sorted(unknown)}; known: {sorted(known)}")
        ifaces = cfg.get("interfaces", "auto")
        if ifaces in ("auto", None):
            interfaces = None
        elif isinstance(ifaces, list) and all(isinstance(i, str) for i in ifaces):
            interfaces = tuple(ifaces)
        else:
            raise ValueError(f"host: interfaces must be 'auto' or a list of names, not {ifaces!r}")
        exclude = cfg.get("exclude_interfaces", list(DEFAULT_EXCLUDE))
        if not isinstance(exclude, list) or not all(isinstance(i, str) for i in exclude):
            raise ValueError(f"host: exclude_interfaces must be a list of name prefixes, not {exclude!r}")
        interval = as_float(cfg.get("interval_s", 1.0))
        max_if = cfg.get("max_interfaces", 8)
        if interval <= 0:
            raise ValueError(f"host: interval_s must be > 0, not {interval}")
        if not isinstance(max_if, int) or isinstance(max_if, bool) or max_if < 0:
            raise ValueError(f"host: max_interfaces must be an integer >= 0, not {max_if!r}")
        return cls(interval_s=interval, per_cpu=bool(cfg.get("per_cpu", False)), interfaces=interfaces,
                   exclude_interfaces=tuple(exclude), max_interfaces=max_if,
                   disk_refresh_s=as_float(cfg.get("disk_refresh_s", 60.0)))


# Per-CPU times come in clock ticks (10 ms); a step back of up to two ticks is noise (see Deltas).
CPU_TIME_JITTER_S = 0.02


class Deltas:
    """Previous value and time per counter; ``rate()`` gives the per-second rate or None."""

    def __init__(self, on_reset: Callable[[str], None]) -> None:
        self._prev: dict[str, tuple[float, float]] = {}
        self._on_reset = on_reset

    def delta(self, key: str, value: float, t: float, jitter: float = 0.0) -> tuple[float, float] | None:
        """(value delta, seconds) since the previous call for ``key``; None on the first call,
        when no time passed, or when the counter went backwards by more than ``jitter`` (counted
        via ``on_reset``). A step back within ``jitter`` reads as no change: per-CPU times in
        /proc/stat are known to step back by a tick on some kernels and hypervisors, which is
        noise, not a counter reset."""
        prev = self._prev.get(key)
        self._prev[key] = (value, t)
        if prev is None:
            return None
        dv, dt = value - prev[0], t - prev[1]
        if -jitter <= dv < 0:
            dv = 0.0
        if dv < 0:
            self._on_reset(key)
            return None
        if dt <= 0:
            return None
        return dv, dt

    def rate(self, key: str, value: float, t: float) -> float | None:
        d = self.delta(key, value, t)
        return None if d is None else d[0] / d[1]

    def forget(self, keep: Callable[[str], bool]) -> None:
        for key in [k for k in self._prev if not keep(k)]:
            del self._prev[key]


class CpuTimes(Protocol):
    """psutil's cpu_times() (a named tuple of seconds per mode)."""

    def _asdict(self) -> dict[str, float]: ...


def cpu_busy_total(times: CpuTimes) -> tuple[float, float]:
    """(busy, total) seconds from a psutil cpu_times tuple. Linux counts guest time inside user and
    nice already, so guest fields are left out of the total; idle and iowait are not busy.
    Busy is summed from its own fields, not taken as total - idle: the subtraction's rounding
    made an idle CPU's busy time step back by an ulp, which read as a counter reset."""
    fields = times._asdict()
    counted = {k: v for k, v in fields.items() if k not in ("guest", "guest_nice")}
    busy = sum(v for k, v in counted.items() if k not in ("idle", "iowait"))
    return busy, sum(counted.values())


class HostCollector(Collector):
    """Node CPU, load, memory, network and disk rates (psutil)."""

    name = "host"

    def __init__(self, config: Mapping[str, object] | None = None, *, ps: Any | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 block_devices: Callable[[], list[str] | None] = list_block_devices) -> None:
        super().__init__()
        self.config = HostConfig.from_dict(dict(config or {}))
        self.default_interval_s = self.config.interval_s
        # The psutil module, or a test's stand-in; imported lazily in probe(). Any: psutil's functions
        # are overloaded on their flags (percpu=, pernic=), which no protocol a stand-in meets says.
        self._ps: Any = ps
        self._clock = clock
        self._block_devices = block_devices
        self._deltas = Deltas(lambda key: self.count_error("counter-reset", key))
        self._ifaces: list[str] = []
        self._ifaces_dropped: set[str] = set()
        self._disks: list[str] | None = None
        self._disks_at: float | None = None
        self.caps: Capabilities | None = None

    def probe(self) -> Capabilities:
        if self.caps is not None:
            return self.caps
        if self._ps is None:
            try:
                import psutil
            except Exception as exc:
                self.caps = Capabilities(False, f"psutil not importable: {exc}")
                return self.caps
            self._ps = psutil
        self.caps = Capabilities(True, features={"per_cpu": self.config.per_cpu,
                                                 "disks_from_sysfs": self._block_devices() is not None})
        return self.caps

    def collect(self, now: float) -> Collected:
        out = Collected()
        if not self.probe().available:
            return out
        t = self._clock()

        def emit(name: str, value: float, labels: dict[str, str] | None = None) -> None:
            out.samples.append(Sample(name=name, value=float(value), time=now, labels=labels or {}))

        for part in (self._cpu, self._memory, self._net, self._disk):
            try:
                part(t, emit)
            except Exception as exc:  # one failing psutil call must not cost the other metrics
                self.count_error(f"{part.__name__.strip('_')}-failed", repr(exc))
        return out

    def _cpu(self, t: float, emit: Callable[..., None]) -> None:
        busy, total = cpu_busy_total(self._ps.cpu_times())
        ratio = self._busy_ratio("cpu", busy, total, t)
        if ratio is not None:
            emit("perfd_host_cpu_util_ratio", ratio)
        if self.config.per_cpu:
            for i, times in enumerate(self._ps.cpu_times(percpu=True)):
                b, tot = cpu_busy_total(times)
                r = self._busy_ratio(f"cpu{i}", b, tot, t)
                if r is not None:
                    emit("perfd_host_cpu_util_ratio", r, {"cpu": str(i)})
        emit("perfd_host_load1", self._ps.getloadavg()[0])

    def _busy_ratio(self, key: str, busy: float, total: float, t: float) -> float | None:
        db = self._deltas.delta(f"{key}:busy", busy, t, jitter=CPU_TIME_JITTER_S)
        dt = self._deltas.delta(f"{key}:total", total, t, jitter=CPU_TIME_JITTER_S)
        if db is None or dt is None or dt[0] <= 0:
            return None
        return min(max(db[0] / dt[0], 0.0), 1.0)

    def _memory(self, t: float, emit: Callable[..., None]) -> None:
        vm = self._ps.virtual_memory()
        # total - available: what applications cannot get back without swapping (page cache
        # excluded); psutil's own "used" differs by platform.
        emit("perfd_host_memory_used_bytes", vm.total - vm.available)
        emit("perfd_host_memory_total_bytes", vm.total)

    def _select_interfaces(self, names: list[str]) -> list[str]:
        if self.config.interfaces is not None:
            return [n for n in self.config.interfaces if n in names]
        for n in sorted(names):
            if n in self._ifaces or n.startswith(self.config.exclude_interfaces):
                continue
            if len(self._ifaces) < self.config.max_interfaces:
                self._ifaces.append(n)
            elif n not in self._ifaces_dropped:
                # Bounded labels: beyond the cap an interface is left out, counted once.
                self._ifaces_dropped.add(n)
                self.count_error("interfaces-over-cap", n)
        return [n for n in self._ifaces if n in names]

    def _net(self, t: float, emit: Callable[..., None]) -> None:
        counters = self._ps.net_io_counters(pernic=True) or {}
        for name in self._select_interfaces(list(counters)):
            c = counters[name]
            for metric, value, key in (("perfd_host_net_rx_bytes_per_second", c.bytes_recv, "rx"),
                                       ("perfd_host_net_tx_bytes_per_second", c.bytes_sent, "tx")):
                r = self._deltas.rate(f"net:{key}:{name}", value, t)
                if r is not None:
                    emit(metric, r, {"interface": name})

    def _disk(self, t: float, emit: Callable[..., None]) -> None:
        if self._disks_at is None or t - self._disks_at >= self.config.disk_refresh_s:
            self._disks, self._disks_at = self._block_devices(), t
        if self._disks is None:  # no sysfs: psutil's own total (may include virtual devices)
            total = self._ps.disk_io_counters(perdisk=False)
            per = {"all": total} if total is not None else {}
        else:
            counters = self._ps.disk_io_counters(perdisk=True) or {}
            per = {d: counters[d] for d in self._disks if d in counters}
        # Sum per-disk deltas rather than deltas of a sum: a disk appearing or resetting then
        # cannot fake a burst of traffic.
        for metric, field in (("perfd_host_disk_read_bytes_per_second", "read_bytes"),
                              ("perfd_host_disk_write_bytes_per_second", "write_bytes")):
            moved, seconds, complete = 0.0, 0.0, True
            for disk, c in per.items():
                d = self._deltas.delta(f"disk:{field}:{disk}", getattr(c, field), t)
                if d is None:
                    complete = False
                    continue
                moved += d[0]
                seconds = d[1]
            if per and complete and seconds > 0:
                emit(metric, moved / seconds)
