"""The live stall through the aggregator's state, in process: a real Megatron-LM DP=2 log's records
(tests/data/megatron/dp2_all_timers.log), the host state of real processes as the real ranks
collector reports it (one SIGSTOPped), the Python stacks the real agent-side dumper takes with
py-spy, and the Megatron parser's own checkpoint announcement. The clock is the test's: the job's
silence is made by moving its last record's arrival back (as tests/e2e/test_job_liveness.py does),
and each check is run at an explicit time."""

from __future__ import annotations

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

from perfd.agent.stacks import StackDumper
from perfd.aggregator.job_rows import liveness_rows
from perfd.aggregator.snapshot import overview_of
from perfd.aggregator.state import AggregatorState
from perfd.analytics.incidents.evidence import StallReason
from perfd.analytics.incidents.stall import IDLE_CPU_CORES, StallCheck
from perfd.analytics.steps.liveness import RUNNING, STALLED
from perfd.collectors.megatron import parse_file, parse_lines
from perfd.collectors.ranks import RanksCollector
from perfd.core import events
from perfd.transport.codec import COMMAND_STACKS, Command
from tests.procs import wait_for
from tests.silence import arrived_ago

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

ROOT = Path(__file__).resolve().parents[2]
DP2 = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
JOB = "dp2"
# Says when it is in train_step, where a stack must show it (at the print or in the loop): a fixed wait
# before a stop left a loaded machine's stack in the interpreter's imports.
LOOP = ("import time\ndef train_step():\n    print('in', flush=True)\n    while True: time.sleep(0.01)\n"
        "train_step()\n")


@pytest.fixture
def ranks() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """Two real Python processes standing for the job's ranks 0 and 1."""
    ps = [subprocess.Popen([sys.executable, "-c", LOOP], start_new_session=True, stdout=subprocess.PIPE)
          for _ in range(2)]
    for p in ps:
        assert p.stdout is not None and p.stdout.readline() == b"in\n"
    yield ps[0], ps[1]
    for p in ps:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        p.wait(timeout=10)
        if p.stdout is not None:
            p.stdout.close()


