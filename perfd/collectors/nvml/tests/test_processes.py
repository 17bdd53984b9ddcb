import os
import subprocess
import sys

import psutil

from perfd.collectors.nvml.processes import GpuProcess, ProcessTracker, psutil_rank_env, psutil_user
from tests.procs import wait_for


def _started(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A process running with ``env``: until it has exec'd, its /proc environ is still its parent's (a
    fork's copy), so wait for its command line to be its own (the bound is a failure's only)."""
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    p = subprocess.Popen(argv, env=env)
    wait_for(lambda: psutil.Process(p.pid).cmdline()[1:] == argv[1:], 30, "the child exec'd")
    return p


def test_rank_env_of_a_real_process_and_nothing_else_of_its_environment():
    env = {k: v for k, v in os.environ.items() if k != "PERFD_JOB"}
    env.update({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "SECRET_TOKEN": "x", "SLURM_PROCID": "99"})
    p = _started(env)
    try:
        assert psutil_rank_env(p.pid) == {"rank": 5, "local_rank": 1, "world_size": 8}
    finally:
        p.kill()
        p.wait()
    assert psutil_rank_env(p.pid) == {}  # gone: absent, never raises


def test_job_env_of_a_real_process_places_its_gpu_in_the_job():
    """PERFD_JOB (perfd launch, perfd-slurm-run, a pod's env) names the job a process belongs to;
    an empty or oversized value is no job, never a made-up one."""
    for value, want in (("gpt-8b", "gpt-8b"), ("  ", None), ("x" * 300, None)):
        env = {**os.environ, "PERFD_JOB": value, "RANK": "3"}
        p = _started(env)
        try:
            got = psutil_rank_env(p.pid)
        finally:
            p.kill()
            p.wait()
        assert got.get("job") == want and got["rank"] == 3, (value, got)
    t = ProcessTracker(60.0, lookup=lambda pid: ("python", None),
                       env_lookup=lambda pid: {"rank": pid - 100, "job": "gpt-8b"})
    ev = t.update({"gpu": "0"}, [GpuProcess(100, 1 << 30)], now=0.0)
    assert ev is not None and ev["payload"][0]["job"] == "gpt-8b" and ev["payload"][0]["rank"] == 0


def test_process_events_carry_rank_or_none():
    ranks = {100: {"rank": 0, "local_rank": 0, "world_size": 2}}
    t = ProcessTracker(60.0, lookup=lambda pid: ("python", f"python train.py {pid}"),
                       env_lookup=lambda pid: ranks.get(pid, {}))
    ev = t.update({"gpu": "0"}, [GpuProcess(100, 1 << 30), GpuProcess(200, 1 << 20)], now=0.0)
    assert ev is not None
    by_pid = {p["pid"]: p for p in ev["payload"]}
    assert by_pid[100]["rank"] == 0 and by_pid[100]["world_size"] == 2
    assert by_pid[200]["rank"] is None and by_pid[200]["local_rank"] is None


def test_user_of_a_real_process_and_of_a_gone_one():
    import getpass

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert psutil_user(p.pid) == getpass.getuser()
        t = ProcessTracker(60.0, lookup=lambda pid: ("python", None), env_lookup=lambda pid: {})
        ev = t.update({"gpu": "0"}, [GpuProcess(p.pid, 1 << 30)], now=0.0)
        assert ev is not None and ev["payload"][0]["user"] == getpass.getuser()
    finally:
        p.kill()
        p.wait()
    assert psutil_user(p.pid) is None  # gone: absent, never raises
