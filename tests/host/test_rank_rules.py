"""Rules read a job's rank processes and its live stall: rank-scope rules on the host series (the
ranks collector's recorded observations of real processes, tests/data/host) fire for the rank they
describe, and a job-scope rule on stalled_seconds fires on a live stall within the aggregator's tick
(a real DP=2 Megatron log's records, the job made silent on the test's clock)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.snapshot import overview_of
from perfd.aggregator.state import AggregatorState
from perfd.collectors.megatron import parse_file
from perfd.core import events
from perfd.rules.evaluator import RuleEngine
from perfd.rules.pack_loader import parse_pack_checked
from tests.silence import arrived_ago

ROOT = Path(__file__).resolve().parents[2]
REC = json.loads((ROOT / "tests" / "data" / "host" / "rank_observations.json").read_text())
RULES = """
rules:
  - name: rank_waits
    expr: rank_cpu_wait > 0.5
    scope: rank
  - name: rank_stopped
    expr: present(perfd_host_rank_state_info{process_state="stopped"})
    scope: rank
  - name: rank_one_cpu
    expr: perfd_host_rank_allowed_cpus == 1
    scope: rank
  - name: stalled_now
    expr: stalled_seconds > 0
"""


def _state(observations: list[dict[str, Any]]) -> AggregatorState:
    parsed = parse_file(ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log", job="dp2")
    st = AggregatorState(min_recompute_s=0.0)
    st.hello("a", ["dp2"])
    st.ingest_job_info("a", "dp2", parsed.job_info)
    st.ingest_steps("a", parsed.records)
    st.analysis("dp2", force=True)
    st.ingest_events("a", [{"kind": events.RANK_PROCESSES.name, "labels": {"node": "n1"},
                            "payload": {"job": "dp2", "ranks": observations}}])
    return st


def _fired(st: AggregatorState, now: float) -> set[tuple[str, Any]]:
    pack, errors, warnings = parse_pack_checked(RULES, "rules.yaml")
    assert pack is not None and not errors and not warnings, (errors, warnings)
    coord = CaptureCoordinator(st, RuleEngine(pack.rules), lambda agent, cmd: True)
    return {(f.rule.name, f.key) for f in coord.evaluate(now) if f.new}


def test_rank_scope_rules_read_each_ranks_host_series() -> None:
    cont = REC["contention"]["ranks"][0]
    stopped = {**REC["stopped"]["ranks"][0], "rank": 1, "observed_at": time.time()}
    st = _state([{**cont, "observed_at": time.time()}, stopped])
    fired = _fired(st, time.time())
    assert ("rank_waits", ("dp2", 0)) in fired and ("rank_waits", ("dp2", 1)) not in fired
    assert ("rank_stopped", ("dp2", 1)) in fired and ("rank_stopped", ("dp2", 0)) not in fired
    assert {("rank_one_cpu", ("dp2", 0)), ("rank_one_cpu", ("dp2", 1))} <= fired
    assert not any(name == "stalled_now" for name, _ in fired)  # the job steps


def test_a_job_rule_on_stalled_seconds_fires_on_a_live_stall() -> None:
    stopped = {**REC["stopped"]["ranks"][0], "rank": 1}
    st = _state([{**REC["calm"]["ranks"][0]}, stopped])
    arrived_ago(st, "a", "dp2", 8.0)  # silent past the floor (5 s)
    st.refresh()  # the aggregator's tick: the stall opens
    assert overview_of(st.snapshot("dp2"))["state"] == "stalled"  # type: ignore[index]
    assert ("stalled_now", "dp2") in _fired(st, time.time())
