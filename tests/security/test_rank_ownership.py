"""A process is the job's rank by its uid and the declared job, never by ``RANK`` alone: before,
``collectors/nvml/processes.py`` took any process with RANK in its environment as the job's own
whatever its user, and ``perfd/agent/capture_executor.py`` then made another user's ``RANK=3`` process the
capture target for rank 3. Real processes: the job's (this uid) and another user's (tests/security/
other_user.py), each with RANK in its environment; a setuid program with RANK for the node agent."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.capture_executor import AgentCaptures
from perfd.collectors.nvml.processes import GpuProcess, ProcessTracker
from tests.procs import wait_for
from tests.security.other_user import OtherUser, other_user, system_python

SLEEP = "import time; time.sleep(120)"


def _start(env: dict[str, str], who: OtherUser | None = None, *args: str) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "PERFD_JOB", "LOCAL_RANK")}
    if who is None:
        return subprocess.Popen([sys.executable, "-c", SLEEP, *args], env={**base, **env})
    return subprocess.Popen(who.argv(system_python(), "-c", SLEEP, *args), env={**base, **env}, cwd="/")


def _execd(pid: int) -> bool:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return Path(argv[0].decode()).name != "setpriv" and SLEEP.encode() in argv


@pytest.fixture
def procs() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    other = other_user()
    out = {"mine": _start({"RANK": "0", "PERFD_JOB": "j"}, None, "--lr", "1e-4"),
           "squatter": _start({"RANK": "3"}, other, "--db-password=hunter2"),
           "claims_job": _start({"RANK": "1", "PERFD_JOB": "j"}, other),
           "other_job": _start({"RANK": "2", "PERFD_JOB": "theirs"}, other, "--lr", "5")}
    # each has exec'd its Python (setpriv execs in place): its environment is the one given, there to read.
    # Not "the code is in its command line": setpriv's own carries it, as root, until it execs.
    wait_for(lambda: all(_execd(q.pid) for q in out.values()), 30, "the processes exec'd their Python",
             interval=0.02)
    try:
        yield out
    finally:
        for p in out.values():
            p.kill()
            p.wait()


def test_the_gpu_process_list_takes_only_the_job_users_processes_for_ranks(
        procs: dict[str, subprocess.Popen[bytes]]) -> None:
    t = ProcessTracker(60.0, job="j", job_uid=os.geteuid())
    ev = t.update({"gpu": "0"}, [GpuProcess(p.pid, 1 << 30) for p in procs.values()], time.time())
    assert ev is not None
    by = {name: next(x for x in ev["payload"] if x["pid"] == p.pid) for name, p in procs.items()}
    assert (by["mine"]["rank"], by["mine"]["job"]) == (0, "j") and "--lr 1e-4" in str(by["mine"]["cmdline"])
    # Another user's RANK=3 (no job), and one claiming this job: nobody's rank, no command line.
    for name in ("squatter", "claims_job"):
        assert (by[name]["rank"], by[name]["job"], by[name]["cmdline"]) == (None, None, None), by[name]
        assert by[name]["user"] == other_user().name
    # Another user's process of another job: that job's (its placement), not this one's; no command line.
    theirs = by["other_job"]
    assert (theirs["rank"], theirs["job"], theirs["cmdline"]) == (2, "theirs", None)
    assert t.foreign_claims == 2


def test_a_capture_never_targets_another_users_rank_process(
        tmp_path: Path, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """The GPU process list as a node agent (or an older agent) reports it: every declared rank. The
    job agent's capture manager takes only the job user's processes for ranks 0-3."""
    payload = [{"pid": procs["mine"].pid, "rank": 0, "job": "j"},
               {"pid": procs["squatter"].pid, "rank": 3, "job": None},
               {"pid": procs["claims_job"].pid, "rank": 1, "job": "j"}]
    caps = AgentCaptures("j", str(tmp_path / "caps"), 1 << 30, emit=lambda e: None, kineto=False,
                         job_uid=os.geteuid())
    try:
        caps.observe([{"kind": "gpu_processes", "labels": {"gpu": "0"}, "payload": payload}])
        assert caps._pids_for_ranks("j", (0, 1, 3)) == {0: procs["mine"].pid}
        assert caps.foreign == 2
        # The pid learnt for rank 0 exits and is gone: it is not named any more.
        procs["mine"].kill()
        procs["mine"].wait()
        assert caps._pids_for_ranks("j", (0,)) == {}
    finally:
        caps.close()


def _uids(pid: int) -> tuple[int, ...] | None:
    """The process's real, effective, saved and filesystem uids (/proc), None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return tuple(int(x) for x in line.split()[1:])
    except OSError:
        return None
    return None


def test_a_node_agent_never_targets_a_setuid_process(tmp_path: Path) -> None:
    """No job user (a node agent): a process running as several uids (a setuid program) is no
    capture target, whatever it declares."""
    if os.geteuid() != 0 or not os.path.exists("/usr/bin/passwd"):
        pytest.skip("needs root and /usr/bin/passwd (a setuid-root program)")
    other = other_user()
    p = subprocess.Popen(["/usr/bin/passwd"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, user=other.uid, group=other.gid, extra_groups=[],
                         env={"RANK": "3", "PATH": "/usr/bin:/bin"})
    try:
        # until passwd runs (its real and effective uids differ): before the exec the child is a plain
        # process of the other user, which a fixed 0.3 s did not always outlast on a loaded machine
        wait_for(lambda: _uids(p.pid) is not None and len(set(_uids(p.pid) or ())) > 1, 30,
                 "passwd running setuid", interval=0.05)
        caps = AgentCaptures("default", str(tmp_path / "caps"), 1 << 30, emit=lambda e: None, kineto=False)
        try:
            ev: dict[str, Any] = {"kind": "gpu_processes", "labels": {"gpu": "0"},
                                  "payload": [{"pid": p.pid, "rank": 3, "job": None}]}
            caps.observe([ev])
            assert caps._pids_for_ranks("default", (3,)) == {}
        finally:
            caps.close()
    finally:
        p.kill()
        p.wait()


def test_the_agent_tells_its_nvml_collector_the_job_user() -> None:
    from perfd.agent.config import AgentConfig
    from perfd.agent.node_agent import Agent, default_registry

    cfg = AgentConfig(job="j", job_user="4321", collectors={"nvml": {"source": "off"}}).finish()
    agent = Agent(cfg, default_registry())
    agent.build()
    nvml = agent.scheduler.states["nvml"].collector
    assert nvml.config.job_uid == 4321 and nvml.config.job == "j"  # type: ignore[attr-defined]
    node = AgentConfig(collectors={"nvml": {"source": "off"}}).finish()
    assert node.job_uid is None  # a node agent: no job, no job user
    assert AgentConfig(job="j").finish().job_uid == os.geteuid()  # undeclared: the agent's own
