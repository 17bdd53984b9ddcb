"""The ``nvml`` collector: per-GPU NVML and GPM samples, process lists and XID events.

``NvmlCollector(config)`` is the one class the registry knows as "nvml". ``config["source"]`` picks
what feeds it: ``real`` (NVML on this node, the default), ``replay:FILE`` (a recording made by
``perfd.collectors.nvml.record``, for demos and tests without a GPU) or ``off``.

Cost discipline (docs/design.md §3): the fast path calls only the cheap functions (each 4–19 µs);
total energy (3.9 ms) and rarely-changing values go on the slow interval; PCIe throughput (20 ms)
and NVLink field values (1 ms) are never called: their rates come from GPM.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from perfd.collectors.collector import Capabilities, Collected, Collector
from perfd.collectors.config_values import as_float
from perfd.collectors.nvml.gpm import GPM_METRICS, GpmSampler
from perfd.collectors.nvml.probe import DeviceState, MemoryInfo, Utilization, is_permanent, probe_device
from perfd.collectors.nvml.processes import (
    EnvLookup,
    GpuProcess,
    NameLookup,
    ProcessTracker,
    UserLookup,
    psutil_lookup,
    psutil_rank_env,
    psutil_user,
)
from perfd.collectors.nvml.replay import NvmlReplay
from perfd.collectors.nvml.wrapper import Nvml
from perfd.core.events import GPU_LOST, XID
from perfd.core.model import Sample
from perfd.core.procinfo import PodJobs, user_id

# Clock event ("throttle") reasons, bit -> label value. A fixed, bounded set: bits outside it
# (board limit, reliability, future ones) still show in the bitmask sample.
THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1), ("applications_clocks", 0x2), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8),
    ("sync_boost", 0x10), ("sw_thermal", 0x20), ("hw_thermal", 0x40), ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
)

NVML_METRICS: tuple[str, ...] = (
    "perfd_gpu_utilization_ratio", "perfd_gpu_memory_utilization_ratio", "perfd_gpu_memory_used_bytes",
    "perfd_gpu_memory_total_bytes", "perfd_gpu_power_watts", "perfd_gpu_power_limit_watts",
    "perfd_gpu_energy_joules_total", "perfd_gpu_temperature_celsius", "perfd_gpu_sm_clock_hertz",
    "perfd_gpu_mem_clock_hertz", "perfd_gpu_throttle_reasons", "perfd_gpu_throttle_active",
    "perfd_gpu_ecc_errors_total", "perfd_gpu_xid_errors_total", "perfd_gpu_xid_last", "perfd_gpu_processes",
)
# Every metric name this collector may emit.
METRIC_NAMES: tuple[str, ...] = NVML_METRICS + tuple(m.name for m in GPM_METRICS)

_MAX_XID_EVENTS_PER_COLLECT = 16  # a storm of XIDs must not stall one collect


def decode_throttle(mask: int) -> list[str]:
    """Names of the active reasons in a clocks-event-reasons bitmask (fixed set only)."""
    return [name for name, bit in THROTTLE_REASONS if mask & bit]


class _Emit(Protocol):
    def __call__(self, name: str, value: float, extra: dict[str, str] | None = None) -> None: ...


def _parse_gpm(value: object) -> bool | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, bool):
        return value
    raise ValueError(f"nvml: gpm must be true, false or auto, not {value!r}")


def _positive(cfg: Mapping[str, object], key: str, default: float) -> float:
    value = as_float(cfg.get(key, default))
    if value <= 0:
        raise ValueError(f"nvml: {key} must be > 0, not {value}")
    return value


@dataclass
class NvmlConfig:
    source: str = "real"  # real | off | replay:FILE
    devices: tuple[int, ...] | None = None  # None: all devices
    interval_s: float = 1.0
    slow_interval_s: float = 10.0
    gpm: bool | None = None  # None: auto (where supported)
    processes: bool = True
    process_event_interval_s: float = 60.0
    xid: bool = True
    throttle_zeros: bool = True  # also emit 0 for inactive reasons (the catalog's "else 0")
    replay_loop: bool = False
    replay_speed: float = 1.0
    # The job the agent serves and its user (the agent adds both): only that user's processes are the
    # job's ranks (collectors/nvml/processes.py). None: a node agent.
    job: str | None = None
    job_uid: int | None = None

    @classmethod
    def from_dict(cls, cfg: Mapping[str, object]) -> NvmlConfig:
        """Validate a config mapping; a bad value is a configuration error and raises ValueError."""
        # "job" is added to every collector's config by the agent; NVML samples are per node, not
        # per job, so it is accepted and not used.
        known = {"source", "devices", "interval_s", "slow_interval_s", "gpm", "processes",
                 "process_event_interval_s", "xid", "throttle_zeros", "loop", "speed", "job", "job_user"}
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"nvml: unknown config key(s) {sorted(unknown)}; known: {sorted(known)}")
        source = str(cfg.get("source", "real"))
        if source not in ("real", "off") and not (source.startswith("replay:") and len(source) > 7):
            raise ValueError(f"nvml: source must be real, off or replay:FILE, not {source!r}")
        devices_raw = cfg.get("devices", "all")
        devices: tuple[int, ...] | None
        if devices_raw in ("all", None):
            devices = None
        elif isinstance(devices_raw, list | tuple) and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices_raw):
            devices = tuple(devices_raw)
        else:
            raise ValueError(f"nvml: devices must be 'all' or a list of indices, not {devices_raw!r}")
        return cls(
            source=source, devices=devices,
            interval_s=_positive(cfg, "interval_s", 1.0),
            slow_interval_s=_positive(cfg, "slow_interval_s", 10.0),
            gpm=_parse_gpm(cfg.get("gpm", "auto")),
            processes=bool(cfg.get("processes", True)),
            process_event_interval_s=_positive(cfg, "process_event_interval_s", 60.0),
            xid=bool(cfg.get("xid", True)),
            throttle_zeros=bool(cfg.get("throttle_zeros", True)),
            replay_loop=bool(cfg.get("loop", False)),
            replay_speed=_positive(cfg, "speed", 1.0),
            job=str(cfg["job"]) if cfg.get("job") else None, job_uid=user_id(cfg.get("job_user")),
        )


class NvmlCollector(Collector):
    """The registry's "nvml": real NVML, a replayed recording, or off, chosen by ``source``."""

    name = "nvml"

    def __init__(self, config: Mapping[str, object] | None = None, *, nvml: Nvml | None = None,
                 process_lookup: NameLookup = psutil_lookup, user_lookup: UserLookup = psutil_user,
                 env_lookup: EnvLookup = psutil_rank_env) -> None:
        super().__init__()
        self.config = NvmlConfig.from_dict(dict(config or {}))
        self.default_interval_s = self.config.interval_s
        self.real: RealNvml | None = None
        self.replay: NvmlReplay | None = None
        if self.config.source == "real":
            self.real = RealNvml(self, self.config, nvml or Nvml(), process_lookup, user_lookup, env_lookup)
        elif self.config.source.startswith("replay:"):
            self.replay = NvmlReplay(self, self.config.source[len("replay:"):],
                                     loop=self.config.replay_loop, speed=self.config.replay_speed)

    @property
    def mode(self) -> str:
        return "real" if self.real else "replay" if self.replay else "off"

    def probe(self) -> Capabilities:
        if self.real is not None:
            return self.real.probe()
        if self.replay is not None:
            return self.replay.probe()
        return Capabilities(available=False, reason="nvml collector switched off (source: off)")

    def start(self) -> None:
        if self.real is not None:
            self.real.start()

    def collect(self, now: float) -> Collected:
        if self.real is not None:
            return self.real.collect(now)
        if self.replay is not None:
            return self.replay.collect(now)
        return Collected()

    def stop(self) -> None:
        if self.real is not None:
            self.real.stop()


