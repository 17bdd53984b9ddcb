"""A job that stops stepping leaves /metrics: the real aggregator and agent (in the test's process,
tests/inproc.py), a Megatron log that stops growing.
Liveness (perfd.analytics.steps.liveness): running → ended (no GPU processes known) here;
stalled vs ended from the GPU process lists is checked on the aggregator state below."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfd.aggregator.http import _StateCollector
from perfd.aggregator.snapshot import overview_of
from perfd.aggregator.state import AggregatorState
from perfd.analytics.steps.liveness import ENDED, RUNNING, STALLED, job_state, stale_after
from perfd.collectors.megatron import parse_file
from perfd.core import events
from tests.inproc import pipeline
from tests.silence import arrived_ago

ROOT = Path(__file__).resolve().parents[2]
DP2 = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"


STALE_S = 30.0  # the tests' job stale limit (see the first test using it)


def test_stale_after_and_states() -> None:
    assert stale_after(0.5) == 60.0 and stale_after(20.0) == 200.0 and stale_after(None, 5.0) == 5.0
    assert job_state(3.0, 0.5, True)[0] == RUNNING
    assert job_state(100.0, 0.5, True)[0] == STALLED
    assert job_state(100.0, 0.5, False)[0] == ENDED
    state, why = job_state(100.0, 0.5, None)
    assert state == ENDED and "without NVML" in why


def _metrics(st: AggregatorState) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    reg.register(_StateCollector(st))
    return generate_latest(reg).decode()


def test_a_hung_job_is_stalled_an_exited_one_ended_and_both_leave_the_derived_gauges() -> None:
    parsed = parse_file(DP2, job="dp2")
    # Steps arrive and the state is read on the wall clock: the limit is far above a busy machine's pause
    # between the two (a 5 s limit read a worker paused 5 s as a stall) and far below the minute below.
    st = AggregatorState(min_recompute_s=0.0, job_stale_after_s=STALE_S)
    st.hello("a", ["dp2"])
    st.ingest_job_info("a", "dp2", parsed.job_info)
    st.ingest_steps("a", parsed.records)
    procs = [{"pid": 10 + r, "name": "python", "cmdline": "python pretrain_gpt.py", "rank": r}
             for r in (0, 1)]
    st.ingest_events("a", [{"kind": events.GPU_PROCESSES.name, "labels": {"node": "n", "gpu": str(r)},
                            "payload": [procs[r]]} for r in (0, 1)])
    st.analysis("dp2", force=True)
    assert overview_of(st.snapshot("dp2"))["state"] == RUNNING  # type: ignore[index]
    assert 'perfd_job_step_time_seconds{job_name="dp2"}' in _metrics(st)
    arrived_ago(st, "a", "dp2", 60.0)  # a minute without a step, processes still there
    ov = overview_of(st.snapshot("dp2"))
    assert ov is not None and ov["state"] == STALLED and "hung" in ov["state_reason"]
    text = _metrics(st)
    assert 'perfd_job_state_info{job_name="dp2",state="stalled"} 1.0' in text
    assert 'perfd_job_step_time_seconds{job_name="dp2"}' not in text
    assert 'perfd_job_last_step_timestamp_seconds{job_name="dp2"}' in text
    st.ingest_events("a", [{"kind": events.GPU_PROCESSES.name, "labels": {"node": "n", "gpu": str(r)},
                            "payload": []} for r in (0, 1)])
    assert overview_of(st.snapshot("dp2"))["state"] == ENDED  # type: ignore[index]


@pytest.mark.slow
def test_a_job_that_stops_leaves_metrics_through_the_live_pipeline(tmp_path: Path) -> None:
    with pipeline(tmp_path, "--gpu", "NVIDIA H200", "--job-stale-after", "10",
                  "--rules-interval", "0.5") as p:
        log = tmp_path / "train.log"
        log.write_text(DP2.read_text())
        p.agent("--job", "live", "--megatron-log", log, "--nvml", "off", "--host", "off",
                "--metrics-port", "-1")

        seen: dict[str, dict[str, object]] = {}

        def state(n: int | None = None) -> str | None:
            jobs = p.json("/api/jobs")["jobs"]
            job = next((j for j in jobs if j and j["job"] == "live"
                        and (n is None or j["iterations_seen"] == n)), None)
            if job is not None:
                seen[job["state"]] = job
            return job["state"] if job is not None else None

        # Running from its first records on, for 10 s after its last; the log's 30 iterations, then
        # ended: each state at the age of the last step the aggregator gave with it (its own clock, not
        # the test's polls, which a loaded machine delays by seconds)
        series = 'perfd_job_step_time_seconds{job_name="live"}'
        assert p.wait(lambda: state() == RUNNING and series in p.get("/metrics").decode(), 30,
                      "the running job's step time exported")
        assert p.wait(lambda: state(30) == ENDED, 40, "the job ended (no step for 10 s, no NVML)")
        running, ended = seen[RUNNING]["last_step_age_s"], seen[ENDED]["last_step_age_s"]
        assert isinstance(running, float) and isinstance(ended, float) and running < 10.0 <= ended
        text = p.get("/metrics").decode()
        assert 'perfd_job_step_time_seconds{job_name="live"}' not in text
        assert 'perfd_job_state_info{job_name="live",state="ended"} 1.0' in text


def test_the_shipped_job_stalled_rule_fires_on_a_hang_and_not_on_an_ended_job() -> None:
    """rules/default.yaml `job_stalled` (stalled_seconds > 0 for 1m) through the aggregator's own
    rule evaluation: a job that stops stepping with its processes on their GPUs fires after the
    minute; the same job with its processes gone (ended) does not."""
    import time as _time

    from perfd.aggregator.captures import CaptureCoordinator
    from perfd.rules.evaluator import RuleEngine
    from perfd.rules.pack_loader import load_pack

    parsed = parse_file(DP2, job="dp2")
    st = AggregatorState(min_recompute_s=0.0, job_stale_after_s=STALE_S)
    st.hello("a", ["dp2"])
    st.ingest_job_info("a", "dp2", parsed.job_info)
    st.ingest_steps("a", parsed.records)

    def gpus(alive: bool) -> None:
        procs = [{"pid": 10 + r, "name": "python", "cmdline": "python pretrain_gpt.py", "rank": r}
                 for r in (0, 1)]
        st.ingest_events("a", [{"kind": events.GPU_PROCESSES.name, "labels": {"node": "n", "gpu": str(r)},
                                "payload": [procs[r]] if alive else []} for r in (0, 1)])

    gpus(True)
    st.analysis("dp2", force=True)
    pack = load_pack(str(ROOT / "rules" / "default.yaml"))
    coord = CaptureCoordinator(st, RuleEngine([r for r in pack.rules if r.name == "job_stalled"]),
                               lambda agent, cmd: True)
    t0 = _time.time()
    assert coord.evaluate(t0) == [] and st.snapshot("dp2").stalled_seconds() == 0.0  # type: ignore[union-attr]  # running: 0, not absent
    arrived_ago(st, "a", "dp2", 60.0)  # no step for a minute, processes still there
    assert (st.snapshot("dp2").stalled_seconds() or 0) >= 55  # type: ignore[union-attr]
    assert [f.rule.name for f in coord.evaluate(t0 + 1) if f.new] == []  # pending: for 1m
    fired = [f for f in coord.evaluate(t0 + 62) if f.new]
    assert [(f.rule.name, f.key) for f in fired] == [("job_stalled", "dp2")]
    assert 'perfd_job_stalled_seconds{job_name="dp2"}' in _metrics(st)
    gpus(False)  # the processes left: the job ended, it is not hung
    assert st.snapshot("dp2").stalled_seconds() is None  # type: ignore[union-attr]
    assert coord.evaluate(t0 + 124) == [] and "perfd_job_stalled_seconds" not in _metrics(st)
