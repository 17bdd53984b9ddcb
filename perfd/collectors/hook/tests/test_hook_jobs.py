"""Whose steps are the job's by what the sending process declares (PERFD_JOB, set by `perfd launch`).

A hooked script run without `perfd launch` while a launched job's agent was up sent its steps to
that agent's socket (the default path both use), and they were merged into the launched job's run
(it became "running" again, a second run, its goodput halved). Now a perfd launch's agent takes a
process's steps only when it declares the launch's job, an agent serving a named job refuses a
process that declares another, and either says why once, counted by reason. Real processes, real
environments, the kernel's credentials.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfd.collectors.collector import Collected
from perfd.collectors.hook import HookCollector
from perfd.collectors.hook import peers as P

ROOT = Path(__file__).resolve().parents[4]

# A training process: sends three steps, then lives until its stdin closes (its environment stays
# readable while the collector decides).
SENDER = r"""
import sys
from perfd.hook import StepHook
hook = StepHook(sys.argv[1], flush_interval_s=0, cuda=False, rank=int(sys.argv[2]), warmup_steps=0)
for _ in range(3):
    with hook.step():
        pass
hook.close()
print("sent", flush=True)
sys.stdin.read()
"""


def _sender(sock: str, rank: int, job: str | None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PERFD_JOB"}
    env["PYTHONPATH"] = str(ROOT)
    if job is not None:
        env["PERFD_JOB"] = job
    p = subprocess.Popen([sys.executable, "-c", SENDER, sock, str(rank)], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "sent", "the sender did not send"
    return p


def _collect(c: HookCollector, done: object, timeout: float = 30.0) -> Collected:
    """Collect until ``done(out)``: the receiver thread is asynchronous (the timeout bounds a failure)."""
    out = Collected()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = c.collect(time.time())
        out.steps += got.steps
        if done(out):  # type: ignore[operator]
            break
        time.sleep(0.01)
    return out


@pytest.fixture
def make(tmp_path: Path) -> Iterator[object]:
    made: list[HookCollector] = []

    def _make(**conf: object) -> HookCollector:
        c = HookCollector({"socket_path": str(tmp_path / f"hook{len(made)}.sock"), "job": "train", **conf})
        c.start()
        made.append(c)
        return c

    yield _make
    for c in made:
        c.stop()


@pytest.mark.slow
def test_a_launchs_agent_takes_only_the_processes_that_declare_its_job(make: object) -> None:
    col: HookCollector = make(require_declared_job=True, refuse_other_jobs=True)  # type: ignore[operator]
    sock = col.config.socket_path
    procs = [_sender(sock, 0, "train"), _sender(sock, 1, None), _sender(sock, 2, "other")]
    try:
        # the wait ends on the event the test asserts, every record of both refused senders counted (their
        # three steps and the job record each sent): a wait for three ended under load with the fourth
        # still in the receiver's hands
        def done(out: Collected) -> bool:
            return (len(out.steps) >= 3 and col.errors.get(f"sender:{P.NOT_LAUNCHED}", 0) >= 4
                    and col.errors.get(f"sender:{P.OTHER_JOB}", 0) >= 4)
        out = _collect(col, done)
    finally:
        for p in procs:
            p.communicate("", timeout=30)
    assert sorted((s.rank, s.iteration) for s in out.steps) == [(0, 1), (0, 2), (0, 3)]
    assert {s.job for s in out.steps} == {"train"}
    # every record of theirs refused, counted by reason: three steps and the job record each sent
    assert col.errors[f"sender:{P.NOT_LAUNCHED}"] == col.errors[f"sender:{P.OTHER_JOB}"] == 4


@pytest.mark.slow
def test_an_agent_told_its_job_takes_undeclared_processes_and_refuses_another_jobs(
        make: object, caplog: pytest.LogCaptureFixture) -> None:
    col: HookCollector = make(refuse_other_jobs=True)  # type: ignore[operator]
    sock = col.config.socket_path
    procs = [_sender(sock, 0, None), _sender(sock, 1, "other")]
    try:
        with caplog.at_level("WARNING"):
            out = _collect(col, lambda o: len(o.steps) >= 3
                           and col.errors.get(f"sender:{P.OTHER_JOB}", 0) >= 3)
    finally:
        for p in procs:
            p.communicate("", timeout=30)
    assert sorted((s.rank, s.iteration) for s in out.steps) == [(0, 1), (0, 2), (0, 3)]
    said = [r.getMessage() for r in caplog.records if P.OTHER_JOB in r.getMessage()]
    assert len(said) == 1 and "declares another job than 'train'" in said[0]  # once, with why


@pytest.mark.slow
def test_a_second_agent_does_not_take_a_live_socket_from_the_first(make: object) -> None:
    first: HookCollector = make()  # type: ignore[operator]
    second = HookCollector({"socket_path": first.config.socket_path, "job": "other"})
    second.start()
    try:
        assert second.sock is None and "socket_in_use" in second.errors
        p = _sender(first.config.socket_path, 0, None)
        try:
            out = _collect(first, lambda o: len(o.steps) >= 3)
        finally:
            p.communicate("", timeout=30)
        assert len(out.steps) == 3  # the first still listens there
    finally:
        second.stop()
    assert os.path.exists(first.config.socket_path)  # the refused one removed nothing


# A script run beside an agent that refuses it: steps until its hook has been told why (or a bound).
STEPPER = r"""
import sys, time
from perfd.hook import StepHook
hook = StepHook(sys.argv[1], flush_interval_s=0, cuda=False, rank=0, warmup_steps=0)
deadline = time.monotonic() + 20
while not hook.refusals_said and time.monotonic() < deadline:
    with hook.step():
        time.sleep(0.01)
for _ in range(20):  # told once: more steps, more refusals, no second line
    with hook.step():
        time.sleep(0.01)
hook.close()
print(sorted(hook.refusals_said), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("declared, said", [
    (None, "serves the launch of job 'train', and no perfd launch started this process"),
    ("other", "serves job 'train' and takes no steps of this process, which declares another job"),
])
def test_a_refused_script_is_told_why_once_on_its_own_stderr(make: object, declared: str | None,
                                                            said: str) -> None:
    col: HookCollector = make(require_declared_job=True, refuse_other_jobs=True)  # type: ignore[operator]
    env = {k: v for k, v in os.environ.items() if k != "PERFD_JOB"}
    env["PYTHONPATH"] = str(ROOT)
    if declared is not None:
        env["PERFD_JOB"] = declared
    p = subprocess.Popen([sys.executable, "-c", STEPPER, col.config.socket_path], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = _collect(col, lambda _o: p.poll() is not None)
    stdout, stderr = p.communicate(timeout=30)
    assert out.steps == []
    lines = [ln for ln in stderr.splitlines() if "perfd step hook" in ln]
    assert len(lines) == 1, (stderr, col.errors, col.counts)
    assert said in lines[0] and "its steps are not recorded" in lines[0] and "perfd launch --job" in lines[0]
    assert stdout.strip() == "[2]" if declared is None else stdout.strip() == "[1]"
