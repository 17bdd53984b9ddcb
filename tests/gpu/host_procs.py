"""What else used the machine's CPUs while a measured run ran, and what the run left behind when it
exited (issue "the plan an engineer would make", the GPU A/B of tests/gpu/plan_ab_live.py).

On the H200 the long-sequence job's base run stepped at 175-179 ms or at 212-247 ms in runs a minute
apart, whole runs shifted (their 10th percentile too), and the first runs of a call were the fast ones
more often than later ones (docs/evidence/plan_h200_v5). A run's leftovers still running on the job's
pinned cores would do that; so would a process of the machine or a neighbour's load. Each measured run
now records which: the processes of its own session still alive after it exited (then killed, so no
run slows the next), and the CPU seconds every other process used during it, the largest named with
the cores it may run on. Read from /proc by hand: psutil is not in the GPU machine's image and this
is a dozen lines of it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
TOP = 5  # the other processes named in a run's record, the busiest first


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(name, session, CPU seconds) of a live process, None once it is gone or dead (a zombie: killed,
    not yet reaped by its parent)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, rest = raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split()
    # after the name: state ppid pgrp session ... utime (11) stime (12), in clock ticks
    if rest[0] in ("Z", "X"):
        return None
    return name, int(rest[3]), (int(rest[11]) + int(rest[12])) / TICK


def snapshot() -> dict[int, tuple[str, int, float]]:
    """Every live process of the machine: pid -> (name, session, CPU seconds so far)."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (s := _stat(int(d.name))) is not None:
            out[int(d.name)] = s
    return out


def _cores(pid: int) -> str | None:
    try:
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError:
        return None
    return f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1)) else ",".join(map(str, cpus))


def left_behind(session: int) -> list[dict[str, Any]]:
    """The processes of a run's session still alive after its leader exited, each killed (SIGKILL):
    the next run must not share its cores with them."""
    found = []
    for pid, (name, sid, cpu) in snapshot().items():
        if sid == session and pid != os.getpid():
            found.append({"pid": pid, "name": name, "cpu_s": round(cpu, 2), "cores": _cores(pid)})
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return found


def others(before: dict[int, tuple[str, int, float]], after: dict[int, tuple[str, int, float]],
           session: int, wall_s: float) -> dict[str, Any]:
    """CPU used during a run by the processes outside its session (this one excluded), as cores on
    average over the run, the busiest named. A process born during the run counts from zero; one that
    ended during it is not seen (its time is lost to this count: say so rather than guess)."""
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
        "top": [{"pid": p, "name": n, "cpu_s": round(d, 2), "cores": _cores(p)} for d, p, n in used[:TOP]],
        "note": "processes that ended during the run are not counted",
    }
