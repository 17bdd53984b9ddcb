"""collectors/ranks on real processes: states (running, sleeping, stopped, gone), CPU use, the
run-queue wait of a rank with burners on its CPU and the burners named, the job's own children told
apart, the launch manifest's process tree, the cgroup and PSI files of this machine, and what is
absent (never 0) before two readings exist."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.collectors.ranks import RanksCollector, procfs
from perfd.core import limits as L
from perfd.core.events import RANK_PROCESSES
from tests.procs import BUSY_LOAD_PER_CPU, load_per_cpu, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

SPIN = "import os, sys\nif len(sys.argv) > 1: os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"
SLEEP = "import time\nwhile True: time.sleep(1)\n"


@pytest.fixture
def spawn() -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        # Its own process group: what it forks or starts goes with it at the end.
        p = subprocess.Popen([sys.executable, "-c", code, *args], env={**os.environ, **(env or {})},
                             start_new_session=True)
        procs.append(p)
        return p

    yield start
    import psutil

    for p in procs:
        # coreutils' timeout moves itself and its command into a process group of their own (and
        # any descendant may): the whole tree goes, then the group (no leftovers)
        try:
            tree = psutil.Process(p.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        for child in tree:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        p.wait(timeout=10)


def _collect(c: RanksCollector, n: int = 1, every: float = 0.5) -> list[dict[str, Any]]:
    """The rows of the last of ``n`` collects ``every`` seconds apart."""
    out = None
    for i in range(n):
        if i:
            time.sleep(every)
        out = c.collect(time.time())
    assert out is not None
    evs = [e for e in out.events if e["kind"] == RANK_PROCESSES.name]
    return list(evs[0]["payload"]["ranks"]) if evs else []


def _wait_state(pid: int, *letters: str, timeout: float = 20.0) -> None:
    """Until /proc/<pid>/stat's state letter is one of ``letters``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in letters:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} not in state {letters} within {timeout} s")


def _row(rows: list[dict[str, Any]], rank: int) -> dict[str, Any]:
    return next(r for r in rows if r["rank"] == rank)


@pytest.mark.slow
def test_states_cpu_and_absent_before_two_readings(spawn: Any) -> None:
    busy, idle = spawn(SPIN), spawn(SLEEP)
    time.sleep(1.0)  # past the interpreters' start-up (its CPU is not the sleeper's steady use)
    c = RanksCollector({"job": "j", "event_every_s": 0})
    c.note(busy.pid, 0, "hook", uid=os.getuid())
    c.note(idle.pid, 1, "gpu")
    first = _collect(c)
    for r in first:  # one reading: no delta yet, so no rate — absent, never 0
        assert "cpu_cores" not in r and "wait_ratio" not in r
    # A spinning process and a sleeping one. A loaded machine may give the spinner no CPU for a whole
    # window (two test suites on 2 CPUs did), or little more than the sleeper's wake-ups (0.057 against
    # 0.014 cores, a suite of 8 workers on 2 CPUs): read windows until the spinner ran in one. The
    # sleeper wakes each second; the state is what /proc says at the read, and a loaded machine once
    # read it runnable (waiting for a CPU after its wake-up, a fresh clone's CI): until read asleep too.
    for _ in range(20):
        rows = _collect(c, 2, 0.7)
        b, i = _row(rows, 0), _row(rows, 1)
        if b["cpu_cores"] > 0.02 and b["cpu_cores"] > 5 * i["cpu_cores"] and i["state"] == "sleeping":
            break
    assert b["state"] in ("running", "sleeping") and b["pid"] == busy.pid and b["source"] == "hook"
    assert i["state"] == "sleeping" and i["cpu_cores"] < 0.05
    assert b["cpu_cores"] > 0.02 and b["cpu_cores"] > 5 * i["cpu_cores"]
    assert b["allowed_cpus"] == sorted(os.sched_getaffinity(busy.pid))
    os.kill(busy.pid, signal.SIGSTOP)
    t_stop = time.time()
    # The stop takes effect when the process next runs: on a loaded machine that can be a second on.
    for _ in range(20):
        b = _row(_collect(c, 2, 0.5), 0)
        if b["state"] == "stopped" and b["cpu_cores"] < 0.02:
            break
    assert b["state"] == "stopped" and b["cpu_cores"] < 0.02
    assert t_stop - 0.1 <= b["state_since"] <= time.time()
    idle.kill()
    idle.wait(timeout=10)
    assert _row(_collect(c), 1)["state"] == "gone"
    out = c.collect(time.time())
    names = {(s.name, s.labels.get("process_state")) for s in out.samples}
    assert {("perfd_host_rank_state_info", "stopped"), ("perfd_host_rank_state_info", "gone")} <= names
    assert all(s.labels.get("job_name") == "j" for s in out.samples if s.name.startswith("perfd_host_rank_"))
    assert c.rank_pids() == {0: busy.pid}  # a gone rank is reported, not offered for stacks


