"""What else used the machine's CPUs while a measured run ran, and what the run left behind when it
exited (issue "the plan an engineer would make", the GPU A/B of tests/gpu/plan_ab_live.py).

On the H200 the long-sequence job's base run stepped at 175-179 ms or at 212-247 ms in runs a minute
apart, whole runs shifted (their 10th percentile too); in two calls the first bases were fast and the
later ones slow, in a third the first was slow already (docs/evidence/plan_h200_v5). A run's
leftovers still running on the job's pinned cores would do that; so would a process of the machine
or a neighbour's load. Each measured run now records which: the processes of its own session still
alive after it exited (then killed, so no run slows the next), and the CPU seconds every other
process used during it, the largest named with the cores it may run on (psutil, in the GPU
machine's image; a process's session from os.getsid).
"""

from __future__ import annotations

import os
from typing import Any

import psutil

TOP = 5  # the other processes named in a run's record, the busiest first
KILL_WAIT_S = 5.0  # how long a killed leftover is waited for (gone, or a zombie its parent has not reaped)
Snapshot = dict[int, tuple[str, int, float]]  # pid -> (name, session, CPU seconds so far)


def _stat(p: psutil.Process) -> tuple[str, int, float] | None:
    """(name, session, CPU seconds) of a live process, None once it is gone or dead (a zombie:
    killed, not yet reaped by its parent)."""
    try:
        with p.oneshot():
            if p.status() == psutil.STATUS_ZOMBIE:
                return None
            t = p.cpu_times()
            return p.name(), os.getsid(p.pid), t.user + t.system
    except (psutil.Error, OSError):
        return None


def stat_of(pid: int) -> tuple[str, int, float] | None:
    try:
        return _stat(psutil.Process(pid))
    except psutil.Error:
        return None


def snapshot() -> Snapshot:
    """Every live process of the machine."""
    return {p.pid: s for p in psutil.process_iter() if (s := _stat(p)) is not None}


def _cores(pid: int) -> str | None:
    try:
        cpus = sorted(psutil.Process(pid).cpu_affinity() or [])
    except (psutil.Error, OSError):
        return None
    if not cpus:
        return None
    return f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1)) else ",".join(map(str, cpus))


def left_behind(session: int, now: Snapshot | None = None) -> list[dict[str, Any]]:
    """The processes of a run's session still alive after its leader exited (``now``: a snapshot
    just taken, else one is), each killed (SIGKILL): the next run must not share its cores with them."""
    found, killed = [], []
    for pid, (name, sid, cpu) in (snapshot() if now is None else now).items():
        if sid == session and pid != os.getpid():
            found.append({"pid": pid, "name": name, "cpu_s": round(cpu, 2), "cores": _cores(pid)})
            try:
                proc = psutil.Process(pid)
                proc.kill()
                killed.append(proc)
            except psutil.Error:
                pass
    # SIGKILL lands when the process next runs: on a loaded machine a snapshot taken at once still saw it
    psutil.wait_procs(killed, timeout=KILL_WAIT_S)
    return found


def others(before: Snapshot, after: Snapshot, session: int, wall_s: float,
           top: int | None = TOP) -> dict[str, Any]:
    """CPU used during a run by the processes outside its session (this one excluded), as cores on
    average over the run, the ``top`` busiest named (None: every one). A process born during the run
    counts from zero; one that ended during it is not seen (its time is lost to this count: say so
    rather than guess)."""
    me = os.getpid()
    used = []
    for pid, (name, sid, cpu) in after.items():
        if sid == session or pid == me:
            continue
        was = before.get(pid)
        d = cpu - (was[2] if was is not None and was[0] == name else 0.0)
        if d > 0:
            used.append((d, pid, name))
    used.sort(reverse=True)
    total = sum(d for d, _, _ in used)
    return {
        "cores": round(total / wall_s, 3) if wall_s > 0 else None,
        "cpu_s": round(total, 2),
        "top": [{"pid": p, "name": n, "cpu_s": round(d, 2), "cores": _cores(p)} for d, p, n in used[:top]],
        "note": "processes that ended during the run are not counted",
    }
