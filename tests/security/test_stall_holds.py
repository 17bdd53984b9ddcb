"""Announced pauses cannot hide a stall, with real processes: a real aggregator and
a root agent (both in the test's process: tests/inproc.py), a training loop timed by the step hook (a
process: it is stopped), and the announcements made for real.

- The job's own hook re-announcing ``phase_begin("checkpoint")`` while its loop hangs: before, each
  announcement restarted the hold (no stall after 1,940 s in the issue's run); now announcements hold
  a stall back for at most ``--stall-phase-max`` after the job's last record (8 s here).
- Another local user pulsing phase begin/end through the shared hook socket while the job's rank is
  SIGSTOPped: before, each end restarted the job's silence and the stall never came; now a stopped
  rank is the kernel's word, which no announcement overrides.
- A SIGSTOPped hook job past its stale limit and its retention: stalled, not ended, not pruned. The
  aggregator in process on the test's clock (perfd.core.clock), the rank a real stopped process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.snapshot import overview_of
from perfd.collectors.ranks import RanksCollector
from perfd.core import limits as L
from perfd.core.clock import ManualClock
from perfd.core.model import Provenance, StepRecord
from tests.inproc import pipeline
from tests.procs import Procs, get_json, wait_for
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
    with Procs(out) as procs, pipeline(out, "--rules-interval", "1", *aggregator_args) as p:
        p.agent("--job", JOB, "--host", "off", "--node", "n1", "--nvml", "off", "--config", cfg)
        p.wait(lambda: os.path.exists(sock), 30, "the agent's hook socket")
        yield procs, p.base, sock


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


def test_a_stopped_hook_job_stays_stalled_and_is_not_pruned_as_ended() -> None:
    """Before, a SIGSTOPped hook job (no GPU process lists to say its processes are there)
    read "ended" once its last step was older than the stale limit (60 s), while its own open stall
    said "stalled", and could be pruned as ended. Here the limit is 8 s, the retention 2 s.

    The aggregator in process, on the test's clock (perfd.core.clock.ManualClock): its tick (what its rules
    loop runs: analysis, stall check, housekeeping) at each second of the silence, with the rank a real
    process, SIGSTOPped, as the real ranks collector sees it."""
    rank = subprocess.Popen([sys.executable, "-c", "import time\nprint('in', flush=True)\ntime.sleep(600)"],
                            start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert rank.stdout is not None and rank.stdout.readline() == b"in\n"
        clock = ManualClock(time.time())  # after the rank's start: its records are of this run
        limits = dataclasses.replace(L.Limits(), job_retention_s=2.0)
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], job_stale_after_s=8.0,
                                          limits=limits), clock=clock)
        agg.on_hello_jobs("agent-a", [JOB])
        t0 = clock.time()
        agg.state.ingest_steps("agent-a", [
            StepRecord(job=JOB, iteration=i, rank=0, end_time=t0 - 4.0 + i * 0.02, step_time_ms=20.0,
                       source=Provenance("hook", f"rank0:pid{rank.pid}"), fields={"pid": str(rank.pid)})
            for i in range(1, 201)])
        ranks = RanksCollector({"job": JOB, "event_every_s": 0})
        ranks.note(rank.pid, 0, "hook", uid=os.getuid())
        os.kill(rank.pid, signal.SIGSTOP)
        wait_for(lambda: _proc_state(rank.pid) == "T", 10, "the rank stopped")
        for _ in range(14):  # past the stale limit and the retention after it, a tick a second
            clock.advance(1.0)
            seen = ranks.collect(clock.time()).events
            agg.state.ingest_events("agent-a", [{**ev, "labels": {**ev["labels"], "node": "n1"}}
                                                for ev in seen])
            agg.tick()
        job = overview_of(agg.state.snapshot(JOB))
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rank.pid, sig)
        rank.wait(10)
        if rank.stdout is not None:
            rank.stdout.close()
    assert job is not None and job["state"] == "stalled" and job["last_step_age_s"] > 12.0, job
    assert job["stall"]["reasons"] == ["stopped"] and agg.lifecycle.jobs_pruned == 0
    assert JOB in agg.state.job_names()


def _proc_state(pid: int) -> str:
    """The process's state letter (proc(5) stat)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