def _pinned(p: subprocess.Popen[bytes], cpu: int) -> subprocess.Popen[bytes]:
    wait_for(lambda: os.sched_getaffinity(p.pid) == {cpu}, 60, f"spinner {p.pid} pinned to CPU {cpu}")
    return p


@pytest.mark.slow
def test_burners_on_the_ranks_cpu_show_as_wait_and_are_named(spawn: Any) -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    rank = spawn(SPIN, str(cpu))
    # Each spinner pins itself once its interpreter is up: under the full suite's load (8 workers, 2
    # cores) the rank was once still unpinned at the scans (allowed CPUs [0, 1]). The scans are what
    # is tested, not the spinners' start: each is pinned before they run.
    _pinned(rank, cpu)
    c = RanksCollector({"job": "j", "event_every_s": 0})
    c.note(rank.pid, 0, "hook", uid=os.getuid())
    _collect(c)
    burners = {_pinned(spawn(SPIN, str(cpu)), cpu).pid for _ in range(2)}
    # Scans run while the rank waits: the first sets the baseline, the next names who ran.
    rows = _collect(c, 4, 0.7)
    r = _row(rows, 0)
    assert r["allowed_cpus"] == [cpu] and r["allowed_busy_ratio"] > 0.9
    assert r["wait_ratio"] >= 0.4  # three spinners on one CPU: the rank runs a third of the time at best
    named = {o["pid"]: o for o in r["others"]}
    assert burners <= set(named), r["others"]
    for pid in burners:
        assert named[pid]["own"] is False and named[pid]["cpu"] == cpu and named[pid]["cpu_ratio"] > 0.02
        # Not the job's: named by pid, user and command name, never with its arguments.
        assert named[pid]["user"] and named[pid]["name"] and named[pid]["cmdline"] is None
    assert r["others_ratio"] >= sum(named[p]["cpu_ratio"] for p in burners) - 0.01
    # Bounded by the kernel's per-CPU accounting: what others took is at most the busy share less the
    # rank's own use of the CPU.
    assert r["others_ratio"] + r["own_ratio"] <= r["allowed_busy_ratio"] - r["cpu_cores"] + 0.01
    shares = [o["cpu_ratio"] for o in r["others"]]
    assert shares == sorted(shares, reverse=True)
    assert len(r["others"]) <= L.RANK_OTHERS_TOP_N
    assert c.contention.last_pids > 0 and c.contention.last_s is not None