class RealNvml:
    """NVML on this node. Errors go to the owning collector's ``count_error``."""

    def __init__(self, owner: Collector, config: NvmlConfig, nvml: Nvml, lookup: NameLookup,
                 user_lookup: UserLookup = psutil_user, env_lookup: EnvLookup = psutil_rank_env) -> None:
        self.owner = owner
        self.config = config
        self.nvml = nvml
        self.devices: list[DeviceState] = []
        self.caps: Capabilities | None = None
        self._gpm: dict[int, GpmSampler] = {}
        # A process without PERFD_JOB: its pod's (perfd.core.procinfo.PodJobs; the sidecar topology)
        self._procs = ProcessTracker(config.process_event_interval_s, lookup, env_lookup, user_lookup,
                                     pod_job=PodJobs().job_of, job=config.job, job_uid=config.job_uid)
        self._last_slow: float | None = None
        self._xid_seen: dict[int, int] = {}  # device index -> XIDs seen since start
        self._xid_last: dict[int, int] = {}
        self._started = False
        self._stopped = False

    # --- probe / start / stop -----------------------------------------------------------------
    def probe(self) -> Capabilities:
        if self.caps is not None:
            return self.caps
        reason = self.nvml.init()
        if reason is not None:
            self.caps = Capabilities(available=False, reason=reason)
            return self.caps
        count = self.nvml.device_count()
        wanted = range(count) if self.config.devices is None else self.config.devices
        for index in wanted:
            if index >= count:
                self.owner.count_error("device-index-out-of-range", f"gpu {index} (node has {count})")
                continue
            dev = probe_device(self.nvml, index, self.config.gpm, self.config.xid)
            if dev is None:
                self.owner.count_error("device-handle-failed", f"gpu {index}")
                continue
            self.devices.append(dev)
            if self.config.gpm is True and not dev.gpm_supported:
                self.owner.count_error("gpm-unsupported", f"gpu {index} ({dev.name}): gpm: true but no GPM")
        if not self.devices:
            self.nvml.shutdown()
            self.caps = Capabilities(available=False, reason="no NVIDIA GPU selected by 'devices' is usable")
            return self.caps
        self.caps = Capabilities(available=True, features={
            "gpm": any(d.gpm_supported for d in self.devices),
            "xid": any(d.xid_event_set is not None for d in self.devices),
            "processes": any("processes" in d.chosen for d in self.devices),
            "energy": any("energy" in d.chosen for d in self.devices),
            "ecc": any("ecc_uncorrected" in d.chosen for d in self.devices),
        })
        return self.caps

    def start(self) -> None:
        if self._started or self._stopped or not self.probe().available:
            return
        self._started = True
        for dev in self.devices:
            if dev.gpm_supported and self.config.gpm is not False:
                sampler = GpmSampler(self.nvml, dev.handle)
                if sampler.start():
                    self._gpm[dev.index] = sampler
                else:
                    self.owner.count_error("gpm-start-failed", f"gpu {dev.index}")

    def stop(self) -> None:
        for sampler in self._gpm.values():
            sampler.close()
        self._gpm.clear()
        for dev in self.devices:
            if dev.xid_event_set is not None:
                self.nvml.call("nvmlEventSetFree", dev.xid_event_set)
                dev.xid_event_set = None
        self.nvml.shutdown()
        self._started = False
        self._stopped = True  # NVML is shut down: a late collect() must not call into it

    # --- collect ------------------------------------------------------------------------------
    def collect(self, now: float) -> Collected:
        out = Collected()
        if self._stopped or not self.probe().available:
            return out
        if not self._started:
            self.start()
        slow = self._last_slow is None or now - self._last_slow >= self.config.slow_interval_s
        if slow:
            self._last_slow = now
        for dev in self.devices:
            if dev.lost:
                continue
            self._collect_device(dev, now, slow, out)
            if dev.lost:
                self.owner.count_error("gpu-lost", f"gpu {dev.index} {dev.uuid}")
                out.events.append({"kind": GPU_LOST.name, "severity": "critical", "time": now,
                                   "labels": dev.labels, "text": f"GPU {dev.index} is lost (NVML GpuIsLost)"})
        return out

    def _collect_device(self, dev: DeviceState, now: float, slow: bool, out: Collected) -> None:
        labels = dev.labels
        samples = out.samples

        def emit(name: str, value: float, extra: dict[str, str] | None = None) -> None:
            samples.append(Sample(name=name, value=float(value), time=now,
                                  labels={**labels, **extra} if extra else dict(labels)))

        def read(key: str) -> object:
            value = dev.read(self.nvml, key)
            if self.nvml.last_error == "GpuIsLost":
                dev.lost = True
            return value

        util = read("utilization")
        if isinstance(util, Utilization):
            emit("perfd_gpu_utilization_ratio", util.gpu / 100.0)
            emit("perfd_gpu_memory_utilization_ratio", util.memory / 100.0)
        mem = read("memory")
        if isinstance(mem, MemoryInfo):
            emit("perfd_gpu_memory_used_bytes", mem.used)
            emit("perfd_gpu_memory_total_bytes", mem.total)
        power = read("power")
        if isinstance(power, int | float):
            emit("perfd_gpu_power_watts", power / 1000.0)  # NVML reports milliwatts
        temp = read("temperature")
        if isinstance(temp, int | float):
            emit("perfd_gpu_temperature_celsius", temp)
        for key, name in (("sm_clock", "perfd_gpu_sm_clock_hertz"),
                          ("mem_clock", "perfd_gpu_mem_clock_hertz")):
            mhz = read(key)
            if isinstance(mhz, int | float):
                emit(name, mhz * 1e6)
        mask = read("throttle")
        if isinstance(mask, int):
            emit("perfd_gpu_throttle_reasons", int(mask))
            for reason, bit in THROTTLE_REASONS:
                if int(mask) & bit or self.config.throttle_zeros:
                    emit("perfd_gpu_throttle_active", 1.0 if int(mask) & bit else 0.0, {"reason": reason})
        if dev.lost:
            return
        if slow:
            self._collect_slow(dev, read, emit)
        sampler = self._gpm.get(dev.index)
        if sampler is not None:
            for name, value in sampler.step().items():
                emit(name, value)
        if self.config.processes:
            raw = read("processes")
            if isinstance(raw, list):
                procs = [GpuProcess.from_nvml(p) for p in raw]
                emit("perfd_gpu_processes", len(procs))
                event = self._procs.update(labels, procs, now)
                if event is not None:
                    out.events.append(dict(event))
        if dev.xid_event_set is not None:
            self._collect_xid(dev, now, emit, out)

    def _collect_slow(self, dev: DeviceState, read: Callable[[str], object], emit: _Emit) -> None:
        energy = read("energy")
        if isinstance(energy, int | float):
            emit("perfd_gpu_energy_joules_total", energy / 1000.0)  # millijoules
        limit = read("power_limit")
        if isinstance(limit, int | float):
            emit("perfd_gpu_power_limit_watts", limit / 1000.0)  # milliwatts
        for key, kind in (("ecc_corrected", "corrected"), ("ecc_uncorrected", "uncorrected")):
            count = read(key)
            if isinstance(count, int | float):
                emit("perfd_gpu_ecc_errors_total", count, {"type": kind})

    def _collect_xid(self, dev: DeviceState, now: float, emit: _Emit, out: Collected) -> None:
        for _ in range(_MAX_XID_EVENTS_PER_COLLECT):
            # Timeout 0: a non-blocking poll; "Timeout" only means "no event pending".
            data = self.nvml.call_quiet(dev.xid_wait_fn, ("Timeout",), dev.xid_event_set, 0)
            if data is None:
                if is_permanent(self.nvml.last_error):  # stop polling a set that cannot work
                    self.nvml.call("nvmlEventSetFree", dev.xid_event_set)
                    dev.xid_event_set = None
                    return
                break
            xid = int(getattr(data, "eventData", 0))
            self._xid_seen[dev.index] = self._xid_seen.get(dev.index, 0) + 1
            self._xid_last[dev.index] = xid
            out.events.append({"kind": XID.name, "severity": "critical", "time": now,
                               "labels": dev.labels, "text": f"XID {xid} on GPU {dev.index}",
                               "payload": {"xid": xid}})
        emit("perfd_gpu_xid_errors_total", self._xid_seen.get(dev.index, 0))
        if dev.index in self._xid_last:
            emit("perfd_gpu_xid_last", self._xid_last[dev.index])
