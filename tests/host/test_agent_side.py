"""The agent's side of watching the host and a hang: the step hook's checkpoint/evaluation announcements
through a real socket to the hook collector, the Megatron parser's save and evaluation lines of a real log,
the agent handing the other collectors' pids to the ranks collector, and the py-spy stack dumps (a real
stopped process; a py-spy that fails, hangs or talks too much, each answered, never raised)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent
from perfd.agent.stacks import StackDumper, dump_stack, find_py_spy
from perfd.collectors.collector import Collected
from perfd.collectors.hook import HookCollector
from perfd.collectors.megatron import parse_file
from perfd.collectors.ranks import RanksCollector
from perfd.core import events
from perfd.core.model import Provenance, StepRecord
from perfd.hook import StepHook
from perfd.transport.codec import COMMAND_STACKS, Command
from tests.hook.sim_clock import SimClock

ROOT = Path(__file__).resolve().parents[2]
SAVE_EVAL_LOG = ROOT / "tests" / "data" / "megatron" / "h100_resume_save_eval.log"
# Says when it is in train_step, where a stack must show it (at the print or in the loop): stopped
# before, a loaded machine's stack was still the interpreter's imports.
LOOP = ("import time\ndef train_step():\n    print('in', flush=True)\n    while True: time.sleep(0.01)\n"
        "train_step()\n")


@pytest.fixture
def stopped_python() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen([sys.executable, "-c", LOOP], start_new_session=True, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"in\n"
    os.kill(p.pid, signal.SIGSTOP)
    yield p
    os.kill(p.pid, signal.SIGCONT)
    p.kill()
    p.wait(timeout=10)
    if p.stdout is not None:
        p.stdout.close()


def _drain(c: HookCollector, want: int, timeout: float = 10.0) -> Collected:
    out = Collected()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = c.collect(time.time())
        out.steps += got.steps
        out.events += got.events
        if len([e for e in out.events if e["kind"] == events.JOB_PHASE.name]) >= want:
            break
        time.sleep(0.02)
    return out


def test_the_hook_announces_a_save_through_the_socket(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sim = SimClock().install(monkeypatch)  # the loop's save takes its time on the hook's clock
    sock = str(tmp_path / "hook.sock")
    c = HookCollector({"socket_path": sock, "job": "j"})
    c.start()
    try:
        hook = StepHook(sock, cuda=False, warmup_steps=0, flush_interval_s=10.0)  # no timed flush
        for i in range(1, 6):
            with hook.step(i):
                pass
        with hook.phase("checkpoint"):
            sim.advance(0.05)
        hook.phase_begin("lunch")  # an unknown phase: counted, never raised in the loop
        hook.close(timeout_s=1.0)
        out = _drain(c, 2)
    finally:
        c.stop()
    phases = [e for e in out.events if e["kind"] == events.JOB_PHASE.name]
    assert [(e["payload"]["phase"], e["payload"]["state"], e["payload"]["iteration"]) for e in phases] == [
        ("checkpoint", "begin", 5), ("checkpoint", "end", 5)]
    assert phases[0]["payload"]["pid"] == os.getpid() and phases[0]["labels"]["rank"] == "0"
    # The steps before the pause went out with it (the announcement flushes them first).
    assert sorted(r.iteration for r in out.steps) == [1, 2, 3, 4, 5]
    assert hook.counters()["internal_errors"] == 1 and "unknown phase 'lunch'" in str(hook.last_error)


def test_megatrons_save_and_evaluation_lines_are_announcements() -> None:
    parsed = parse_file(SAVE_EVAL_LOG, job="j")
    evs: list[dict[str, Any]] = list(parsed.events)  # events as the parser builds them, read as such
    seq = [(e["payload"]["phase"], e["payload"]["state"], e["payload"]["iteration"])
           for e in evs if e["kind"] == events.JOB_PHASE.name]
    # Run 1 saves at 10, evaluates after 15, saves at 20, then exits; run 2 (resumed) goes on.
    assert seq[:4] == [("checkpoint", "begin", 10), ("checkpoint", "end", 10), ("evaluation", "begin", None),
                       ("evaluation", "end", 15)]
    begins = [s for s in seq if s[1] == "begin"]
    ends = [s for s in seq if s[1] == "end"]
    assert len(ends) >= len([b for b in begins if b[0] == "checkpoint"])  # every save announced ends
    saves = [e for e in evs if e["kind"] == events.JOB_PHASE.name and e["payload"]["phase"] ==
             "checkpoint"]
    took = saves[1]["payload"]["at"] - saves[0]["payload"]["at"]
    assert took == pytest.approx(35.529378 - 18.782183, abs=1e-3)  # the log's own stamps: 16.7 s
    assert len(parsed.records) == 40  # the step records are as before


def test_the_agent_hands_gpu_and_hook_pids_to_the_ranks_collector(tmp_path: Path) -> None:
    sock = str(tmp_path / "hook.sock")
    agent = Agent(AgentConfig(job="j", node="n1", metrics_port=None,
                              collectors={"ranks": {}, "hook": {"socket_path": sock}}))
    agent.build()
    col = agent.scheduler.states["ranks"].collector
    hook_col = agent.scheduler.states["hook"].collector
    assert isinstance(col, RanksCollector) and isinstance(hook_col, HookCollector)
    hook_col.start()
    me, parent = os.getpid(), os.getppid()
    try:
        agent._forward([("nvml", Collected(events=[{
            "kind": events.GPU_PROCESSES.name, "labels": {"gpu": "0"},
            "payload": [{"pid": parent, "rank": 1, "job": "j"}, {"pid": 99999999, "rank": None}]}]))])
        # A step record the hook collector verified (its sender is this process: the kernel says so) ...
        hook = StepHook(sock, cuda=False, rank=0, flush_interval_s=0)
        with hook.step():
            pass
        deadline, got = time.monotonic() + 30, Collected()
        while not got.steps and time.monotonic() < deadline:
            got = hook_col.collect(time.time())
            time.sleep(0.01)
        # ... and one no verified sender named (a record from elsewhere claiming our parent): not followed.
        forged = StepRecord(job="j", iteration=1, rank=2, step_time_ms=1.0, fields={"pid": str(parent)},
                            source=Provenance("hook", "rank2"))
        agent._forward([("hook", Collected(steps=[*got.steps, forged]))])
        col.collect(time.time())
    finally:
        hook_col.stop()
    assert col.rank_pids() == {0: me, 1: parent}
    assert col.ranks[("j", 0)].source == "hook" and col.ranks[("j", 1)].source == "gpu"
    assert col.ranks[("j", 0)].uid == os.getuid()


def test_a_stopped_process_stack_and_the_answers_when_py_spy_fails(tmp_path: Path,
                                                                   stopped_python: Any) -> None:
    binary = find_py_spy()
    assert binary is not None  # a pinned dependency of perfd (pyproject.toml)
    got = dump_stack(binary, stopped_python.pid)
    # A stack comes back only within the dump's timeout (perfd.core.limits.STACK_TIMEOUT_S): how long py-spy
    # took is the machine's, reported, not bounded here.
    assert "train_step (<string>:" in got["stack"] and got["took_s"] >= 0

    def script(name: str, body: str) -> str:
        path = tmp_path / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return str(path)

    assert "py-spy not found" in dump_stack(None, 1)["error"]
    failed = dump_stack(script("fails", "echo 'Permission denied' >&2; exit 1"), 1)
    assert failed["error"] == "Permission denied"
    slow = dump_stack(script("hangs", "sleep 30"), 1, timeout_s=0.5)
    assert slow["error"].startswith("py-spy did not answer within")
    big = dump_stack(script("talks", "head -c 100000 /dev/zero | tr '\\0' x"), 1, max_bytes=1000)
    assert big["stack"].startswith("x" * 1000) and "cut: more than 1000 bytes" in big["stack"]


def test_the_agent_answers_a_stacks_command_with_captures_off(stopped_python: Any) -> None:
    from tests.collectives.test_collectives_aggregator import FakeClient

    agent = Agent(AgentConfig(job="j", node="n1", metrics_port=None, collectors={"ranks": {}},
                              captures=False))
    agent.build()
    agent.client = FakeClient()
    col = agent.scheduler.states["ranks"].collector
    assert isinstance(col, RanksCollector)
    col.note(stopped_python.pid, 3, "hook", uid=os.getuid())
    col.collect(time.time())
    agent._on_command(Command(kind=COMMAND_STACKS, job="j", ranks=(3, 4), id="c1"))
    assert agent.stacks is not None
    deadline = time.monotonic() + 30
    while not agent.client.calls and time.monotonic() < deadline:
        time.sleep(0.05)
    (call,) = agent.client.calls
    (ev,) = call["events"]
    assert ev["kind"] == events.RANK_STACKS.name and ev["links"] == {"command_id": "c1"}
    assert ev["labels"]["node"] == "n1" and ev["job"] == "j"
    ranks = ev["payload"]["ranks"]
    assert "train_step" in ranks["3"]["stack"] and "no process of this rank" in ranks["4"]["error"]
    assert "stacks of 1 of 2 rank(s)" in ev["text"]


def test_a_second_request_while_one_runs_is_answered_busy(tmp_path: Path) -> None:
    path = tmp_path / "hangs"
    path.write_text("#!/bin/sh\nsleep 3\n")
    path.chmod(0o755)
    answers: list[dict[str, Any]] = []
    d = StackDumper(answers.append, lambda job: {0: os.getpid()}, binary=str(path))
    d.handle(Command(kind=COMMAND_STACKS, job="j", id="a"))
    d.handle(Command(kind=COMMAND_STACKS, job="j", id="b"))
    assert answers[0]["links"] == {"command_id": "b"} and "busy" in answers[0]["text"]
    assert d.refused_busy == 1
