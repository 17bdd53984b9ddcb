"""The aggregator's time-dependent parts on one clock (perfd.core.clock): a test moves a ManualClock and
ticks, and what each part decides changes exactly when the clock passes its threshold, not before. No test
here waits for real time: the job's steps arrive at the clock's time, and every reading is the clock's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.snapshot import overview_of
from perfd.aggregator.state import AggregatorState
from perfd.analytics.incidents.evidence import StallReason
from perfd.analytics.incidents.stall import Status
from perfd.analytics.steps.liveness import ENDED, RUNNING, STALLED
from perfd.collectors.megatron import parse_file
from perfd.core import events
from perfd.core import limits as L
from perfd.core.clock import REAL_CLOCK, ManualClock
from perfd.rules.evaluator import RuleEngine
from perfd.rules.pack_loader import load_pack

ROOT = Path(__file__).resolve().parents[1]
DP2 = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
JOB = "dp2"
STALE_S = 30.0  # the job's stale limit here (--job-stale-after)


def _fed(st: AggregatorState) -> AggregatorState:
    """The DP2 log's records, arrived now (the state's clock), and analysed."""
    parsed = parse_file(DP2, job=JOB)
    st.hello("a", [JOB])
    st.ingest_job_info("a", JOB, parsed.job_info)
    st.ingest_steps("a", parsed.records)
    st.analysis(JOB, force=True)
    return st


def _gpus(st: AggregatorState, alive: bool) -> None:
    """The job's two ranks on their GPUs (or gone from them), as NVML's process lists say."""
    procs = [{"pid": 10 + r, "name": "python", "cmdline": "python pretrain_gpt.py", "rank": r}
             for r in (0, 1)]
    st.ingest_events("a", [{"kind": events.GPU_PROCESSES.name, "labels": {"node": "n", "gpu": str(r)},
                            "payload": [procs[r]] if alive else []} for r in (0, 1)])


def _state(st: AggregatorState) -> str:
    ov = overview_of(st.snapshot(JOB))
    assert ov is not None
    return str(ov["state"])


def test_the_manual_clock_moves_only_when_told() -> None:
    c = ManualClock(100.0, monotonic=5.0)
    assert (c.time(), c.monotonic()) == (100.0, 5.0) == (c.time(), c.monotonic())
    assert c.advance(2.5) == 102.5 and c.monotonic() == 7.5
    assert c.set(90.0) == 90.0 and c.monotonic() == 7.5  # the wall clock steps back; the monotonic does not
    assert c.set(100.0) == 100.0 and c.monotonic() == 17.5
    with pytest.raises(ValueError, match="backwards"):
        c.advance(-1.0)
    assert REAL_CLOCK.monotonic() <= REAL_CLOCK.monotonic()


def test_a_job_goes_stale_exactly_when_the_clock_passes_its_limit() -> None:
    clock = ManualClock()
    st = _fed(AggregatorState(min_recompute_s=0.0, job_stale_after_s=STALE_S, clock=clock))
    _gpus(st, alive=True)
    assert _state(st) == RUNNING
    clock.advance(STALE_S)
    assert _state(st) == RUNNING  # at the limit: not past it
    clock.advance(0.01)
    assert _state(st) == STALLED  # its processes still on their GPUs: hung
    _gpus(st, alive=False)
    assert _state(st) == ENDED


def test_a_stall_opens_when_the_clock_passes_the_silence_limit_and_its_incident_is_dated_by_it() -> None:
    clock = ManualClock()
    st = _fed(AggregatorState(min_recompute_s=0.0, clock=clock))
    first = st.stalls.tick(st, JOB)  # no ``now``: the clock's
    assert first.status is Status.RUNNING and first.silent_s == 0.0 and first.limit_s is not None
    limit = first.limit_s

    def stopped_rank() -> None:
        now = clock.time()
        st.ingest_events("a", [{"kind": events.RANK_PROCESSES.name, "job": JOB, "time": now,
                                "labels": {"node": "n"}, "payload": {"job": JOB, "interval_s": 1.0, "ranks": [
                                    {"rank": 0, "pid": 4242, "source": "gpu", "state": "stopped",
                                     "state_since": now - 1.0, "observed_at": now, "started_at": now - 3600.0,
                                     "cpu_cores": 0.0}]}}])

    clock.advance(limit)
    stopped_rank()
    check = st.stalls.tick(st, JOB)
    assert check.status is Status.RUNNING and check.silent_s == pytest.approx(limit)  # at the limit
    assert st.stalls.stalled(JOB) is None
    clock.advance(0.01)
    check = st.stalls.tick(st, JOB)
    assert check.status is Status.STALLED and check.reasons == (StallReason.STOPPED,)
    assert st.stalls.stalled(JOB) is not None
    (inc,) = [i for i in st.incidents.typed_incidents(JOB) if "stall" in i.kinds]
    assert inc.open and inc.first_seen == clock.time()  # detected at the tick, on the clock


def test_the_stalled_rule_fires_once_the_clock_has_held_it_for_its_minute() -> None:
    """rules/default.yaml ``job_stalled`` (stalled_seconds > 0 for 1m), evaluated with no ``now``: the
    rules' time is the clock's, as the job's liveness is."""
    clock = ManualClock()
    st = _fed(AggregatorState(min_recompute_s=0.0, job_stale_after_s=STALE_S, clock=clock))
    _gpus(st, alive=True)
    pack = load_pack(str(ROOT / "rules" / "default.yaml"))
    coord = CaptureCoordinator(st, RuleEngine([r for r in pack.rules if r.name == "job_stalled"], clock),
                               lambda agent, cmd: True, clock=clock)
    assert coord.evaluate() == []
    clock.advance(STALE_S + 0.01)  # stalled from here: the rule is pending
    assert coord.evaluate() == []
    clock.advance(59.99)
    assert coord.evaluate() == []  # held for 59.99 s
    clock.advance(0.01)
    assert [(f.rule.name, f.key, f.new) for f in coord.evaluate()] == [("job_stalled", JOB, True)]


def test_an_ended_job_is_pruned_at_the_tick_the_clock_passes_its_retention() -> None:
    """The aggregator's tick (what its rules loop runs) with its retention on the clock: a job with
    no GPU process lists ends at its stale limit and is pruned ``job_retention_s`` after its last step."""
    clock = ManualClock()
    limits = dataclasses.replace(L.Limits(), job_retention_s=100.0)
    agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], job_stale_after_s=STALE_S,
                                      limits=limits), clock=clock)
    agg.on_hello_jobs("a", [JOB])
    _fed(agg.state)
    agg.tick()
    assert _state(agg.state) == RUNNING
    clock.advance(99.99)
    agg.tick()
    assert _state(agg.state) == ENDED and JOB in agg.state.job_names() and agg.lifecycle.jobs_pruned == 0
    clock.advance(0.01)
    agg.tick()
    assert JOB not in agg.state.job_names() and agg.lifecycle.jobs_pruned == 1
