"""tests/gpu/host_procs.py, the GPU A/B's record of what else ran beside each measured run: a run's
leftovers are found and killed, a busy process outside the run is counted and named."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.gpu import host_procs
from tests.procs import wait_for

pytestmark = pytest.mark.slow

BUSY = "import sys, time\nwhile time.process_time() < 0.5: pass\nsys.stdin.read()"  # 0.5 s of CPU, then idle


def test_a_runs_leftovers_are_named_and_killed_and_a_busy_neighbour_is_counted() -> None:
    before = host_procs.snapshot()
    neighbour = subprocess.Popen([sys.executable, "-c", BUSY], stdin=subprocess.PIPE, start_new_session=True)
    run = subprocess.Popen(["bash", "-c", "sleep 300 & exit 0"], start_new_session=True)
    try:
        run.wait(timeout=30)
        # bash forks its background child, which is named bash until it has exec'd sleep: the leader's
        # exit does not wait for that (a loaded run once read the leftover as "bash")
        wait_for(lambda: [n for n, sid, _ in host_procs.snapshot().values() if sid == run.pid] == ["sleep"],
                 30, "the run's leftover exec'd sleep")
        deadline = time.monotonic() + 60
        while ((s := host_procs.stat_of(neighbour.pid)) is None or s[2] < 0.4) \
                and time.monotonic() < deadline:
            time.sleep(0.05)  # its half second of CPU (/proc counts in ticks: 0.49 s of it)
        after = host_procs.snapshot()
        # every process named: on a loaded machine (the suite's other workers) five others may each
        # have used more than the neighbour's half second
        others = host_procs.others(before, after, run.pid, wall_s=1.0, top=None)
        left = host_procs.left_behind(run.pid)
        assert [x["name"] for x in left] == ["sleep"]
        assert host_procs.left_behind(run.pid) == []  # killed: nothing of the run's session is left
        mine = [x for x in others["top"] if x["pid"] == neighbour.pid]
        assert mine and mine[0]["cpu_s"] >= 0.4 and others["cpu_s"] >= 0.4
        # the run's own are not "others" (by pid: the suite's other tests may run a sleep of their own)
        assert not {x["pid"] for x in left} & {x["pid"] for x in others["top"]}
    finally:
        neighbour.kill()
        neighbour.wait()
