"""Rules wait for a ready target: a firing capture rule sends nothing, and takes no
budget, while the job's latest steps are warm-up or (for ncu) the target rank's step hook has sent no
record lately; a capture its agent reports as not ready (a typed cause, never a sentence) gives the
rule its budget back, so no cooldown holds the retry, and is asked again after a pause."""

from __future__ import annotations

from pathlib import Path

from perfd.aggregator.capture_ready import RETRY_FIRST_S
from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.state import AggregatorState
from perfd.collectors.megatron import parse_file
from perfd.core.clock import ManualClock
from perfd.core.model import CaptureFailure, Provenance, StepRecord
from perfd.rules.evaluator import NOT_READY, RuleEngine, TargetWait
from perfd.rules.pack_loader import parse_pack
from perfd.transport.codec import Command

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"


def _pack(tool: str = "kineto", targets: str = "{slowest_rank: true}") -> str:
    return f"""
rules:
  - name: forced
    expr: mfu < 100%
    for: 0s
    action:
      type: capture
      tool: {tool}
      targets: {targets}
      steps: 1
      cooldown: 1h
      max_per_hour: 4
"""


def _state(clock: ManualClock, records: int | None = None) -> AggregatorState:
    st = AggregatorState(gpu_override="NVIDIA H200", min_recompute_s=0.0, clock=clock)
    parsed = parse_file(LOG, job="j")
    st.hello("agent-1", ["j"])
    st.ingest_job_info("agent-1", "j", parsed.job_info)
    st.ingest_steps("agent-1", parsed.records[:records] if records is not None else parsed.records)
    return st



def _coordinator(st: AggregatorState, sent: list[Command], pack: str, clock: ManualClock
                 ) -> CaptureCoordinator:
    rules, errors = parse_pack(pack, "test.yaml")
    assert rules is not None, errors

    def send(agent: str, cmd: Command) -> bool:
        sent.append(cmd)
        return True

    return CaptureCoordinator(st, RuleEngine(rules.rules), send, clock=clock)


def _report(st: AggregatorState, cid: str, kind: str, cause: CaptureFailure | None) -> None:
    payload = {"status": "failed" if kind == "capture_failed" else "ok", "reason": "x"}
    if cause is not None:
        payload["cause"] = cause.value
    st.ingest_events("agent-1", [{"kind": kind, "text": "rank 1: the step hook is unreachable",
                                  "links": {"command_id": cid}, "payload": payload}])


def test_a_capture_whose_target_was_not_ready_takes_no_cooldown_and_is_asked_again():
    clock = ManualClock(1000.0)
    st = _state(clock)
    sent: list[Command] = []
    co = _coordinator(st, sent, _pack(), clock)
    co.evaluate(now=1000.0)
    assert len(sent) == 1
    _report(st, sent[0].id, "capture_failed", CaptureFailure.NOT_READY)
    rec = co.list()[0]
    assert rec["status"] == "failed" and rec["cause"] == "not_ready"
    assert co.engine is not None and co.engine.captures_in_last_hour("forced", "j", 1000.0) == 0
    # asked again after a pause, not at once (the agent just said no), and not after the hour's cooldown
    (f,) = co.evaluate(now=1001.0)
    assert len(sent) == 1 and f.suppressed_reason == NOT_READY and f.waiting is TargetWait.RETRY
    co.evaluate(now=1000.0 + RETRY_FIRST_S + 0.1)
    assert len(sent) == 2
    _report(st, sent[1].id, "capture_finished", None)
    assert co.list()[-1]["status"] == "finished" and co.list()[-1]["cause"] is None
    (f,) = co.evaluate(now=1100.0)  # this one ran: the cooldown holds now
    assert len(sent) == 2 and f.suppressed_reason == "cooldown"


def test_a_real_failure_keeps_the_cooldown():
    clock = ManualClock(1000.0)
    st = _state(clock)
    sent: list[Command] = []
    co = _coordinator(st, sent, _pack(), clock)
    co.evaluate(now=1000.0)
    _report(st, sent[0].id, "capture_failed", CaptureFailure.FAILED)
    assert co.list()[0]["cause"] == "failed"
    (f,) = co.evaluate(now=1100.0)
    assert len(sent) == 1 and f.suppressed_reason == "cooldown"


def test_no_capture_on_warm_up_steps_and_none_of_the_budget_taken():
    clock = ManualClock(1000.0)
    st = _state(clock, records=2)
    sent: list[Command] = []
    co = _coordinator(st, sent, _pack(), clock)
    (f,) = co.evaluate(now=1000.0)
    assert f.suppressed_reason == NOT_READY and f.waiting is TargetWait.WARMUP and not sent
    assert f.to_dict()["waiting"] == "warmup"
    assert co.engine is not None and co.engine.captures_in_last_hour("forced", "j", 1000.0) == 0
    parsed = parse_file(LOG, job="j")
    st.ingest_steps("agent-1", parsed.records[2:10])
    co.evaluate(now=1005.0)
    assert len(sent) == 1


def _hook_step(rank: int, pid: str) -> StepRecord:
    """A step hook's record of ``rank`` at the log's first iteration (held, and not the latest: the
    rule's values stay the log's)."""
    first = parse_file(LOG, job="j").records[0].iteration
    return StepRecord(job="j", iteration=first, rank=rank, step_time_ms=500.0,
                      source=Provenance("hook", "test"), fields={"pid": pid})


def test_an_ncu_rule_waits_for_the_target_ranks_step_hook():
    t = 1000.0  # the clock's: the job's steps arrive then, and it runs
    clock = ManualClock(t)
    st = _state(clock)
    sent: list[Command] = []
    co = _coordinator(st, sent, _pack("ncu", "{ranks: [0]}"), clock)
    (f,) = co.evaluate(now=t)
    assert f.waiting is TargetWait.NO_HOOK and not sent  # the job's log steps, no hook record of rank 0
    st.ingest_steps("agent-1", [_hook_step(1, "77")], now=t + 1)
    (f,) = co.evaluate(now=t + 2)
    assert f.waiting is TargetWait.NO_HOOK and not sent  # rank 1's hook, not rank 0's
    st.ingest_steps("agent-1", [_hook_step(0, "76")], now=t + 3)
    co.evaluate(now=t + 4)
    assert len(sent) == 1 and sent[0].ranks == (0,) and sent[0].args["tool"] == "ncu"


def test_a_hook_silent_since_a_restart_is_not_ready():
    """The old run's hook record is there, but long ago: the rank restarting under ncu has no hook yet."""
    t = 1000.0
    clock = ManualClock(t)
    st = _state(clock)
    sent: list[Command] = []
    co = _coordinator(st, sent, _pack("ncu", "{ranks: [0]}"), clock)
    st.ingest_steps("agent-1", [_hook_step(0, "76")], now=t - 100)
    st.ingest_steps("agent-1", [_hook_step(1, "77")], now=t)
    (f,) = co.evaluate(now=t)
    assert f.waiting is TargetWait.NO_HOOK and not sent