@pytest.mark.slow
def test_the_jobs_own_children_are_told_apart(spawn: Any) -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    # A "rank" that forks a spinning "data loader worker" pinned with it.
    code = ("import os, sys\ncpu = int(sys.argv[1]); os.sched_setaffinity(0, {cpu})\n"
            "if os.fork() == 0:\n    while True: pass\nwhile True: pass\n")
    rank = spawn(code, str(cpu))
    c = RanksCollector({"job": "j", "event_every_s": 0})
    c.note(rank.pid, 0, "hook", uid=os.getuid())
    # The scan names what ran on a waiting rank's CPUs between two collects that both saw it wait:
    # on a loaded machine some collects come late or read a short wait, and under two suites at once
    # the worker's share can fall below the top N others named, or read small over a short window (a
    # fresh clone's CI named it at 1.4%); so collect until a scan names it with a share of its CPU.
    r: dict[str, Any] = {}

    def named(row: dict[str, Any]) -> bool:
        return any(o["own"] and o["cpu_ratio"] > 0.02 for o in row.get("others", []))

    for _ in range(30):
        r = _row(_collect(c, 2, 0.7), 0)
        if named(r):
            break
    if not named(r) and (load := load_per_cpu()) >= BUSY_LOAD_PER_CPU:
        pytest.skip(f"load average {load:.1f} per CPU: the worker never ranked among the top "
                    f"{L.RANK_OTHERS_TOP_N} processes on its CPU with a share over 2% in 30 scans")
    assert named(r), r.get("others")  # the worker is named, as the job's own
    assert r["own_ratio"] > 0.02
    # It does not count as another process's contention: others_ratio is the foreign ones' alone,
    # the named top N and what else ran, never the worker's share.
    foreign = sum(o["cpu_ratio"] for o in r["others"] if not o["own"])
    assert foreign - 0.01 <= r["others_ratio"] and r["others_ratio"] + r["own_ratio"] <= 1.01
    if load_per_cpu() < BUSY_LOAD_PER_CPU:
        # What else ran (beyond the named top N) is small here; with two suites at once it is not
        # (0.69 against 0.50 named, seen).
        assert r["others_ratio"] == pytest.approx(foreign, abs=0.01 * L.RANK_OTHERS_TOP_N + 0.05)


def test_the_launch_manifests_tree_gives_the_ranks(spawn: Any, tmp_path: Path) -> None:
    import psutil

    from perfd.core.manifest import MANIFEST_VERSION

    # A launcher-like parent whose child declares RANK=3 (as torchrun's workers do); the worker starts
    # a helper of its own (a data-loader worker, a multiprocessing manager), which inherits RANK=3.
    worker = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
              "while True: time.sleep(1)\n")
    parent = spawn("import os, subprocess, sys, time\n"
                   f"subprocess.Popen([sys.executable, '-c', {worker!r}],"
                   " env={**os.environ, 'RANK': '3', 'LOCAL_RANK': '1', 'WORLD_SIZE': '4'})\n"
                   "while True: time.sleep(1)\n")
    manifest = tmp_path / "launch.json"
    manifest.write_text(json.dumps({"version": MANIFEST_VERSION, "job": "launched", "status": "running",
                                    "pid": parent.pid, "collectors": {}}))
    c = RanksCollector({"job": "launched", "launch_manifest": str(manifest), "event_every_s": 0})

    def ranks() -> dict[int, int]:
        c._discovered_at = float("-inf")  # walk the tree at this collect
        _collect(c)
        return c.rank_pids("launched")

    def tree() -> list[Any]:
        return psutil.Process(parent.pid).children(recursive=True)

    deadline = time.monotonic() + 20
    while (3 not in ranks() or len(tree()) < 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    ranks()  # the whole tree (worker and helper) walked at least once
    (top,) = psutil.Process(parent.pid).children()
    assert len(tree()) == 2  # the worker and its helper, both declaring RANK=3
    got = c.rank_pids("launched")
    assert got == {3: top.pid}  # the worker, not the launcher nor the worker's helper
    assert c.ranks[("launched", 3)].source == "launch"


def test_a_wrapper_declaring_the_rank_is_not_the_rank(spawn: Any, tmp_path: Path) -> None:
    """Under ``perfd ncu-prefix`` the topmost process declaring RANK is ncu, asleep while its child
    runs the rank (on the H100 it made a resumed job's start-up read as "every rank process idle").
    Here coreutils' ``timeout`` stands between the launcher and the worker, both declaring RANK=2: the
    rank is the worker, and the sleeping wrapper is not followed, nor the worker's own child."""
    import psutil

    from perfd.core.manifest import MANIFEST_VERSION

    worker = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
              "while True: time.sleep(1)\n")
    parent = spawn("import os, subprocess, sys, time\n"
                   f"subprocess.Popen(['timeout', '3600', sys.executable, '-c', {worker!r}],"
                   " env={**os.environ, 'RANK': '2', 'WORLD_SIZE': '4'})\n"
                   "while True: time.sleep(1)\n")
    manifest = tmp_path / "launch.json"
    manifest.write_text(json.dumps({"version": MANIFEST_VERSION, "job": "wrapped", "status": "running",
                                    "pid": parent.pid, "collectors": {}}))
    c = RanksCollector({"job": "wrapped", "launch_manifest": str(manifest), "event_every_s": 0})

    def tree() -> list[Any]:
        return psutil.Process(parent.pid).children(recursive=True)

    deadline = time.monotonic() + 20
    while len(tree()) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    c._discovered_at = float("-inf")
    rows = _collect(c)
    (wrapper,) = psutil.Process(parent.pid).children()
    assert wrapper.name() == "timeout"
    (inner,) = wrapper.children()
    assert c.rank_pids("wrapped") == {2: inner.pid}
    # the row says when the rank's process started (a new run is told from a stall by it)
    row = _row(rows, 2)
    # The start's ticks since boot as proc(5) gives them (field 22), on the boot time the collector
    # read once (psutil's, read now, moves with any step of the wall clock since)
    stat_fields = Path(f"/proc/{inner.pid}/stat").read_text().rpartition(")")[2].split()
    since_boot = int(stat_fields[19]) / os.sysconf("SC_CLK_TCK")
    boot = procfs.boot_time()
    assert boot is not None and row["started_at"] == pytest.approx(boot + since_boot, abs=0.05)


