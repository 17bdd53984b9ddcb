"""Who else runs on a waiting rank's CPUs: while a rank of the ``ranks`` collector waits for a CPU
(thresholds.CPU_WAIT_SCAN), a scan of every process's CPU time and last CPU names, with the previous
scan, the processes that ran on the rank's allowed CPUs (pid, user, command, share), the job's own (a
data loader worker: a descendant of a rank) told apart from the others.

Apart from the collector (collectors/ranks/collector.py: following each rank process and reading its
own files) because it reads every process of the node, not the ranks', and only while one waits:
its own state (the previous scan, the names it looked up) and its own bounds (perfd.core.limits
MAX_SCAN_PIDS, RANK_OTHERS_TOP_N).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from perfd.collectors.ranks import procfs
from perfd.core import limits as L
from perfd.core.events import RankHost
from perfd.core.procinfo import psutil_lookup, psutil_user, shown_cmdline
from perfd.core.shared_thresholds import CPU_WAIT_SCAN, STALL_IDLE_CPU_CORES

# CPU a rank's threads must want (run + wait, in cores) for its wait share to mean contention: the
# idle threshold of a stall (under it a rank makes no progress, and its few µs of wait say nothing).
MIN_DEMAND = STALL_IDLE_CPU_CORES.value


def waits(row: RankHost) -> bool:
    """The rank waits for a CPU: a share of the time it wanted one past CPU_WAIT_SCAN, and it wanted
    some (a rank that barely runs waits a few µs a wake-up: a large share of almost nothing)."""
    wait, demand = row.get("wait_ratio"), row.get("cpu_demand_cores")
    return wait is not None and wait >= CPU_WAIT_SCAN.value and (demand is None or demand >= MIN_DEMAND)


class ContentionScan:
    """The scans of one collector: ``proc`` its /proc, ``interval_s`` its collect interval (a scan
    older than three is not compared with), ``enabled`` its config's ``scan``; ``count_error`` its
    error counter (processes past MAX_SCAN_PIDS are counted there, not read)."""

    def __init__(self, proc: str, interval_s: float, enabled: bool,
                 count_error: Callable[[str, str], None]) -> None:
        self.proc = proc
        self.interval_s = interval_s
        self.enabled = enabled
        self._count_error = count_error
        self._prev: tuple[float, dict[int, procfs.ProcStat]] | None = None
        self._names: dict[tuple[int, int], tuple[str | None, str | None, str | None]] = {}
        self.last_s: float | None = None  # the last scan's duration (perfd bench ranks)
        self.last_pids = 0

    def scan(self, rows: dict[tuple[str, int], RankHost], pids: Mapping[str, set[int]], t: float) -> None:
        """While some rank waits for a CPU, read every process's CPU time and last CPU each collect;
        with the previous scan, name what ran on each waiting rank's CPUs (in its row: others_ratio,
        own_ratio, others). ``pids``: job -> the pids of its rank processes followed. No wait: no scan
        (and the previous one is dropped, so a later scan never spans a long gap)."""
        waiting = [r for r in rows.values() if waits(r) and r.get("allowed_cpus")]
        if not self.enabled or not waiting:
            self._prev = None
            return
        t0 = time.perf_counter()
        procs, left_out = procfs.scan_processes(L.MAX_SCAN_PIDS, self.proc)
        self.last_s, self.last_pids = time.perf_counter() - t0, len(procs)
        if left_out:
            self._count_error("scan-over-cap", f"{left_out} processes not read")
        prev, self._prev = self._prev, (t, procs)
        if prev is None or t - prev[0] > 3 * self.interval_s or t <= prev[0]:
            return
        dt, before = t - prev[0], prev[1]
        waiting_ids = {id(r) for r in waiting}
        for (job, _), row in rows.items():
            if id(row) not in waiting_ids:
                continue
            allowed = set(row["allowed_cpus"])
            own_roots = pids.get(job, set())
            found = []
            for pid, st in procs.items():
                old = before.get(pid)
                if pid == row["pid"] or old is None or old.start_ticks != st.start_ticks:
                    continue
                used = st.cpu_s - old.cpu_s
                if used <= 0 or st.processor not in allowed:
                    continue
                # A process that may run elsewhere too spent only part of its time here: as much as
                # its allowed CPUs overlap the rank's (it migrates; the kernel keeps no per-CPU time
                # per process).
                aff = procfs.affinity(pid)
                part = len(allowed & set(aff)) / len(aff) if aff else 1.0
                share = min(1.0, used * part / (dt * len(allowed)))
                found.append((share, pid, st, _descends(pid, own_roots, procs)))
            # The kernel's per-CPU accounting bounds what the others took: the CPUs' busy share less
            # the rank's own use of them. Estimates over it are scaled down to it.
            busy = row.get("allowed_busy_ratio")
            mine = min(1.0, (row.get("cpu_cores") or 0.0) / len(allowed))
            total = sum(f[0] for f in found)
            if busy is not None and total > max(0.0, busy - mine) and total > 0:
                k = max(0.0, busy - mine) / total
                found = [(sh * k, pid, st, own) for sh, pid, st, own in found]
            row["others_ratio"] = min(1.0, sum(f[0] for f in found if not f[3]))
            row["own_ratio"] = min(1.0, sum(f[0] for f in found if f[3]))
            top = sorted(found, key=lambda f: (-f[0], f[1]))[:L.RANK_OTHERS_TOP_N]
            row["others"] = [self._named(share, pid, st, own) for share, pid, st, own in top]

    def _named(self, share: float, pid: int, st: procfs.ProcStat, own: bool) -> dict[str, object]:
        key = (pid, st.start_ticks)
        got = self._names.get(key)
        if got is None:
            name, cmd = psutil_lookup(pid)
            got = (name or st.comm, cmd, psutil_user(pid))
            if len(self._names) > 4 * L.MAX_SCAN_PIDS:
                self._names.clear()
            self._names[key] = got
        name, cmd, user = got
        # Another process is named by pid, user and command name only; the job's own (a rank's
        # descendant) keeps its command line, redacted (perfd.core.procinfo.shown_cmdline).
        return {"pid": pid, "name": name, "user": user,
                "cmdline": shown_cmdline(cmd, own, L.MAX_RANK_PAYLOAD_CMDLINE),
                "cpu_ratio": round(share, 4), "cpu": st.processor, "own": own}


def _descends(pid: int, roots: set[int], procs: dict[int, procfs.ProcStat]) -> bool:
    """Whether ``pid`` is a descendant of one of ``roots`` (the job's rank processes: a data loader
    worker is the job's own), by the parent pids of the scan; at most 64 generations up."""
    p = procs.get(pid)
    for _ in range(64):
        if p is None or p.ppid <= 1:
            return False
        if p.ppid in roots:
            return True
        p = procs.get(p.ppid)
    return False
