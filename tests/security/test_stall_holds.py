"""Announced pauses cannot hide a stall (issue 43 item 5), with real processes: a real aggregator and
a root agent, a training loop timed by the step hook, and the announcements made for real.

- The job's own hook re-announcing ``phase_begin("checkpoint")`` while its loop hangs: before, each
  announcement restarted the hold (no stall after 1,940 s in the issue's run); now announcements hold
  a stall back for at most ``--stall-phase-max`` after the job's last record (8 s here).
- Another local user pulsing phase begin/end through the shared hook socket while the job's rank is
  SIGSTOPped: before, each end restarted the job's silence and the stall never came; now a stopped
  rank is the kernel's word, which no announcement overrides.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.procs import Procs, get_json, start_agent, start_aggregator, wait_for
from tests.security.other_user import OtherUser, other_user

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc, SO_PASSCRED")]
JOB = "held"

# The job: steps, then hangs (its loop never steps again) while a thread of it announces a checkpoint
# save every second, or (argv[2] == "quiet") says nothing.
LOOP = r"""
import sys, threading, time
from perfd.hook import StepHook
hook = StepHook(cuda=False, rank=0, flush_interval_s=0.05)
for i in range(int(sys.argv[1])):
    with hook.step():
        time.sleep(0.02)
def announce():
    while True:
        hook.phase_begin("checkpoint")
        time.sleep(1.0)
if sys.argv[2] == "announce":
    threading.Thread(target=announce, daemon=True).start()
print("hung", flush=True)
time.sleep(600)
"""
# Another user's process pulsing begin and end of a checkpoint save for rank 1, as its own pid (the
# kernel's credentials pass: it names only itself), the hook's phase record packed by hand.
PULSE = r"""
import os, socket, struct, sys, time
PHASE = struct.Struct("<BBHiIqqB7x")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("")
print("pulsing", flush=True)
while True:
    for state in (1, 2):
        s.sendto(PHASE.pack(1, 4, 1, 1, os.getpid(), 0, time.time_ns(), state), sys.argv[1])
        time.sleep(0.25)
"""


@contextlib.contextmanager
def _running(shared: Path, out: Path, *aggregator_args: str) -> Iterator[tuple[Procs, str, str]]:
    sock = str(shared / "hook.sock")
    cfg = out / "agent.yaml"
    cfg.write_text("batch_interval_s: 0.3\ncollectors:\n"
                   f"  hook: {{socket_path: {sock}, mode: '0666'}}\n  ranks: {{interval_s: 1.0}}\n")
    with Procs(out) as procs:
        _grpc, _http, base = start_aggregator(procs, "--rules-interval", "1", *aggregator_args)
        start_agent(procs, _grpc, "--job", JOB, "--host", "off", "--node", "n1", nvml="off", config=cfg)
        wait_for(lambda: os.path.exists(sock), 30, "the agent's hook socket")
        yield procs, base, sock


@pytest.fixture
def live(shared_tmp: Path, tmp_path: Path) -> Iterator[tuple[Procs, str, str]]:
    with _running(shared_tmp, tmp_path, "--stall-phase-max", "8") as got:
        yield got


def _loop(procs: Procs, sock: str, mode: str) -> Any:
    script = procs.out / "loop.py"
    script.write_text(LOOP)
    p = procs.start("loop", [sys.executable, str(script), "200", mode], env={"PERFD_HOOK_SOCKET": sock})
    wait_for(lambda: "hung" in (procs.out / "loop.out").read_text(), 90, "the loop's 200 steps")
    return p


def _stall(base: str) -> dict[str, Any] | None:
    for inc in get_json(f"{base}/api/jobs/{JOB}/incidents")["incidents"]:
        if "stall" in inc["kinds"] and inc["open"]:
            return dict(inc)
    return None


def test_a_hang_announcing_its_checkpoint_again_and_again_stalls_past_the_cap(
        live: tuple[Procs, str, str]) -> None:
    procs, base, sock = live
    _loop(procs, sock, "announce")
    inc = wait_for(lambda: _stall(base), 90, "a stall despite the announcements", interval=0.5)
    stall = inc["evidence"]["stall"]
    assert stall["phase"] is None and "idle" in stall["reasons"], stall  # past the cap: no hold
    job = get_json(f"{base}/api/jobs")["jobs"][0]
    assert job["state"] == "stalled"
    # The announcements went on all along (each second): the job's own hook re-announced its save.
    assert stall["silent_s"] > 8.0


def test_another_users_phase_pulses_do_not_hide_a_stopped_rank(live: tuple[Procs, str, str]) -> None:
    procs, base, sock = live
    attacker: OtherUser = other_user()
    loop = _loop(procs, sock, "quiet")
    pulse = attacker.python(PULSE, sock, out=procs.out / "pulse.out")
    try:
        wait_for(lambda: "pulsing" in (procs.out / "pulse.out").read_text(), 30, "the pulses")
        os.kill(loop.pid, signal.SIGSTOP)
        try:
            inc = wait_for(lambda: _stall(base), 90, "a stall of the stopped rank despite the pulses",
                           interval=0.5)
        finally:
            os.kill(loop.pid, signal.SIGCONT)
    finally:
        os.killpg(pulse.pid, signal.SIGKILL)
        pulse.wait(10)
    stall = inc["evidence"]["stall"]
    assert "stopped" in stall["reasons"] and stall["ranks"]["0"]["state"] == "stopped", stall
    assert "was stopped" in inc["cause"]


def test_a_stopped_hook_job_stays_stalled_and_is_not_pruned_as_ended(shared_tmp: Path,
                                                                     tmp_path: Path) -> None:
    """Issue 43 item 7: a SIGSTOPped hook job (no GPU process lists to say its processes are there)
    read "ended" once its last step was older than the stale limit (60 s), while its own open stall
    said "stalled", and could be pruned as ended. Here the limit is 8 s, the retention 2 s."""
    with _running(shared_tmp, tmp_path, "--job-stale-after", "8", "--job-retention", "2") as (
            procs, base, sock):
        loop = _loop(procs, sock, "quiet")
        os.kill(loop.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _stall(base), 90, "the stall of the stopped rank", interval=0.5)
            job = wait_for(lambda: (j := next(j for j in get_json(f"{base}/api/jobs")["jobs"]
                                              if j["job"] == JOB))["last_step_age_s"] > 12.0 and j,
                           60, "past the stale limit and the retention after it", interval=0.5)
            time.sleep(2.0)  # a housekeeping tick or two at that age
            job = next(j for j in get_json(f"{base}/api/jobs")["jobs"] if j["job"] == JOB)
            pruned = get_json(f"{base}/api/stats")["transport"]["jobs_pruned"]
        finally:
            os.kill(loop.pid, signal.SIGCONT)
    assert job["state"] == "stalled" and job["last_step_age_s"] > 12.0, job
    assert job["stall"]["reasons"] == ["stopped"] and pruned == 0