def _started_before(payload: Any) -> Any:
    """The ranks' processes as having started an hour earlier: this test's clock moves the job's last
    record back by the silence, to before the stand-in processes began, and a job whose every rank
    process began after its last step is a new run starting, not a stall (perfd.analytics.incidents.stall)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("ranks"), list):
        return payload
    return {**payload, "ranks": [{**r, "started_at": r["started_at"] - 3600.0} if "started_at" in r else r
                                 for r in payload["ranks"]]}


class Harness:
    def __init__(self, procs: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]) -> None:
        self.parsed = parse_file(DP2, job=JOB)
        self.sent: list[tuple[str, Command]] = []

        def send(agent: str, cmd: Command) -> bool:  # the server's send_command: queued to the stream
            self.sent.append((agent, cmd))
            return True

        self.st = AggregatorState(min_recompute_s=0.0, send=send)
        self.st.hello("agent-a", [JOB])
        self.st.ingest_job_info("agent-a", JOB, self.parsed.job_info)
        self.collector = RanksCollector({"job": JOB, "event_every_s": 0})
        for rank, p in enumerate(procs):
            self.collector.note(p.pid, rank, "gpu")
        self.procs = procs
        self.arrived = time.time()  # when the records last ingested arrived (Harness.ingest)

    def ingest(self, records: list[Any], now: float | None = None) -> float:
        """The records arrive ``now`` (the wall clock's by default); returns when they did."""
        self.arrived = time.time() if now is None else now
        self.st.ingest_steps("agent-a", records, now=self.arrived)
        return self.arrived

    def records(self, upto: int) -> None:
        self.ingest([r for r in self.parsed.records if r.iteration <= upto])
        self.st.analysis(JOB, force=True)

    def tick(self) -> StallCheck:
        """The stall watch's check as the records last ingested arrive. A check on the wall clock after
        them read a silence of however long this process waited in between: a full suite's load once
        held a worker ~5 s (the floor of the limit) between an ingest and its check, and a stall the
        records had ended stayed open."""
        return self.st.stalls.tick(self.st, JOB, self.arrived)

    def observe(self, n: int = 2) -> None:
        """What the agent's ranks collector reports, as the agent sends it."""
        for i in range(n):
            if i:
                time.sleep(0.5)
            out = self.collector.collect(time.time())
        self.st.ingest_events("agent-a", [{**ev, "labels": {**ev["labels"], "node": "node-a"},
                                           "payload": _started_before(ev["payload"])} for ev in out.events])

    def stall_then_continue(self, silent_s: float = 9.0) -> None:
        """20 records, rank 0 stopped and seen so, a stall opened ``silent_s`` into the silence, then
        the rank continued and seen so (its records not in yet)."""
        self.records(20)
        os.kill(self.procs[0].pid, signal.SIGSTOP)
        self.observe()
        self.st.stalls.tick(self.st, JOB, self.silent_for(silent_s))
        os.kill(self.procs[0].pid, signal.SIGCONT)
        self.observe()

    def after_stop(self, records: list[Any], stopped_s: float) -> list[Any]:
        """The records the job makes after a stop of ``stopped_s``: their own end times later by it
        (a stopped process steps on from where it was; only a late delivery keeps them on time)."""
        return [dataclasses.replace(r, end_time=r.end_time + stopped_s) if r.end_time is not None else r
                for r in records]

    def silent_for(self, seconds: float) -> float:
        """Make the job's last record have arrived ``seconds`` ago; returns now."""
        return arrived_ago(self.st, "agent-a", JOB, seconds)

    def incidents(self) -> list[dict[str, Any]]:
        return self.st.incidents.incidents(JOB)


@pytest.mark.slow
def test_a_stopped_rank_opens_a_stall_with_stacks_and_the_slow_step_takes_it_over(ranks: Any) -> None:
    h = Harness(ranks)
    h.records(20)
    h.observe()
    now = h.silent_for(2.0)  # within the limit (the floor, 5 s: a record every ~0.35 s)
    assert h.st.stalls.tick(h.st, JOB, now).status.value == "running" and not h.incidents()
    os.kill(ranks[1].pid, signal.SIGSTOP)
    h.observe()
    now = h.silent_for(6.0)
    h.st.stalls.tick(h.st, JOB, now)
    (inc,) = h.incidents()
    assert inc["kinds"] == ["stall"] and inc["open"] and inc["ranks"] == [1, 0]
    assert (inc["first_iteration"], inc["last_iteration"]) == (21, 21)
    assert inc["verdict"]["cause"] == "process_stopped" and inc["verdict"]["rank"] == 1
    assert inc["cause"].startswith("stalled: no step for 6 s") and "rank 1's process" in inc["cause"]
    stall = inc["evidence"]["stall"]
    # Rank 0 is not stopped: a 10 ms sleeper reads "running" (R) when the machine's load keeps it waiting.
    assert stall["ranks"]["1"]["state"] == "stopped"
    assert stall["ranks"]["0"]["state"] in ("sleeping", "running")
    ov = overview_of(h.st.snapshot(JOB))
    # Stopped (rank 1), and every rank idle (rank 0 sleeps in its loop, rank 1 is stopped)
    assert ov is not None and ov["state"] == STALLED and ov["stall"]["reasons"][0] == "stopped"
    snaps = [s for j in h.st.job_names() if (s := h.st.snapshot(j)) is not None]
    rows = {name: v for lab, name, v in liveness_rows(snaps, time.time()) if lab.get("job_name") == JOB}
    assert rows["perfd_job_stalled_seconds"] >= 6.0
    # One stacks request, to the agent that reports the ranks; its answer (py-spy on the stopped
    # process, by the agent's own dumper) joins the stall.
    ((agent, cmd),) = h.sent
    assert agent == "agent-a" and cmd.kind == COMMAND_STACKS and cmd.ranks == (1, 0) and cmd.job == JOB
    answers: list[dict[str, Any]] = []
    StackDumper(answers.append, lambda job: h.collector.rank_pids(job)).run(cmd)
    h.st.ingest_events("agent-a", [{**answers[0], "labels": {"job": JOB, "node": "node-a"}}])
    h.st.stalls.tick(h.st, JOB, h.silent_for(8.0))
    (inc,) = h.incidents()
    stacks = inc["evidence"]["stall"]["stacks"]
    assert "train_step (<string>:" in stacks["1"]["stack"] and stacks["1"]["node"] == "node-a"
    assert inc["cost_s"] == pytest.approx(8.0 - inc["evidence"]["stall"]["cadence_s"], abs=0.5)
    assert len(h.sent) == 1  # asked once per stall
    # Steps resume: the record after the stop took the whole stop; its incident takes the stall over.
    os.kill(ranks[1].pid, signal.SIGCONT)
    h.observe()
    last = h.parsed.records[20]
    assert last.iteration == 21 and last.end_time is not None and last.step_time_ms is not None
    slow = dataclasses.replace(last, step_time_ms=last.step_time_ms + 8000.0)
    h.ingest([slow])
    h.st.analysis(JOB, force=True)
    h.tick()
    (inc,) = h.incidents()
    assert {"slow-steps", "stall"} <= set(inc["kinds"]) and inc["open"]  # (straggler: DP=2's timers)
    assert inc["verdict"]["cause"] == "process_stopped" and "rank 1's process" in inc["cause"]
    assert "was stopped" in inc["cause"] and "steps" in inc["cause"]
    assert overview_of(h.st.snapshot(JOB))["state"] == RUNNING  # type: ignore[index]
    # The next steps close it; passes after the takeover update it from the analysis alone, and the
    # stall (its kind, its ranks' states, stacks) stays with it.
    h.ingest(h.parsed.records[21:])
    h.st.analysis(JOB, force=True)
    (inc,) = h.incidents()
    assert {"slow-steps", "stall"} <= set(inc["kinds"]) and not inc["open"]
    assert inc["verdict"]["cause"] == "process_stopped"
    assert inc["evidence"]["stall"]["stacks"]["1"]["stack"]  # kept with it
    assert inc["cost_s"] == pytest.approx(8.0, abs=0.5)
    kinds = [e["kind"] for e in h.st.recent_events(JOB)]
    assert kinds.count(events.INCIDENT_OPENED.name) == 1 and kinds.count(events.INCIDENT_CLOSED.name) == 1


@pytest.mark.slow
def test_a_stop_between_two_steps_costs_its_silence_in_the_incident_that_takes_it_over(ranks: Any) -> None:
    """A stop that lands after one step ended and before the next began lies in no step's time: the
    step after it is ordinary. Where a slow step of another cause (a little contention) covers the
    stall's iterations, that incident takes the stall over; its cost is still the stop's silence (the
    wall clock between records saw it), with the steps' part kept apart for goodput."""
    h = Harness(ranks)
    h.records(20)
    os.kill(ranks[0].pid, signal.SIGSTOP)
    h.observe()
    silent_from = h.silent_for(9.0) - 9.0  # the last record's arrival, as the stall watch sees it
    h.st.stalls.tick(h.st, JOB, silent_from + 9.0)
    (stall,) = h.incidents()
    assert stall["kinds"] == ["stall"] and stall["open"]
    assert stall["cost_parts"]["steps_s"] is None and stall["cost_s"] == stall["cost_parts"]["silence_s"]
    os.kill(ranks[0].pid, signal.SIGCONT)
    h.observe()
    recs = h.parsed.records
    slow = dataclasses.replace(recs[20], step_time_ms=(recs[20].step_time_ms or 0.0) + 1500.0)
    before = time.time()
    # the silence ends when these arrive; their own times are after the stop
    h.ingest(h.after_stop([slow, *recs[21:]], before - silent_from))
    after = time.time()
    h.st.analysis(JOB, force=True)
    for _ in range(2):
        h.tick()
        h.st.refresh()
    (inc,) = h.incidents()
    assert {"slow-steps", "stall"} <= set(inc["kinds"]) and inc["verdict"]["cause"] == "process_stopped"
    parts = inc["cost_parts"]
    assert parts["steps_s"] == pytest.approx(1.5, abs=0.3)  # Σ(step − steady median): the 1.5 s only
    # The silence: from the last record before it to the records that ended it (this test's clock reads
    # both ends: on a loaded machine the steps above take a second or more), beyond one usual interval.
    cadence = inc["evidence"]["stall"]["cadence_s"]
    assert before - silent_from - cadence - 0.01 <= parts["silence_s"] <= after - silent_from - cadence + 0.01
    assert inc["cost_s"] == parts["silence_s"]  # the larger: the stop itself
    # Goodput's incident part is the steps' part: the silence lies between records (stall or other).
    snap = h.st.snapshot(JOB)
    gp = snap.goodput() if snap is not None else None
    assert gp is not None and gp.parts["incident"] == pytest.approx(parts["steps_s"], abs=0.01)


@pytest.mark.slow
def test_slow_steps_after_the_stall_take_it_over_from_where_it_began(ranks: Any) -> None:
    """A pause between two steps, then ordinary steps, then a few slow ones (a loaded machine): the
    slow steps' incident takes the stall over, and the episode starts where the stall did."""
    h = Harness(ranks)
    h.stall_then_continue()
    recs = h.parsed.records
    slow = [dataclasses.replace(r, step_time_ms=(r.step_time_ms or 0.0) + 1500.0) for r in recs[26:28]]
    h.ingest([*recs[20:26], *slow, *recs[28:]])  # 21-26 ordinary, 27-28 slow
    h.st.analysis(JOB, force=True)
    for _ in range(2):
        h.tick()
        h.st.refresh()
    (inc,) = h.incidents()
    assert {"slow-steps", "stall"} <= set(inc["kinds"]) and inc["first_iteration"] == 21
    assert inc["last_iteration"] >= 28 and inc["verdict"]["cause"] == "process_stopped"
    h.st.refresh()  # and it stays so once recorded
    (again,) = h.incidents()
    assert again["first_iteration"] == 21


def test_a_stall_no_slow_step_follows_closes_on_its_own(ranks: Any) -> None:
    h = Harness(ranks)
    h.records(20)
    os.kill(ranks[0].pid, signal.SIGSTOP)
    h.observe()
    silent_from = h.silent_for(7.0) - 7.0
    h.st.stalls.tick(h.st, JOB, silent_from + 7.0)
    assert [i["kinds"] for i in h.incidents()] == [["stall"]]
    os.kill(ranks[0].pid, signal.SIGCONT)
    before = time.time()
    # the next records are ordinary (a log interval's mean, say), made after the stop
    h.ingest(h.after_stop(h.parsed.records[20:30], before - silent_from))
    h.st.analysis(JOB, force=True)
    after = time.time()
    h.tick()
    (inc,) = h.incidents()
    assert inc["kinds"] == ["stall"] and not inc["open"] and inc["verdict"]["cause"] == "process_stopped"
    # Its cost: the silence to the record that ended it (this test's clock reads both ends), beyond one
    # usual interval.
    cadence = inc["evidence"]["stall"]["cadence_s"]
    assert before - silent_from - cadence - 0.01 <= inc["cost_s"] <= after - silent_from - cadence + 0.01


@pytest.mark.slow
def test_a_stopped_rank_continued_keeps_its_stop_as_the_stalls_corroboration(ranks: Any) -> None:
    """After SIGCONT the rank runs again (here idle: the loop sleeps) before its records arrive: the
    stall, still silent, keeps the stopped state that made it one, and its silence grows."""
    h = Harness(ranks)
    h.stall_then_continue()
    check = h.st.stalls.tick(h.st, JOB, h.silent_for(12.0))
    assert StallReason.STOPPED not in check.reasons  # the check now sees it running
    (inc,) = h.incidents()
    stall = inc["evidence"]["stall"]
    assert stall["ranks"]["0"]["state"] == "stopped" and "stopped" in stall["reasons"]
    assert stall["silent_s"] == pytest.approx(12.0, abs=0.5) and inc["open"]
    h.records(30)
    h.tick()
    (inc,) = h.incidents()
    assert not inc["open"] and inc["evidence"]["stall"]["ranks"]["0"]["state"] == "stopped"
    assert inc["verdict"]["cause"] == "process_stopped"


@pytest.mark.slow
def test_an_announced_checkpoint_save_holds_the_stall_back(ranks: Any) -> None:
    h = Harness(ranks)
    h.records(20)
    h.observe()
    line = "[2026-11-23 16:21:18.782183] saving checkpoint at iteration      20 to /ckpt in torch_dist format"
    saving: list[dict[str, Any]] = parse_lines([line], job=JOB).events  # the parser's events, read as such
    assert [e["payload"]["state"] for e in saving] == ["begin"]
    h.st.ingest_events("agent-a", saving)
    h.observe(3)
    h.st.stalls.tick(h.st, JOB, h.silent_for(30.0))
    assert h.incidents() == [] and overview_of(h.st.snapshot(JOB))["state"] == RUNNING  # type: ignore[index]
    saved = parse_lines(["  [2026-11-23 16:21:35.529378] successfully saved checkpoint from iteration"
                         "      20 to /ckpt [ t 1/1 ]"], job=JOB).events
    h.st.ingest_events("agent-a", saved)
    h.observe()
    now = h.silent_for(30.0)
    # Right after the save the silence counts from its end: the steps come seconds after it.
    assert h.st.stalls.tick(h.st, JOB, now).status.value == "running"
    check = h.st.stalls.tick(h.st, JOB, now + 6.0)
    # The save ended 6 s ago and still no step: now the idle ranks are a stall (their loops only sleep).
    assert check.status.value == "stalled"
    (inc,) = h.incidents()
    assert inc["evidence"]["stall"]["reasons"] == ["idle"] and inc["first_iteration"] == 21


def test_malformed_host_events_are_counted_not_kept() -> None:
    st = AggregatorState()
    st.ingest_events("a", [
        {"kind": events.RANK_PROCESSES.name, "payload": {"job": "j", "ranks": "nope"}},
        {"kind": events.JOB_PHASE.name, "payload": {"job": "j", "phase": "lunch", "state": "begin"}},
        {"kind": events.RANK_STACKS.name, "payload": {"job": "j", "ranks": []}},
        {"kind": events.RANK_PROCESSES.name, "labels": {"node": "n"},
         "payload": {"job": "j", "ranks": [{"rank": 0, "pid": 5, "state": "running"}, {"rank": "x"}]}},
    ])
    assert st.stats_json()["events_malformed"] == {
        events.RANK_PROCESSES.name: 1, events.JOB_PHASE.name: 1, events.RANK_STACKS.name: 1}
    assert list(st.hosts.observations("j")) == [0]  # the bad rank entry left out
    assert st.recent_events() == []  # state, not history


@pytest.mark.slow
def test_steps_held_in_the_stopped_process_arrive_after_it_and_the_stall_is_counted_once(ranks: Any) -> None:
    """The step hook's records of the last steps before a stop sit in the stopped process (its sender
    stops too) and arrive with the steps after it: the slow iteration is any of them, not the one
    after the last record seen."""
    h = Harness(ranks)
    h.records(20)
    os.kill(ranks[0].pid, signal.SIGSTOP)
    h.observe()
    h.st.stalls.tick(h.st, JOB, h.silent_for(9.0))
    ((_, stall),) = [(i["id"], i) for i in h.incidents()]
    assert stall["first_iteration"] == 21 and stall["open"]
    os.kill(ranks[0].pid, signal.SIGCONT)
    h.observe()
    recs = h.parsed.records
    slow = dataclasses.replace(recs[23], step_time_ms=(recs[23].step_time_ms or 0.0) + 9000.0)
    h.ingest([*recs[20:23], slow, *recs[24:]])  # 21-23 held, 24 took the stop
    h.st.refresh()
    h.st.refresh()
    (inc,) = h.incidents()
    assert inc["first_iteration"] <= 24 <= inc["last_iteration"] and "stall" in inc["kinds"]
    assert inc["verdict"]["cause"] == "process_stopped"
    # Counted once: the larger of the slow step's 9 s and the silence as the aggregator timed it (the
    # test's 9 s, plus the wall time the test took to deliver the records: ~1 s more seen under load).
    parts = inc["cost_parts"]
    assert parts["steps_s"] == pytest.approx(9.0, abs=0.5) and parts["silence_s"] < 9.0 + 10.0
    assert inc["cost_s"] == max(parts["steps_s"], parts["silence_s"])
    lost = {name: v for lab, name, v in h.st.incidents.metric_rows() if lab.get("job_name") == JOB}
    assert lost["perfd_job_incident_lost_seconds_total"] == pytest.approx(inc["cost_s"], abs=0.6)
    assert lost["perfd_job_incidents_total"] == 1.0


def test_a_pending_collective_corroborates_a_stall_of_busy_ranks(tmp_path: Path) -> None:
    """Ranks spinning (as a rank does while NCCL waits for a peer) are not idle; what says the job is
    stuck is the Flight Recorder: the recorded dumps of a real hung DDP job (rank 1 never joined),
    through the real agent and aggregator path; each rank's newest collective joins the stall."""
    from perfd.agent.config import AgentConfig
    from perfd.agent.node_agent import Agent
    from perfd.aggregator.daemon import Aggregator, AggregatorConfig
    from tests.collectives.test_collectives_aggregator import (
        FakeClient,
        _recorded_hang_collected,
        _through_wire,
    )

    out, _ = _recorded_hang_collected(tmp_path)
    agent = Agent(AgentConfig(job="ddp", node="n1", metrics_port=None))
    agent.client = FakeClient()
    agent._forward([("nccl", out)])
    agg = Aggregator(AggregatorConfig(rules_files=[]))
    st = agg.state
    agg.on_batch("n1", _through_wire(agent.client.calls[0]))
    parsed = parse_file(DP2, job="ddp")  # a real job's step records, for the job's cadence
    st.ingest_steps("n1", parsed.records)
    st.analysis("ddp", force=True)
    spin = "import sys\nwhile True: pass\n"
    ps = [subprocess.Popen([sys.executable, "-c", spin], start_new_session=True) for _ in range(2)]
    try:
        c = RanksCollector({"job": "ddp", "event_every_s": 0})
        for rank, p in enumerate(ps):
            c.note(p.pid, rank, "gpu")
        c.collect(time.time())

        def busy_reading() -> list[dict[str, Any]] | None:
            # The premise, as the collector reads it: both spinners over the idle bound. Under two
            # suites at once a 2-CPU machine can run 20 processes, and a 0.5 s window then gives a
            # spinner less than 5% of a core (both ranks read idle, in both suites at once); the
            # next windows give it its share again.
            time.sleep(0.5)
            evs = c.collect(time.time()).events
            rows = [r for e in evs for r in e["payload"]["ranks"]]
            ok = len(rows) == 2 and all((r.get("cpu_cores") or 0.0) >= IDLE_CPU_CORES for r in rows)
            return evs if ok else None

        got = wait_for(busy_reading, 60, "both spinners read over the idle bound", interval=0)
        st.ingest_events("n1", [{**e, "labels": {"node": "n1"}, "payload": _started_before(e["payload"])}
                                for e in got])
        arrived_ago(st, "n1", "ddp", 8.0)
        check = st.stalls.tick(st, "ddp")
    finally:
        for p in ps:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    assert check.status.value == "stalled" and check.reasons == (StallReason.PENDING_COLLECTIVE,)
    (inc,) = [i for i in st.incidents.incidents("ddp") if i["kinds"] == ["stall"]]
    colls = inc["evidence"]["stall"]["collectives"]
    # Each rank's last completed op (the dumps' records) and the one it is stuck in or never reached.
    assert {r: c["last"]["seq"] for r, c in colls.items()} == {"0": 3, "1": 3}
    assert colls["0"]["pending"]["op"] == "all_reduce" and colls["0"]["pending"]["seq"] == 4
    assert colls["1"]["not_joined"]["seq"] == 4 and "pending" not in colls["1"]
    assert "a collective pending in the Flight Recorder" in inc["cause"]


def test_a_stall_a_restart_left_open_is_closed_once_the_job_steps(ranks: Any) -> None:
    h = Harness(ranks)
    h.records(20)
    os.kill(ranks[0].pid, signal.SIGSTOP)
    h.observe()
    h.st.stalls.tick(h.st, JOB, h.silent_for(7.0))
    kept = h.st.incidents.export()  # what --state-dir keeps; the aggregator restarts
    os.kill(ranks[0].pid, signal.SIGCONT)
    again = Harness(ranks)
    again.st.incidents.load(kept)
    again.records(30)  # it resumed while the aggregator was down: no slow step left to take it over
    (inc,) = again.incidents()
    assert inc["kinds"] == ["stall"] and inc["open"]
    again.st.stalls.tick(again.st, JOB, again.silent_for(0.5))
    (inc,) = again.incidents()
    assert not inc["open"] and inc["verdict"]["cause"] == "process_stopped"
    assert [e["kind"] for e in again.st.recent_events(JOB)] == [events.INCIDENT_CLOSED.name]


def _end_job(h: Harness, ranks: Any) -> None:
    """The ranks exit (killed and reaped) and the agent's collector says so."""
    for p in ranks:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
    h.observe()


@pytest.mark.slow
def test_the_silence_of_a_jobs_exit_is_taken_back_not_an_incident(ranks: Any) -> None:
    """A plain PyTorch job on the H100
    (docs/evidence/entries/26-plain-pytorch-loops-no-rank-irregular-steps-a-data-bound-loa.md) spent 16 s
    after its last step tearing down its loader and CUDA: a stall opened 5 s in and closed at its exit,
    listed as 'stalled ... 0.0 s lost'.
    The exit within STALL_EXIT_GRACE_S of the last step is not a stall: the incident is taken back."""
    h = Harness(ranks)
    h.records(20)
    for p in ranks:
        os.kill(p.pid, signal.SIGSTOP)  # idle, as a process tearing down reads
    h.observe()
    h.st.stalls.tick(h.st, JOB, h.silent_for(7.0))
    assert [i["kinds"] for i in h.incidents()] == [["stall"]]
    got: list[dict[str, Any]] = []
    h.st.incidents.emit = got.extend
    _end_job(h, ranks)
    h.st.stalls.tick(h.st, JOB, h.silent_for(16.0))
    assert h.incidents() == [] and h.st.stalls.stalled(JOB) is None
    (closed,) = [e for e in got if e["kind"] == events.INCIDENT_CLOSED.name]
    assert closed["payload"]["withdrawn"] == "job_exit"


@pytest.mark.slow
def test_a_job_silent_past_the_exit_grace_then_gone_keeps_its_stall_with_the_silence(ranks: Any) -> None:
    h = Harness(ranks)
    h.records(20)
    for p in ranks:
        os.kill(p.pid, signal.SIGSTOP)
    h.observe()
    h.st.stalls.tick(h.st, JOB, h.silent_for(300.0))  # hung for five minutes (its last record then) ...
    _end_job(h, ranks)  # ... then killed
    h.st.stalls.tick(h.st, JOB, time.time())
    h.st.stalls.tick(h.st, JOB, time.time() + 1)
    (inc,) = h.incidents()
    assert inc["kinds"] == ["stall"] and not inc["open"]
    assert inc["cost_s"] == pytest.approx(300.0 - inc["evidence"]["stall"]["cadence_s"], abs=2.0)
