"""Readers of the kernel's per-process, per-CPU and per-cgroup accounting files. Pure parsing plus
one file read each; every reader returns None (absent) where the file is not there or not readable,
never raises for a process that went away, and never reads a file without a bound on its size.

Why by hand and not psutil: psutil has no reader for a thread's run-queue wait
(``/proc/<pid>/task/<tid>/schedstat``), a cgroup's ``cpu.stat``, ``memory.events`` or the PSI files;
and the contention scan reads every process's CPU time and last CPU, which through
``psutil.process_iter`` cost ~85 µs a process here against ~38 µs for one read of
``/proc/<pid>/stat`` (2-core VM, 73 processes). psutil still names the few processes reported
(user, command line: perfd.core.procinfo).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

PROC = "/proc"
MAX_FILE_BYTES = 64 << 10  # every file read here is a few lines; a bigger one is not what we expect
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# /proc/<pid>/stat state letters -> perfd.core.procinfo.STATES (proc(5)).
STATE_LETTERS = {"R": "running", "S": "sleeping", "D": "disk_sleep", "T": "stopped", "t": "stopped",
                 "Z": "zombie", "X": "gone", "I": "sleeping", "P": "sleeping", "W": "sleeping",
                 "K": "disk_sleep"}


def read_text(path: str) -> str | None:
    """A small file's text, None when it is not there, not readable or the process is gone."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES).decode("utf-8", "replace")
    except OSError:  # ENOENT (gone), EACCES, ESRCH: absent
        return None


@dataclass(frozen=True)
class ProcStat:
    """What /proc/<pid>/stat says of a process (its main thread's state)."""

    pid: int
    comm: str
    state: str  # one of STATE_LETTERS' values, or "other"
    ppid: int
    cpu_s: float  # utime + stime, every thread, seconds
    num_threads: int
    start_ticks: int  # start time since boot (clock ticks): a reused pid has another
    processor: int  # the CPU it last ran on
    major_faults: int


def parse_stat(pid: int, text: str) -> ProcStat | None:
    """Fields after the command name (which may hold spaces and parentheses: cut at the last ')')."""
    close = text.rfind(")")
    open_ = text.find("(")
    if close < 0 or open_ < 0:
        return None
    rest = text[close + 2:].split()
    if len(rest) < 37:
        return None
    try:
        return ProcStat(pid=pid, comm=text[open_ + 1:close], state=STATE_LETTERS.get(rest[0], "other"),
                        ppid=int(rest[1]), cpu_s=(int(rest[11]) + int(rest[12])) / CLOCK_TICKS,
                        num_threads=int(rest[17]), start_ticks=int(rest[19]), processor=int(rest[36]),
                        major_faults=int(rest[9]))
    except ValueError:
        return None