def test_a_manifest_job_without_rank_variables_is_rank_0(spawn: Any, tmp_path: Path) -> None:
    from perfd.core.manifest import MANIFEST_VERSION

    one = spawn(SLEEP)
    manifest = tmp_path / "launch.json"
    manifest.write_text(json.dumps({"version": MANIFEST_VERSION, "job": "single", "status": "running",
                                    "pid": one.pid, "collectors": {}}))
    c = RanksCollector({"job": "single", "launch_manifest": str(manifest), "event_every_s": 0})
    _collect(c)
    assert c.rank_pids("single") == {0: one.pid}


def test_cgroup_pressure_and_oom_files_of_this_machine() -> None:
    mounts = procfs.read_mounts()
    d = procfs.cgroup_dirs(os.getpid(), mounts)
    assert d is not None and d.path.startswith("/")
    text = procfs.read_text("/proc/self/cgroup") or ""
    assert d.path in text  # the path /proc/self/cgroup names (v2's, else the cpu controller's)
    psi = procfs.read_pressure(d)
    if not os.path.exists("/proc/pressure/cpu"):
        assert psi is None or psi[1] == "cgroup"
    else:
        assert psi is not None and set(psi[0]) <= {"cpu", "memory", "io"} and psi[0]["cpu"] >= 0
    kills = procfs.read_oom_kills(d)
    assert kills is None or kills >= 0


