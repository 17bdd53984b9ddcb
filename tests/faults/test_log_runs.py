"""A job that restarts and writes its log again with the same start-up block is a new run, not a
resume: a real agent and aggregator (in the test's process, tests/inproc.py: the subject is the tail's
reading of a real Megatron-LM log file rewritten in place, not the daemons' processes), their real
stream, stores, spool and checkpoints on disk.

The issue's probe: the agent killed, the log rewritten with the same start-up block and a new run's
iterations 31–120 → iterations 60–90 never arrived and 91–120 carried the new run's values, nothing
counted: the tail matched device, inode and the 4 KiB head hash and resumed in the middle of the new
run. Now the bytes just before the saved position must still be there too; they are not, so the new
run is read from its start and what the old run may have written after the checkpoint is reported
as a ``log_gap`` event. The same rewrite while the agent runs is seen the same way. The figures
printed are recorded in docs/reliability.md. (An agent killed -9 that resumes from its checkpoint:
tests/faults/test_restarts.py, with the daemons' processes.)
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perfd.collectors.collector import Collected
from tests.faults import checkpoint_file
from tests.faults.test_network_faults import JOB, _megatron_lines
from tests.gates import Gate
from tests.inproc import AgentHandle, Pipeline, pipeline

pytestmark = pytest.mark.slow


def run_lines(first: int, last: int, n: int, loss: float) -> list[str]:
    """Iteration lines ``first``..``last`` of a run whose loss is ``loss`` throughout."""
    _, lines = _megatron_lines(n)
    return [re.sub(r"lm loss: [0-9.E+-]+", f"lm loss: {loss:E}", ln) for ln in lines[first - 1:last]]


@dataclass
class Rig:
    tmp: Path
    log: Path
    p: Pipeline

    def start_agent(self) -> AgentHandle:
        """The node's agent tailing the log, its checkpoints and spool on disk (a restart finds them)."""
        return self.p.agent("--job", JOB, "--megatron-log", self.log, "--nvml", "off", "--host", "off",
                            "--metrics-port", "0", "--agent-id", "node-a", "--spool-dir", self.tmp / "spool",
                            "--state-dir", self.tmp / "agent-state")

    @property
    def agent(self) -> AgentHandle:
        return self.p.agents["agent"]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    log = tmp_path / "train.log"
    head, _ = _megatron_lines(1)
    log.write_text(head)
    with pipeline(tmp_path, "--no-rules", "--gpu", "NVIDIA H200", "--state-dir", tmp_path / "agg-state") as p:
        r = Rig(tmp_path, log, p)
        r.start_agent()
        yield r


def losses(r: Rig) -> dict[int, float]:
    its = r.p.json(f"/api/jobs/{JOB}/iterations?sources=0")["iterations"]
    return {int(it["iteration"]): it["lm_loss"] for it in its}


def new_run_held(r: Rig) -> dict[int, float] | None:
    """The losses held, once iterations 31-120 all carry the new run's."""
    got = losses(r)
    return got if all(got.get(i) == 5.0 for i in range(31, 121)) else None


def gap_events(r: Rig) -> list[dict[str, Any]]:
    evs = r.p.json("/api/events?limit=1000")["events"]
    return [e for e in evs if e["kind"] == "log_gap"]