@functools.cache
def boot_time(proc: str = PROC) -> float | None:
    """When the node booted (epoch s, /proc/stat ``btime``): a process's start ticks count from it.
    Read once per proc root: the kernel gives it as the wall clock's now less the time since boot, so a
    step of the wall clock moves it, and a rank's start time read again with it would move too (and a
    start that moves reads as a new process)."""
    for line in (read_text(f"{proc}/stat") or "").splitlines():
        if line.startswith("btime "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def read_write_bytes(pid: int, proc: str = PROC) -> int | None:
    """The bytes the process caused to be written to storage (proc(5) io ``write_bytes``: counted when it
    dirties the page cache, so a checkpoint save shows while it is written, not at writeback); None when
    not readable (another user's process without the privilege, or gone)."""
    for line in (read_text(f"{proc}/{pid}/io") or "").splitlines():
        if line.startswith("write_bytes:"):
            try:
                return int(line.split(":", 1)[1])
            except ValueError:
                return None
    return None


def read_stat(pid: int, proc: str = PROC) -> ProcStat | None:
    text = read_text(f"{proc}/{pid}/stat")
    return parse_stat(pid, text) if text is not None else None


def read_task_schedstat(pid: int, max_threads: int, proc: str = PROC, only: set[int] | None = None
                        ) -> tuple[dict[int, tuple[int, int]], int] | None:
    """tid -> (ns on a CPU, ns waiting in a run queue) for the process's threads (at most
    ``max_threads``; the second value is how many were left out), None where the kernel keeps no
    schedstats (no CONFIG_SCHED_INFO) or the process is gone. ``only``: these threads alone (no
    listing of the others)."""
    if only is not None:
        tids = sorted(only)
    else:
        try:
            tids = sorted(int(t) for t in os.listdir(f"{proc}/{pid}/task") if t.isdigit())
        except OSError:
            return None
    out: dict[int, tuple[int, int]] = {}
    for tid in tids[:max_threads]:
        text = read_text(f"{proc}/{pid}/task/{tid}/schedstat")
        if text is None:
            continue  # the thread ended between the listing and the read
        parts = text.split()
        try:
            out[tid] = (int(parts[0]), int(parts[1]))
        except (IndexError, ValueError):
            continue
    if not out and tids:
        return None  # threads there, no schedstat: the kernel does not keep it
    return out, max(0, len(tids) - max_threads)


def affinity(pid: int) -> list[int] | None:
    """The CPUs the process may run on (sched_getaffinity), None when not visible."""
    try:
        return sorted(os.sched_getaffinity(pid))
    except (OSError, AttributeError):
        return None


def read_cpu_times(proc: str = PROC) -> dict[int, tuple[int, int]] | None:
    """cpu -> (busy ticks, total ticks) from /proc/stat. Busy leaves out idle and iowait; guest
    time is inside user already (as collectors/host counts it)."""
    text = read_text(f"{proc}/stat")
    if text is None:
        return None
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        parts = line.split()
        try:
            cpu = int(parts[0][3:])
            vals = [int(v) for v in parts[1:9]]  # user nice system idle iowait irq softirq steal
        except (IndexError, ValueError):
            continue
        total = sum(vals)
        out[cpu] = (total - vals[3] - vals[4], total)
    return out


def descendants(pid: int, max_n: int, proc: str = PROC) -> list[int] | None:
    """The pids of ``pid``'s descendants (breadth first, at most ``max_n``), from every thread's
    ``task/<tid>/children``; None where the kernel has no such file (CONFIG_PROC_CHILDREN)."""
    out: list[int] = []
    todo, seen = [pid], {pid}
    while todo and len(out) < max_n:
        p = todo.pop(0)
        try:
            tids = os.listdir(f"{proc}/{p}/task")
        except OSError:
            continue
        for tid in tids:
            text = read_text(f"{proc}/{p}/task/{tid}/children")
            if text is None:
                if p == pid and not os.path.exists(f"{proc}/{p}/task/{tid}/children"):
                    return None  # not this kernel's: never "no children"
                continue
            for word in text.split():
                c = int(word) if word.isdigit() else 0
                if c > 0 and c not in seen:
                    seen.add(c)
                    out.append(c)
                    todo.append(c)
    return out[:max_n]


def scan_processes(max_pids: int, proc: str = PROC) -> tuple[dict[int, ProcStat], int]:
    """Every process's stat (at most ``max_pids``; the second value: how many were left out)."""
    try:
        pids = [int(d) for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return {}, 0
    out: dict[int, ProcStat] = {}
    for pid in pids[:max_pids]:
        st = read_stat(pid, proc)
        if st is not None:
            out[pid] = st
    return out, max(0, len(pids) - max_pids)


# --- cgroups -------------------------------------------------------------------------------------------

@dataclass
class Mounts:
    """Where the cgroup hierarchies are mounted (from /proc/self/mountinfo, read once)."""

    v2: str | None = None
    v1: dict[str, str] = field(default_factory=dict)  # controller -> mount point

    @staticmethod
    def parse(text: str) -> Mounts:
        m = Mounts()
        for line in text.splitlines():
            left, sep, right = line.partition(" - ")
            if not sep:
                continue
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3:
                continue
            point, fstype, options = fields[4], tail[0], tail[2]
            if fstype == "cgroup2" and m.v2 is None:
                m.v2 = point
            elif fstype == "cgroup":
                for opt in options.split(","):
                    if opt in ("cpu", "memory", "cpuacct"):
                        m.v1.setdefault(opt, point)
        return m


def read_mounts(proc: str = PROC) -> Mounts:
    text = read_text(f"{proc}/self/mountinfo")
    return Mounts.parse(text) if text is not None else Mounts()


@dataclass(frozen=True)
class CgroupDirs:
    """The directories of a process's cgroups: the unified (v2) one and the v1 cpu and memory ones
    (a hybrid host has both: controllers on v1, the unified tree with none)."""

    path: str  # the v2 path as /proc/<pid>/cgroup gives it ("/" = the root), or the v1 cpu one
    v2: str | None
    v1_cpu: str | None
    v1_memory: str | None

    @property
    def is_root(self) -> bool:
        return self.path in ("", "/")


def cgroup_dirs(pid: int, mounts: Mounts, proc: str = PROC) -> CgroupDirs | None:
    text = read_text(f"{proc}/{pid}/cgroup")
    if text is None:
        return None
    v2_path: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _hid, controllers, path = parts
        if controllers == "":
            v2_path = path
        for c in controllers.split(","):
            v1.setdefault(c, path)

    def join(root: str | None, path: str | None) -> str | None:
        if root is None or path is None:
            return None
        d = os.path.join(root, path.lstrip("/"))
        return d if os.path.isdir(d) else None

    cpu_path = v1.get("cpu") or v1.get("cpuacct")
    return CgroupDirs(path=v2_path if v2_path is not None else (cpu_path or "/"),
                      v2=join(mounts.v2, v2_path),
                      v1_cpu=join(mounts.v1.get("cpu") or mounts.v1.get("cpuacct"), cpu_path),
                      v1_memory=join(mounts.v1.get("memory"), v1.get("memory")))


def read_keyed(path: str) -> dict[str, int] | None:
    """``key value`` lines (cpu.stat, memory.events, memory.oom_control, vmstat) as ints."""
    text = read_text(path)
    if text is None:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


@dataclass(frozen=True)
class Throttling:
    """A cgroup's CFS bandwidth counters, in one unit whatever the cgroup version."""

    periods: int
    throttled: int
    throttled_s: float
    quota_cores: float | None  # quota ÷ period; None: no quota


def read_throttling(d: CgroupDirs) -> Throttling | None:
    """v2 ``cpu.stat`` (nr_periods, nr_throttled, throttled_usec) and ``cpu.max``; else v1
    ``cpu.stat`` (throttled_time in ns) and ``cpu.cfs_quota_us``/``cpu.cfs_period_us``. None when
    neither has the counters (no cpu controller where the process is)."""
    for base, v2 in ((d.v2, True), (d.v1_cpu, False)):
        if base is None:
            continue
        st = read_keyed(os.path.join(base, "cpu.stat"))
        if not st or "nr_periods" not in st:
            continue
        quota = None
        if v2:
            text = read_text(os.path.join(base, "cpu.max"))
            parts = text.split() if text else []
            if len(parts) == 2 and parts[0] != "max":
                try:
                    quota = int(parts[0]) / int(parts[1])
                except (ValueError, ZeroDivisionError):
                    quota = None
            secs = st.get("throttled_usec", 0) / 1e6
        else:
            q = read_text(os.path.join(base, "cpu.cfs_quota_us"))
            per = read_text(os.path.join(base, "cpu.cfs_period_us"))
            try:
                qv, pv = int((q or "").strip()), int((per or "").strip())
                quota = qv / pv if qv > 0 and pv > 0 else None
            except ValueError:
                quota = None
            secs = st.get("throttled_time", 0) / 1e9
        return Throttling(st["nr_periods"], st.get("nr_throttled", 0), secs, quota)
    return None


def read_oom_kills(d: CgroupDirs) -> int | None:
    """The cgroup's OOM kill count: v2 ``memory.events`` oom_kill, else v1 ``memory.oom_control``."""
    if d.v2 is not None:
        ev = read_keyed(os.path.join(d.v2, "memory.events"))
        if ev is not None and "oom_kill" in ev:
            return ev["oom_kill"]
    if d.v1_memory is not None:
        ctl = read_keyed(os.path.join(d.v1_memory, "memory.oom_control"))
        if ctl is not None and "oom_kill" in ctl:
            return ctl["oom_kill"]
    return None


def parse_psi(text: str) -> dict[str, int]:
    """``some avg10=… total=N`` / ``full …`` -> {"some": N µs, "full": N µs}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        for p in parts[1:]:
            if p.startswith("total="):
                try:
                    out[parts[0]] = int(p[6:])
                except ValueError:
                    pass
    return out


PSI_RESOURCES = ("cpu", "memory", "io")


def read_pressure(d: CgroupDirs | None, proc: str = PROC) -> tuple[dict[str, int], str] | None:
    """resource -> PSI "some" total (µs) of the cgroup, with where it came from: ``cgroup`` (its own
    ``*.pressure`` files) or ``node`` (the root cgroup's pressure is /proc/pressure). None where the
    kernel has no PSI (or it is off: psi=0) and for a cgroup without pressure files on a v1 host."""
    use_node = d is None or d.is_root or d.v2 is None
    out: dict[str, int] = {}
    for res in PSI_RESOURCES:
        own = None if use_node or d is None else d.v2
        path = f"{proc}/pressure/{res}" if own is None else os.path.join(own, f"{res}.pressure")
        text = read_text(path)
        if text is None:
            continue
        some = parse_psi(text).get("some")
        if some is not None:
            out[res] = some
    if not out:
        return None
    return out, "node" if use_node else "cgroup"


def read_swap_in_pages(proc: str = PROC) -> int | None:
    """Pages swapped in since boot, node-wide (/proc/vmstat pswpin; its one line found, not every
    line of the file parsed)."""
    text = read_text(f"{proc}/vmstat")
    at = text.find("\npswpin ") if text is not None else -1
    if text is None or at < 0:
        return None
    try:
        return int(text[at + 8:text.index("\n", at + 1)])
    except ValueError:
        return None