def test_parsers_take_the_kernels_formats() -> None:
    # This process's own stat line, its command name swapped for one with spaces and parentheses: the
    # fields are read after the last ')', and match what the kernel and psutil say of this process.
    import psutil

    real = procfs.read_text(f"/proc/{os.getpid()}/stat") or ""
    odd = real[:real.index("(") + 1] + "a (b) c" + real[real.rindex(")"):]
    st, mine = procfs.parse_stat(os.getpid(), odd), procfs.read_stat(os.getpid())
    assert st is not None and mine is not None and st.comm == "a (b) c"
    assert (st.state, st.ppid, st.num_threads, st.start_ticks) == \
        (mine.state, os.getppid(), mine.num_threads, mine.start_ticks)
    me = psutil.Process()
    assert st.num_threads == me.num_threads() and st.cpu_s <= sum(me.cpu_times()[:2]) + 0.02
    assert st.processor in os.sched_getaffinity(0)
    assert procfs.parse_stat(1, "garbage") is None
    assert procfs.parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n"
                            "full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n") == {"some": 42, "full": 7}
    m = procfs.Mounts.parse(
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    assert m.v2 == "/sys/fs/cgroup/unified" and m.v1 == {"cpu": "/sys/fs/cgroup/cpu",
                                                          "memory": "/sys/fs/cgroup/memory"}


@pytest.mark.slow
def test_a_cpu_quota_shows_as_throttling(spawn: Any) -> None:
    from tests.host.cgroups import cpu_quota_cgroup

    try:
        quota = cpu_quota_cgroup(f"perfd-unit-{os.getpid()}", cores=0.1)
    except OSError as exc:
        pytest.skip(f"no cgroup CPU quota can be set here: {exc}")
    with quota:
        busy = spawn(SPIN)
        quota.add(busy.pid)
        c = RanksCollector({"job": "j", "event_every_s": 0})
        c.note(busy.pid, 0, "hook", uid=os.getuid())
        # A spinning process at 0.1 CPU is throttled in most periods; in fewer where the machine's load
        # keeps it from even its quota (two suites on 2 CPUs: 0.5): read windows until one shows it.
        r: dict[str, Any] = {}
        for _ in range(10):
            r = _row(_collect(c, 3, 0.7), 0)
            if (r.get("throttled_ratio") or 0.0) > 0.5:
                break
        assert r["cpu_quota_cores"] == pytest.approx(0.1)
        assert r["throttled_ratio"] > 0.2
        assert r["cpu_cores"] < 0.2
        quota.remove(busy.pid)


def test_caps_and_bad_notes_are_counted_not_followed(spawn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(L, "MAX_RANKS_PER_AGENT", 1)
    a, b = spawn(SLEEP), spawn(SLEEP)
    c = RanksCollector({"job": "j", "event_every_s": 0})
    c.note(a.pid, 0, "hook", uid=os.getuid())
    c.note(b.pid, 1, "hook", uid=os.getuid())
    c.note(b.pid, -1, "hook", uid=os.getuid())  # no rank: ignored
    c.note(b.pid, 2, "somewhere")  # not a known source: ignored
    _collect(c)
    assert list(c.ranks) == [("j", 0)] and c.errors.get("ranks-over-cap") == 1
    with pytest.raises(ValueError, match="unknown config key"):
        RanksCollector({"bogus": 1})


def test_sample_yaml_is_a_valid_config() -> None:
    import yaml

    cfg = yaml.safe_load((Path(__file__).parents[1] / "sample.yaml").read_text())
    c = RanksCollector({**cfg, "job": "j"})
    assert c.config.interval_s == 1.0 and c.config.scan is True and c.config.launch_manifest is None


@pytest.mark.slow
def test_the_event_goes_out_on_change_and_every_few_seconds_otherwise(spawn: Any) -> None:
    quiet = spawn(SLEEP)
    time.sleep(1.0)  # past its start-up
    c = RanksCollector({"job": "j", "event_every_s": 30})
    c.note(quiet.pid, 0, "hook", uid=os.getuid())

    def events() -> int:
        return len([e for e in c.collect(time.time()).events if e["kind"] == RANK_PROCESSES.name])

    assert events() == 1  # the first reading
    time.sleep(1.0)  # CPU time comes in 10 ms ticks: a second's window reads a sleeper as idle
    assert events() == 1  # now with rates: the rank turned idle (a change)
    # Nothing changed: no event before event_every_s. On a loaded machine even a sleeper waits for a
    # CPU at times (a change worth the event): of a few collects, some are quiet.
    counts = []
    for _ in range(5):
        time.sleep(1.0)
        counts.append(events())
    assert 0 in counts, counts
    os.kill(quiet.pid, signal.SIGSTOP)
    _wait_state(quiet.pid, "T")  # the stop takes effect when the process next runs (late under load)

    def after(s: float) -> int:
        time.sleep(s)
        return events()

    assert [after(0.3) for _ in range(3)] == [1, 1, 1]  # stopped: every collect while it lasts
    os.kill(quiet.pid, signal.SIGCONT)
    _wait_state(quiet.pid, "S", "R")
    assert events() == 1  # back to sleeping: a change
    out = c.collect(time.time())
    assert out.samples  # the series go out every collect all the same


# A rank that saves when told: each line on its stdin writes a fresh 128 MiB file, synced, then "done"
# (fresh pages: each is dirtied once, which is when the kernel counts it in /proc/<pid>/io write_bytes).
WRITER = ("import os, sys\nd = sys.argv[1]\nblock = b'x' * (1 << 20)\nprint('in', flush=True)\n"
          "for n, _ in enumerate(sys.stdin):\n    path = os.path.join(d, f'ckpt{n}.bin')\n"
          "    with open(path, 'wb') as f:\n        for _ in range(128):\n            f.write(block)\n"
          "        f.flush(); os.fsync(f.fileno())\n    os.unlink(path)\n    print('done', flush=True)\n")
SAVE_BYTES = 128 << 20


@pytest.mark.slow
def test_a_rank_writing_to_disk_is_reported_at_every_collect(spawn: Any, tmp_path: Path) -> None:
    """A rank saving (a checkpoint between its steps) shows its disk writes, and the event goes out at
    every collect while it writes: the aggregator tells the loop's own pause at a cadence by it. The
    saves are made between two collects on request (not left to run beside them), so what a collect
    sees does not depend on how the machine schedules the writer; and a second passes between two
    collects on the collector's clock (injected), so the rate it reads is the save's bytes a second
    whatever the disk's speed: 128 MiB/s, past the threshold, the quiet rank's none."""
    quiet = spawn(SLEEP)
    clock = [0.0]
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline().strip() == "in"
        c = RanksCollector({"job": "j", "event_every_s": 30}, clock=lambda: clock[0])
        c.note(quiet.pid, 0, "hook", uid=os.getuid())
        c.note(writer.pid, 1, "hook", uid=os.getuid())
        c.collect(time.time())  # the first reading: no rates yet

        def saved_then_collected() -> tuple[int, list[dict[str, Any]]]:
            writer.stdin.write("save\n")  # type: ignore[union-attr]
            writer.stdin.flush()  # type: ignore[union-attr]
            assert writer.stdout.readline().strip() == "done"  # type: ignore[union-attr]
            clock[0] += 1.0
            evs = [e for e in c.collect(time.time()).events if e["kind"] == RANK_PROCESSES.name]
            return len(evs), (list(evs[0]["payload"]["ranks"]) if evs else [])

        got = []
        for _ in range(3):
            n, rows = saved_then_collected()
            got.append(n)
            assert _row(rows, 1)["write_bytes_per_second"] >= SAVE_BYTES  # its save, in the second
            assert _row(rows, 0)["write_bytes_per_second"] == 0
        assert got == [1, 1, 1]  # while one writes, every collect (event_every_s is 30 s)
        # writes stopped: an event for the change, its row with no writes. (None then until event_every_s:
        # test_the_event_goes_out_on_change_and_every_few_seconds_otherwise. Not read here from a second
        # collect microseconds later: over such a window a CPU tick the kernel accounts late reads as
        # 100 cores, and the rank's idle mark flips.)
        clock[0] += 1.0
        evs = [e for e in c.collect(time.time()).events if e["kind"] == RANK_PROCESSES.name]
        assert len(evs) == 1 and _row(list(evs[0]["payload"]["ranks"]), 1)["write_bytes_per_second"] == 0
    finally:
        writer.kill()
        writer.wait(timeout=10)
