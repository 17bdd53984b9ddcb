"""The ``ranks`` collector: the host state of each rank process of the agent's job(s) on this node.

Which processes: the descendants of a `perfd launch` child that declare a RANK in their environment
(the launch manifest), and the pids the agent hands over from the other collectors (:meth:`note`):
the GPU process lists (collectors/nvml: pid, RANK, PERFD_JOB) and the step hook's records (each
carries its sender's pid and rank). For each, every collect: its state (running, sleeping, disk
sleep, stopped, zombie, gone), CPU use, allowed CPUs and their busy share, the time its threads
waited in a run queue (``/proc/<pid>/task/*/schedstat``: wait ÷ (run + wait) is the direct measure
of CPU contention), its cgroup's CFS throttling (cpu.stat), pressure stall information (the cgroup's
``*.pressure``, the node's /proc/pressure for the root cgroup), OOM kills (memory.events) and major
faults; the node's swap-in rate. While a rank waits for a CPU (thresholds.CPU_WAIT_SCAN) a scan of
every process's CPU time names the processes that ran on its CPUs (pid, user, command, share), the
job's own (a data loader worker: a descendant of a rank) told apart from the others
(collectors/ranks/contention.py).

Whom it follows, and whose process the agent acts on (py-spy stacks take :meth:`RanksCollector.rank_pids`):
each rank process is followed only as the user who vouched for it — the launch child's user for its
descendants, the sender's uid for a step hook's pid (collectors/hook verified it with the kernel's
credentials), the process's own user for a GPU process or a process of a sidecar's own pod — and
only while it runs as that user alone (a setuid descendant is not the job's). ``rank_pids`` checks
again, when asked, that each pid is still the process it was and still that user's: a pid reused by
another user's process is never handed out.

Samples carry the labels job_name and rank only (and node, added by the agent); pids, states and
named processes travel in one ``rank_processes`` event per job and collect (perfd.core.events), never in
labels. Whatever the platform does not provide (no schedstats, no PSI, no cgroup quota) is absent,
never 0. Bounded: perfd.core.limits MAX_RANKS_PER_AGENT, MAX_RANK_THREADS, MAX_SCAN_PIDS, RANK_OTHERS_TOP_N.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from perfd.collectors.collector import Capabilities, Collected, Collector
from perfd.collectors.config_values import as_float
from perfd.collectors.ranks import procfs
from perfd.collectors.ranks.contention import ContentionScan, waits
from perfd.core import limits as L
from perfd.core.catalog import RANK_ALLOWED_CPUS, RANK_HOST_SERIES, RANK_PRESSURE, RANK_STATE_INFO
from perfd.core.events import RANK_PROCESSES, LaunchExit, RankHost
from perfd.core.manifest import STATUS_EXITED, STATUS_RUNNING, load_manifest
from perfd.core.model import Sample
from perfd.core.procinfo import (
    pod_ranks,
    psutil_rank_env,
    read_identity,
    same_process,
)
from perfd.core.shared_thresholds import CPU_THROTTLED_SHARE, PAUSE_WRITES_BPS, STALL_IDLE_CPU_CORES

# Programs that run a rank's command as their child (a profiler, a time limit): a process of these
# names whose child declares its rank is not the rank (perfd ncu-exec execs ncu; nsys launches the
# command under it; coreutils' timeout forks).
WRAPPERS = frozenset({"ncu", "nsys", "nsys-launcher", "timeout", "strace", "ltrace", "perf", "valgrind"})
SOURCES = ("launch", "gpu", "pod", "hook")  # how a rank process became known; the first listed wins
# States worth the event at every collect (a sleeping rank is a GPU job's normal state: it waits on
# the device); the others go out on change, and every event_every_s.
NOTABLE_STATES = frozenset({"stopped", "zombie", "gone", "disk_sleep"})
THREAD_FULL_EVERY = 10  # collects between readings of every thread's schedstat (see _measure)
GONE_KEEP_S = 60.0  # a gone rank is reported this long (the stall and its incident read it), then dropped
DISCOVER_EVERY_S = 5.0  # the launch manifest's process tree is walked this often


@dataclass
class RanksConfig:
    interval_s: float = 1.0
    job: str = ""
    launch_manifest: str | None = None
    scan: bool = True  # name the other processes on a waiting rank's CPUs
    # A job's sidecar in the job's pod (shareProcessNamespace: true): follow the processes of its pid
    # namespace that declare a rank (perfd.core.procinfo.pod_ranks). Their pids are the pod's, as the
    # ranks' own Kineto requests carry them: the sidecar can capture them.
    pod: bool = False
    proc: str = procfs.PROC
    # A job's rank_processes event at least this often when nothing notable changes (every collect
    # while a rank is stopped, gone, in disk sleep, waiting for a CPU or throttled): 0, every collect.
    event_every_s: float = 5.0

    @classmethod
    def from_dict(cls, cfg: Mapping[str, object]) -> RanksConfig:
        known = {"interval_s", "job", "launch_manifest", "scan", "proc", "event_every_s", "pod"}
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"ranks: unknown config key(s) {sorted(unknown)}; known: {sorted(known)}")
        interval = as_float(cfg.get("interval_s", 1.0))
        if interval <= 0:
            raise ValueError(f"ranks: interval_s must be > 0, not {interval}")
        manifest = cfg.get("launch_manifest")
        every = as_float(cfg.get("event_every_s", 5.0))
        if every < 0:
            raise ValueError(f"ranks: event_every_s must be >= 0, not {every}")
        return cls(interval_s=interval, job=str(cfg.get("job") or ""),
                   launch_manifest=str(manifest) if manifest else None, scan=bool(cfg.get("scan", True)),
                   proc=str(cfg.get("proc", procfs.PROC)), event_every_s=every,
                   pod=bool(cfg.get("pod", False)))



_RankMarks = tuple[int, str, bool, bool, bool, bool]  # rank, then _marks: what makes an event due at once

@dataclass
class RankProc:
    """One followed rank process and what the previous collect read of it (for deltas)."""

    job: str
    rank: int
    pid: int
    source: str
    start_ticks: int | None = None
    state: str = "other"
    state_since: float = 0.0
    gone_at: float | None = None
    prev_t: float | None = None
    prev_cpu_s: float | None = None
    prev_faults: int | None = None
    prev_write: int | None = None  # proc(5) io write_bytes
    prev_sched: dict[int, tuple[int, int]] = field(default_factory=dict)
    prev_thr: procfs.Throttling | None = None
    prev_psi: dict[str, int] = field(default_factory=dict)
    prev_psi_source: str | None = None
    cgroup: procfs.CgroupDirs | None = None
    cgroup_text: str | None = None  # /proc/<pid>/cgroup as last read: a moved process is re-resolved
    collects: int = 0
    active_tids: set[int] = field(default_factory=set)  # threads that ran or waited at the last reading
    oom_at_follow: int | None = None  # the cgroup's OOM kill count when the rank was first followed
    uid: int | None = None  # the user it runs as, who vouched for it (see the module docstring)
    prev_children: dict[int, tuple[int, float]] = field(default_factory=dict)  # pid -> (start, cpu_s)


def _delta(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or new < old:  # a counter that went back (a new cgroup): skip
        return None
    return new - old


class RanksCollector(Collector):
    """Per-rank host evidence (see the module docstring)."""

    name = "ranks"

    def __init__(self, config: Mapping[str, object] | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.config = RanksConfig.from_dict(dict(config or {}))
        self.default_interval_s = self.config.interval_s
        self._clock = clock
        self._lock = threading.Lock()  # guards _notes (the agent's thread) against collect's
        self._notes: list[tuple[str, int, int, str, int | None]] = []  # (job, rank, pid, source, uid)
        self.ranks: dict[tuple[str, int], RankProc] = {}
        self._mounts: procfs.Mounts | None = None
        self._prev_cpus: dict[int, tuple[int, int]] | None = None
        self._prev_swap: tuple[float, int] | None = None
        self._discovered_at = float("-inf")
        # cgroup dirs -> its files' readings, this collect only (see _cgroup_files)
        self._cg_cache: dict[tuple[str | None, str | None, str | None, bool], tuple[procfs.Throttling | None,
                                                    tuple[dict[str, int], str] | None, int | None]] = {}
        self.caps: Capabilities | None = None
        self._sent: dict[str, tuple[float, tuple[_RankMarks, ...]]] = {}  # job -> (last event, its marks)
        # job -> its launch's end as the launch manifest says it (status, exit code, when): sent with
        # the job's rank_processes events, so the aggregator knows the job ended without waiting
        self._launch: dict[str, LaunchExit] = {}
        self._launch_sent: set[str] = set()  # jobs whose launch end went out with no rank to report
        self.contention = ContentionScan(self.config.proc, self.config.interval_s, self.config.scan,
                                         self.count_error)

    # ---- what the agent tells it ---------------------------------------------------------------
    def note(self, pid: int, rank: int, source: str, job: str | None = None, uid: int | None = None) -> None:
        """A rank process known to another collector (thread-safe; taken in at the next collect).
        ``uid``: for a step hook's pid, the uid of the sender the kernel named (required)."""
        if source not in SOURCES or pid <= 0 or rank < 0:
            return
        with self._lock:
            if len(self._notes) < 4 * L.MAX_RANKS_PER_AGENT:
                self._notes.append((job or self.config.job, rank, pid, source, uid))

    def rank_pids(self, job: str | None = None) -> dict[int, int]:
        """rank -> pid of the live rank processes followed (of ``job``, else the collector's), each
        checked now to be the process that was followed, running as the user who vouched for it."""
        want = job or self.config.job
        proc = self.config.proc
        return {r.rank: r.pid for (j, _), r in list(self.ranks.items())
                if j == want and r.gone_at is None and same_process(r.pid, r.start_ticks, r.uid, proc)}

    # ---- collector interface -------------------------------------------------------------------
    def probe(self) -> Capabilities:
        if self.caps is not None:
            return self.caps
        proc = self.config.proc
        if not os.path.isdir(f"{proc}/self"):
            self.caps = Capabilities(False, f"no {proc} filesystem (Linux only)")
            return self.caps
        self._mounts = procfs.read_mounts(proc)
        me = os.getpid()
        sched = procfs.read_task_schedstat(me, 4, proc)
        self.caps = Capabilities(True, features={
            "schedstat": sched is not None,
            "psi": os.path.exists(f"{proc}/pressure/cpu"),
            "cgroup_v2": self._mounts.v2 is not None,
            "cgroup_v1_cpu": "cpu" in self._mounts.v1,
        })
        return self.caps

    def collect(self, now: float) -> Collected:
        out = Collected()
        if not self.probe().available:
            return out
        t = self._clock()
        self._take_notes(now)
        if (self.config.launch_manifest or self.config.pod) and t - self._discovered_at >= DISCOVER_EVERY_S:
            self._discovered_at = t
            try:
                if self.config.launch_manifest:
                    self._discover(now)
                if self.config.pod:
                    self._discover_pod(now)
            except Exception as exc:  # a manifest being rewritten, a process tree changing under us
                self.count_error("discover-failed", repr(exc))
        cpus = procfs.read_cpu_times(self.config.proc)
        self._cg_cache = {}
        rows: dict[tuple[str, int], RankHost] = {}
        for key, rp in list(self.ranks.items()):
            try:
                row = self._measure(rp, t, now, cpus)
            except Exception as exc:  # one rank's unreadable file must not cost the others
                self.count_error("measure-failed", repr(exc))
                continue
            if row is None:
                del self.ranks[key]
                continue
            rows[key] = row
        self._prev_cpus = cpus
        try:
            pids: dict[str, set[int]] = {}
            for (job, _), rp in self.ranks.items():
                pids.setdefault(job, set()).add(rp.pid)
            self.contention.scan(rows, pids, t)
        except Exception as exc:
            self.count_error("scan-failed", repr(exc))
        swap = self._swap_rate(t)
        self._emit(rows, swap, now, out)
        return out

    # ---- discovery -----------------------------------------------------------------------------
    def _take_notes(self, now: float) -> None:
        with self._lock:
            notes, self._notes = self._notes, []
        for job, rank, pid, source, uid in notes:
            self._follow(job, rank, pid, source, now, uid)

    def _follow(self, job: str, rank: int, pid: int, source: str, now: float, uid: int | None = None) -> None:
        """Follow ``pid`` as ``job``'s ``rank`` when it runs as ``uid`` alone (a GPU process: as its own
        user alone); a pid named for another user's process is counted, never followed."""
        key = (job, rank)
        held = self.ranks.get(key)
        if held is not None and held.pid == pid:
            if SOURCES.index(source) < SOURCES.index(held.source):
                held.source = source
            return
        alive = held is not None and held.gone_at is None and \
            procfs.read_stat(held.pid, self.config.proc) is not None
        if held is not None and alive and SOURCES.index(source) > SOURCES.index(held.source):
            return  # a live process from a better source keeps the rank
        if held is None and len(self.ranks) >= L.MAX_RANKS_PER_AGENT:
            self.count_error("ranks-over-cap", f"job {job} rank {rank}")
            return
        ident = read_identity(pid, self.config.proc)
        st = procfs.read_stat(pid, self.config.proc)
        if st is None or ident is None:
            return  # already gone: nothing to follow
        # A GPU process and a process of this sidecar's own pod vouch for themselves (the pod is the
        # job's trust boundary: every container of it is the job's), as their own user alone.
        if ident.uid is None or (source not in ("gpu", "pod") and ident.uid != uid):
            self.count_error("not-vouched", f"{source} named pid {pid} for job {job} rank {rank}: it runs as "
                             f"uid(s) {ident.uids}, not as {uid} alone; not followed")
            return
        self.ranks[key] = RankProc(job, rank, pid, source, st.start_ticks, st.state, now, uid=ident.uid)

    def _discover(self, now: float) -> None:
        """The launch manifest's child and its descendants; those declaring RANK are ranks. A job of
        one process declaring none (no launcher) is rank 0, as the step hook numbers it; once
        processes declaring ranks appear (a launcher's workers), that guess goes."""
        path = self.config.launch_manifest
        assert path is not None
        try:
            m = load_manifest(path)
        except ValueError:
            return  # not written yet (the launch starts the job first): next time
        pid = m.get("pid")
        if m.get("status") == STATUS_EXITED:  # the launch ended: its job's end is known at once
            code = m.get("exit_code")
            self._launch[str(m.get("job") or self.config.job)] = {
                "status": STATUS_EXITED, "exit_code": code if isinstance(code, int) else None,
                "ended": m.get("ended") if isinstance(m.get("ended"), (int, float)) else None}
        if not isinstance(pid, int) or m.get("status") != STATUS_RUNNING:
            return
        self._launch.pop(str(m.get("job") or self.config.job), None)
        import psutil

        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        ident = read_identity(pid, self.config.proc)
        owner = ident.uid if ident is not None else None  # the launch's user: its ranks run as it
        job = str(m.get("job") or self.config.job)
        # A rank's own children inherit its RANK (data-loader workers, a multiprocessing manager, compile
        # workers): the rank is the topmost process declaring it, the one whose parent declares another
        # rank or none. Followed otherwise, the last-listed child (an idle manager, seen on Megatron-LM)
        # stood for the rank: "sleeping" while the rank itself was stopped.
        ranks: dict[int, tuple[int, int | None]] = {}  # pid -> (rank, parent pid)
        for p in tree[:L.MAX_RANKS_PER_AGENT * 4]:
            rank = psutil_rank_env(p.pid).get("rank")
            if isinstance(rank, int):
                try:
                    ranks[p.pid] = (rank, p.ppid())
                except psutil.Error:
                    continue
        declared = bool(ranks)
        for child, (rank, parent) in ranks.items():
            if parent is None or parent not in ranks or ranks[parent][0] != rank:
                self._follow(job, rank, self._inside_wrappers(child, rank, ranks), "launch", now, owner)
        held = self.ranks.get((job, 0))
        if not declared and len(tree) == 1:  # one process, no launcher: it is the rank
            self._follow(job, 0, pid, "launch", now, owner)
        elif declared and held is not None and held.pid == pid and held.source == "launch":
            del self.ranks[(job, 0)]  # the launcher taken for the rank before its workers started

    def _inside_wrappers(self, pid: int, rank: int, ranks: dict[int, tuple[int, int | None]]) -> int:
        """The process that runs the rank under ``pid``: past the wrappers (WRAPPERS, by command name)
        whose child declares the same rank. Under ``perfd ncu-prefix`` the topmost process declaring
        RANK is ncu, asleep while its child runs: taken for the rank, it made a start-up read as a
        stall on the H100 ("every rank process idle" while the rank loaded its checkpoint)."""
        seen = {pid}
        while (st := procfs.read_stat(pid, self.config.proc)) is not None and st.comm in WRAPPERS:
            inner = [c for c, (r, parent) in ranks.items() if parent == pid and r == rank and c not in seen]
            if len(inner) != 1:
                break
            pid = inner[0]
            seen.add(pid)
        return pid

    def _discover_pod(self, now: float) -> None:
        """The rank processes of this agent's pod (config ``pod``), each the topmost process declaring
        its rank (as in _discover: a rank's workers inherit its RANK)."""
        ranks = pod_ranks(self.config.job, self.config.proc)
        if ranks is None:  # the host's pid namespace: there is no pod to follow
            self.count_error("pod-is-host", "ranks: pod is set but the agent runs in the host's pid "
                             "namespace (a job's sidecar needs shareProcessNamespace: true in its pod)")
            return
        for pid, (rank, parent) in ranks.items():
            if parent is None or parent not in ranks or ranks[parent][0] != rank:
                self._follow(self.config.job, rank, pid, "pod", now)

    # ---- one rank ------------------------------------------------------------------------------
    def _measure(self, rp: RankProc, t: float, now: float,
                 cpus: dict[int, tuple[int, int]] | None) -> RankHost | None:
        proc = self.config.proc
        st = procfs.read_stat(rp.pid, proc)
        if st is None or (rp.start_ticks is not None and st.start_ticks != rp.start_ticks):
            st = None
        state = st.state if st is not None else "gone"
        if state == "gone" and rp.gone_at is None:
            rp.gone_at = now
        if rp.gone_at is not None and now - rp.gone_at > GONE_KEEP_S:
            return None
        if state != rp.state:
            rp.state, rp.state_since = state, now
        row: RankHost = {"rank": rp.rank, "pid": rp.pid, "source": rp.source, "state": state,
                          "state_since": rp.state_since, "observed_at": now}
        boot = procfs.boot_time(proc)
        if boot is not None and rp.start_ticks is not None:
            # when the process started: one started after the job's last step is a new run starting
            row["started_at"] = boot + rp.start_ticks / procfs.CLOCK_TICKS
        if st is None:
            self._oom(rp, row)  # the kill that ended it shows in its cgroup still
            return row
        dt = t - rp.prev_t if rp.prev_t is not None else None
        row["threads"] = st.num_threads
        d_cpu = _delta(st.cpu_s, rp.prev_cpu_s)
        if dt and d_cpu is not None:
            row["cpu_cores"] = d_cpu / dt
        d_faults = _delta(st.major_faults, rp.prev_faults)
        if dt and d_faults is not None:
            row["major_faults_per_second"] = d_faults / dt
        rp.prev_cpu_s, rp.prev_faults = st.cpu_s, st.major_faults
        written = procfs.read_write_bytes(rp.pid, proc)
        d_write = _delta(written, rp.prev_write)
        if dt and d_write is not None:  # a checkpoint save while the steps wait (the loop's own pause)
            row["write_bytes_per_second"] = d_write / dt
        rp.prev_write = written
        self._children(rp, row, dt)
        # Every thread's schedstat every THREAD_FULL_EVERY collects; between, only the threads that
        # ran or waited at the last reading (and the main one): most of a training process's ~100
        # threads sleep, and each read costs ~30 us (`perfd bench ranks`). A thread that wakes is
        # counted from the next full reading on.
        full = rp.collects % THREAD_FULL_EVERY == 0 or not rp.prev_sched
        rp.collects += 1
        sched = procfs.read_task_schedstat(rp.pid, L.MAX_RANK_THREADS, proc,
                                           None if full else rp.active_tids | {rp.pid})
        if sched is not None:
            threads, left_out = sched
            if left_out:
                self.count_error("threads-over-cap", f"rank {rp.rank}: {left_out} threads not read")
            run = wait = 0
            active = set()
            for tid, (r, w) in threads.items():
                old = rp.prev_sched.get(tid)
                if old is not None and r >= old[0] and w >= old[1]:
                    run, wait = run + r - old[0], wait + w - old[1]
                    if r > old[0] or w > old[1]:
                        active.add(tid)
            if rp.prev_sched and run + wait > 0:
                row["wait_ratio"] = wait / (run + wait)
                if dt:  # how much CPU its threads wanted: a ratio of almost nothing says nothing
                    row["cpu_demand_cores"] = (run + wait) / 1e9 / dt
            # The next reading's deltas are over these threads, read now (a stale value of a thread
            # not read since would stretch its delta over several intervals).
            # (after the very first reading, every thread: the next one has their deltas to give)
            rp.active_tids = active if rp.prev_sched else set(threads)
            rp.prev_sched = threads
        allowed = procfs.affinity(rp.pid)
        if allowed is not None:
            row["allowed_cpus"] = allowed
            busy = self._busy(allowed, cpus)
            if busy is not None:
                row["allowed_busy_ratio"] = busy
        self._cgroup(rp, row, dt)
        rp.prev_t = t
        return row

    def _children(self, rp: RankProc, row: RankHost, dt: float | None) -> None:
        """The CPU the rank's descendants used (its data-loader workers: the job's own work, shown as
        the job's, never as other processes on its CPUs); a child that came or went within the
        interval counts from its first reading on."""
        kids = procfs.descendants(rp.pid, L.RANK_CHILDREN_MAX, self.config.proc)
        if kids is None:
            return
        now: dict[int, tuple[int, float]] = {}
        used = 0.0
        for pid in kids:
            st = procfs.read_stat(pid, self.config.proc)
            if st is None:
                continue
            now[pid] = (st.start_ticks, st.cpu_s)
            old = rp.prev_children.get(pid)
            if old is not None and old[0] == st.start_ticks:
                used += max(0.0, st.cpu_s - old[1])
        row["children"] = len(now)
        if dt:
            row["children_cpu_cores"] = used / dt
        rp.prev_children = now

    def _busy(self, allowed: list[int], cpus: dict[int, tuple[int, int]] | None) -> float | None:
        prev = self._prev_cpus
        if cpus is None or prev is None:
            return None
        busy = total = 0
        for c in allowed:
            a, b = prev.get(c), cpus.get(c)
            if a is None or b is None or b[1] < a[1] or b[0] < a[0]:
                continue
            busy, total = busy + b[0] - a[0], total + b[1] - a[1]
        return min(1.0, busy / total) if total > 0 else None

    def _cgroup(self, rp: RankProc, row: RankHost, dt: float | None) -> None:
        text = procfs.read_text(f"{self.config.proc}/{rp.pid}/cgroup")
        if text is not None and text != rp.cgroup_text:  # first read, or moved (a pod's resize, a test)
            if rp.cgroup_text is not None:
                rp.oom_at_follow = None
            rp.cgroup_text = text
            rp.cgroup = procfs.cgroup_dirs(rp.pid, self._mounts or procfs.Mounts(), self.config.proc)
            rp.prev_thr, rp.prev_psi, rp.prev_psi_source = None, {}, None  # another cgroup's counters
        d = rp.cgroup
        if d is None:
            return
        row["cgroup"] = d.path
        thr, psi, _oom = self._cgroup_files(d)
        if thr is not None:
            if thr.quota_cores is not None:
                row["cpu_quota_cores"] = thr.quota_cores
            old = rp.prev_thr
            if old is not None and thr.periods > old.periods and thr.throttled >= old.throttled:
                row["throttled_ratio"] = (thr.throttled - old.throttled) / (thr.periods - old.periods)
                row["throttled_s"] = max(0.0, thr.throttled_s - old.throttled_s)
            rp.prev_thr = thr
        if psi is not None:
            totals, source = psi
            if dt and rp.prev_psi_source == source:
                shares = {}
                for res, total in totals.items():
                    dv = _delta(total, rp.prev_psi.get(res))
                    if dv is not None:
                        shares[res] = min(1.0, dv / 1e6 / dt)
                if shares:
                    row["pressure"], row["pressure_source"] = shares, source
            rp.prev_psi, rp.prev_psi_source = totals, source
        self._oom(rp, row)

    def _cgroup_files(self, d: procfs.CgroupDirs) -> tuple[procfs.Throttling | None,
                                                             tuple[dict[str, int], str] | None, int | None]:
        """A cgroup's throttling, pressure and OOM kills, read once per collect however many ranks
        share it (a job's ranks usually do: its pod or its SLURM step)."""
        key = (d.v2, d.v1_cpu, d.v1_memory, d.is_root)
        got = self._cg_cache.get(key)
        if got is None:
            got = self._cg_cache[key] = (procfs.read_throttling(d), procfs.read_pressure(d, self.config.proc),
                                         procfs.read_oom_kills(d))
        return got

    def _oom(self, rp: RankProc, row: RankHost) -> None:
        oom = self._cgroup_files(rp.cgroup)[2] if rp.cgroup is not None else None
        if oom is None:
            return
        if rp.oom_at_follow is None:
            rp.oom_at_follow = oom
        row["oom_kills"] = oom
        row["oom_kills_since_follow"] = oom - rp.oom_at_follow

    def _swap_rate(self, t: float) -> float | None:
        pages = procfs.read_swap_in_pages(self.config.proc)
        if pages is None:
            return None
        prev, self._prev_swap = self._prev_swap, (t, pages)
        if prev is None or t <= prev[0] or pages < prev[1]:
            return None
        return (pages - prev[1]) * procfs.PAGE_SIZE / (t - prev[0])

    # ---- output --------------------------------------------------------------------------------
    def _emit(self, rows: dict[tuple[str, int], RankHost], swap: float | None, now: float,
              out: Collected) -> None:
        def emit(name: str, value: float, labels: dict[str, str]) -> None:
            out.samples.append(Sample(name=name, value=float(value), time=now, labels=labels))

        if swap is not None and rows:  # the ranks' memory-pressure context: none without a rank followed
            emit("perfd_host_swap_in_bytes_per_second", swap, {})
        by_job: dict[str, list[RankHost]] = {}
        for (job, rank), row in sorted(rows.items()):
            by_job.setdefault(job, []).append(row)
            lab = {"job_name": job, "rank": str(rank)} if job else {"rank": str(rank)}
            emit(RANK_STATE_INFO, 1.0, {**lab, "process_state": row["state"]})
            for name, key in RANK_HOST_SERIES.items():
                value = row.get(key)
                if isinstance(value, int | float):  # every series of RANK_HOST_SERIES is a number
                    emit(name, value, lab)
            if row.get("allowed_cpus") is not None:
                emit(RANK_ALLOWED_CPUS, len(row["allowed_cpus"]), lab)
            for res, share in (row.get("pressure") or {}).items():
                emit(RANK_PRESSURE, share, {**lab, "resource": res})
        for job, ranks in by_job.items():
            # The event every collect while something is worth it (a rank's marks changed, or any rank
            # waits, is throttled, writes to disk or is not running); else every
            # EVENT_EVERY_S: a quiet node's ranks cost the aggregator one decode every few seconds.
            marks = tuple((r["rank"], *_marks(r)) for r in ranks)
            busy = any(m[1] in NOTABLE_STATES or any(m[3:]) for m in marks)
            last = self._sent.get(job)
            every = self.config.event_every_s
            if not busy and last is not None and last[1] == marks and now - last[0] < every:
                continue
            self._sent[job] = (now, marks)
            states = sorted({r["state"] for r in ranks})
            payload: dict[str, object] = {"job": job, "interval_s": self.config.interval_s, "ranks": ranks,
                       "node": {"swap_in_bytes_per_second": swap} if swap is not None else {}}
            if job in self._launch:
                payload["launch"] = dict(self._launch[job])
            out.events.append({
                "kind": RANK_PROCESSES.name, "severity": "info", "time": now, "job": job,
                "text": f"{len(ranks)} rank process(es) of job {job}: {', '.join(states)}",
                "labels": {"job": job}, "payload": payload,
            })
        for job, launch in self._launch.items():  # ended with no rank left to report: said once
            if job in by_job or job in self._launch_sent:
                continue
            self._launch_sent.add(job)
            out.events.append({
                "kind": RANK_PROCESSES.name, "severity": "info", "time": now, "job": job,
                "text": f"the launch of job {job} exited (code {launch.get('exit_code')})",
                "labels": {"job": job},
                "payload": {"job": job, "interval_s": self.config.interval_s, "ranks": [], "node": {},
                            "launch": dict(launch)},
            })


def _marks(row: RankHost) -> tuple[str, bool, bool, bool, bool]:
    """What changes the aggregator must hear of at once: the state, idle (no CPU: a stall's
    corroboration), waiting for a CPU, throttled, writing to disk (a checkpoint save: the aggregator
    tells the loop's own pauses by it, and one lasts seconds)."""
    cpu, thr, wr = row.get("cpu_cores"), row.get("throttled_ratio"), row.get("write_bytes_per_second")
    # Running and sleeping alternate many times a second in a working rank: a flip between them is no
    # change worth an event (the event still carries the exact state).
    state = str(row.get("state"))
    idle = cpu is not None and cpu < STALL_IDLE_CPU_CORES.value
    return (state if state in NOTABLE_STATES else "live", idle, waits(row),
            thr is not None and thr >= CPU_THROTTLED_SHARE.value,
            wr is not None and wr >= PAUSE_WRITES_BPS.value)