def test_a_new_run_rewriting_the_log_while_the_agent_was_down_is_read_from_its_start(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    head, _ = _megatron_lines(1)
    with rig.log.open("a") as f:
        f.write("".join(run_lines(1, 60, 120, 10.0)))
    ck = rig.tmp / "agent-state" / "megatron.checkpoint.json"
    # The agent has read past iteration 50 and its checkpoint is on disk (written once acknowledged).
    min_offset = len(head.encode()) + sum(len(x.encode()) for x in run_lines(1, 50, 120, 10.0))
    rig.p.wait(lambda: ck.exists() and checkpoint_file.offsets(ck)[0] >= min_offset, 60,
               "the agent's checkpoint past iteration 50")
    rig.p.stop_agent()
    saved_at = max(checkpoint_file.offsets(ck))
    rig.log.write_text(head + "".join(run_lines(31, 120, 120, 5.0)))  # '>' : same inode, same head
    assert rig.log.stat().st_size > saved_at
    with caplog.at_level(logging.INFO, logger="perfd"):
        rig.start_agent()
        got = rig.p.wait(lambda: new_run_held(rig), 90, "the new run's iterations 31-120 at the aggregator",
                         interval=0.5)
        gaps = rig.p.wait(lambda: gap_events(rig), 30, "a log_gap event")
    print(f"FIGURES new run after the agent was down: checkpoint at byte {saved_at}; the rewritten log read "
          f"from its start: iterations {min(i for i, v in got.items() if v == 5.0)}-120 with the new run's "
          f"loss, {len(gaps)} log_gap event(s): {gaps[0]['text'][:160]!r}")
    assert not [r.getMessage() for r in caplog.records if "megatron: resumed" in r.getMessage()]
    assert any((g.get("payload") or {}).get("cause") == "resume" for g in gaps)


def test_a_new_run_rewriting_the_log_under_a_running_agent_is_read_from_its_start(rig: Rig) -> None:
    head, _ = _megatron_lines(1)
    with rig.log.open("a") as f:
        f.write("".join(run_lines(1, 60, 120, 10.0)))
    rig.p.wait(lambda: len(losses(rig)) >= 59, 60, "the first run's iterations read", interval=0.3)
    rig.log.write_text(head + "".join(run_lines(31, 120, 120, 5.0)))  # before the agent's next poll
    got = rig.p.wait(lambda: new_run_held(rig), 90, "the new run's iterations 31-120 at the aggregator",
                     interval=0.5)
    gaps = rig.p.wait(lambda: gap_events(rig), 30, "a log_gap event")
    payload = gaps[0]["payload"]
    assert isinstance(payload, dict)
    print(f"FIGURES new run under a running agent: iterations 31-120 with the new run's loss "
          f"({sum(1 for v in got.values() if v == 5.0)}), log_gap: {gaps[0]['text'][:200]!r}")
    assert payload["rewrites"] == 1 and payload["cause"] == "truncation" and payload["exact"] is False


def agent_errors(r: Rig, reason: str) -> float:
    text = r.p.get_url(r.agent.metrics_url).decode()
    pattern = r'^perfd_agent_collector_errors_total\{[^}]*reason="' + re.escape(reason) + r'"[^}]*\} (\S+)$'
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_log_replaced_by_a_fifo_is_refused_and_the_agent_reads_on_once_it_is_a_file_again(rig: Rig) -> None:
    """Before, the tail opened the FIFO and waited for a writer: that collector blocked for good,
    with no counter (a regular log put back was never read)."""
    head, _ = _megatron_lines(1)
    with rig.log.open("a") as f:
        f.write("".join(run_lines(1, 10, 120, 10.0)))
    rig.p.wait(lambda: len(losses(rig)) >= 9, 60, "iterations 1-10 read", interval=0.3)
    rig.log.unlink()
    os.mkfifo(rig.log)
    n = rig.p.wait(lambda: agent_errors(rig, "tail:not_regular"), 30, "the FIFO refused and counted")
    rig.log.unlink()
    rig.log.write_text(head + "".join(run_lines(11, 20, 120, 10.0)))
    rig.p.wait(lambda: 20 in losses(rig), 60, "iterations 11-20 of the regular log put back", interval=0.3)
    print(f"FIGURES FIFO: the log replaced by a FIFO was refused ({n:.0f} count), the agent read on once "
          "a regular log was back")
    assert n == 1.0


def _held(rig: Rig, gate: Gate) -> Callable[[], None]:
    """The agent's log collector held at its next collect until the gate opens (what a stopped agent
    does between two reads); returns the undo."""
    col = rig.agent.agent.scheduler.states["megatron"].collector
    collect = col.collect

    def held(now: float) -> Collected:
        gate.pass_through()
        return collect(now)

    col.collect = held  # type: ignore[method-assign]
    return lambda: setattr(col, "collect", collect)


def test_two_copytruncates_between_two_reads_are_counted_with_what_can_be_known(rig: Rig) -> None:
    """The agent's log collector held between two reads while the log is rotated twice: before, 'at
    least 0 bytes'."""
    with rig.log.open("a") as f:
        f.write("".join(run_lines(1, 20, 120, 10.0)))
    rig.p.wait(lambda: len(losses(rig)) >= 19, 60, "iterations 1-20 read", interval=0.3)
    gate = Gate()
    undo = _held(rig, gate)
    gate.wait_arrived("collector-megatron")  # its next read waits, the one before it done
    try:
        one, two = rig.log.with_name("train.log.1"), rig.log.with_name("train.log.2")
        with rig.log.open("a") as f:
            f.write("".join(run_lines(21, 30, 120, 10.0)))  # not read before the first rotation
        shutil.copyfile(rig.log, one)
        os.truncate(rig.log, 0)
        gen2 = "".join(run_lines(31, 50, 120, 10.0))
        with rig.log.open("a") as f:
            f.write(gen2)
        os.replace(one, two)  # logrotate shifts .1 to .2, then copies again
        shutil.copyfile(rig.log, one)
        os.truncate(rig.log, 0)
        with rig.log.open("a") as f:
            f.write("".join(run_lines(51, 60, 120, 10.0)))
    finally:
        gate.open("collector-megatron")
        undo()
    gap = rig.p.wait(lambda: gap_events(rig), 30, "a log_gap event")[0]
    p = gap["payload"]
    assert isinstance(p, dict)
    rig.p.wait(lambda: 60 in losses(rig), 60, "iterations 51-60 read", interval=0.3)
    print(f"FIGURES two copytruncates between two reads: {gap['text'][:300]!r}")
    assert p["missed_generations"] == 1 and p["exact"] is True
    unread = len("".join(run_lines(21, 30, 120, 10.0)).encode())
    assert p["unread_bytes_at_least"] == unread + len(gen2.encode())
