"""The rule engine: for: timing (Prometheus semantics), capture budgets, the capture arbiter."""

from __future__ import annotations

import textwrap

import pytest

from perfd.core.clock import ManualClock
from perfd.rules.evaluator import CaptureArbiter, Firing, RuleEngine, ScopeKey, job_of, scope_of
from perfd.rules.pack_loader import parse_pack
from perfd.rules.rule_types import Rule

MFU = "perfd_job_mfu_ratio"
STRAG = "perfd_job_straggler_rtt_spread_times"  # alias straggler_ratio; the old name is deprecated
RANK_RATIO = "perfd_job_rank_compute_ratio"
GIB = 2**30


def rules(text: str) -> list[Rule]:
    pack, errors = parse_pack(textwrap.dedent(text).lstrip("\n"), "test.yaml")
    assert not errors, [str(e) for e in errors]
    assert pack is not None
    return list(pack.rules)


LOW = {"j": {MFU: 0.2}}
HIGH = {"j": {MFU: 0.5}}


def alert_engine(for_: str = "5m") -> RuleEngine:
    return RuleEngine(rules(f"""
        rules:
          - name: low
            expr: mfu < 30%
            for: {for_}
            severity: critical
            labels: {{team: ml}}
            annotations: {{summary: low mfu}}
    """))


def capture_engine(**action: object) -> RuleEngine:
    opts = {"cooldown": "0s", "max_per_hour": 100, **action}
    body = ", ".join(f"{k}: {v}" for k, v in opts.items())
    return RuleEngine(rules(f"""
        rules:
          - name: cap
            expr: mfu < 30%
            action: {{type: capture, tool: kineto, targets: {{ranks: [0]}}, {body}}}
    """))


# --- for: -------------------------------------------------------------------------------------
def test_pending_then_firing_then_resolved() -> None:
    eng = alert_engine("5m")
    assert eng.evaluate(0.0, LOW) == []  # pending
    assert [s.state for s in eng.states()] == ["pending"]
    assert eng.evaluate(299.0, LOW) == []
    [f] = eng.evaluate(300.0, LOW)  # held for exactly `for`: fires (>=, as Prometheus)
    assert (f.rule.name, f.key, f.since, f.firing_since, f.new) == ("low", "j", 0.0, 300.0, True)
    assert f.values == {MFU: 0.2} and f.severity == "critical" and f.labels == {"team": "ml"}
    assert f.annotations.summary == "low mfu" and f.action.type == "alert"
    assert not f.capture_allowed and f.suppressed_reason is None
    [f2] = eng.evaluate(310.0, {"j": {MFU: 0.1}})
    assert not f2.new and f2.since == 0.0 and f2.values == {MFU: 0.1}
    assert eng.evaluate(320.0, HIGH) == []  # resolved
    assert [(s.rule, s.key, s.state) for s in eng.last_resolved] == [("low", "j", "firing")]
    assert eng.states() == []
    # A new episode waits the full `for` again.
    assert eng.evaluate(330.0, LOW) == []
    assert eng.evaluate(629.0, LOW) == []
    [f3] = eng.evaluate(630.0, LOW)
    assert f3.new and f3.since == 330.0


def test_a_false_evaluation_while_pending_resets_the_wait() -> None:
    eng = alert_engine("60s")
    eng.evaluate(0.0, LOW)
    eng.evaluate(30.0, HIGH)
    assert [s.state for s in eng.last_resolved] == ["pending"]
    eng.evaluate(40.0, LOW)
    assert eng.evaluate(90.0, LOW) == []
    assert len(eng.evaluate(100.0, LOW)) == 1


def test_for_zero_fires_at_once() -> None:
    eng = alert_engine("0s")
    [f] = eng.evaluate(5.0, LOW)
    assert f.new and f.since == f.firing_since == 5.0


def test_absent_metric_or_missing_scope_resolves_and_never_fires() -> None:
    eng = alert_engine("0s")
    assert eng.evaluate(0.0, {"j": {}}) == []
    assert eng.evaluate(1.0, {"j": {MFU: None}}) == []
    eng.evaluate(2.0, LOW)
    assert eng.evaluate(3.0, {}) == []  # the job disappeared
    assert [s.key for s in eng.last_resolved] == ["j"]


def test_each_scope_key_has_its_own_state() -> None:
    eng = alert_engine("10s")
    eng.evaluate(0.0, {"a": {MFU: 0.1}})
    eng.evaluate(5.0, {"a": {MFU: 0.1}, "b": {MFU: 0.1}})
    fired = eng.evaluate(10.0, {"a": {MFU: 0.1}, "b": {MFU: 0.1}})
    assert [f.key for f in fired] == ["a"]
    assert [f.key for f in eng.evaluate(15.0, {"a": {MFU: 0.1}, "b": {MFU: 0.1}})] == ["a", "b"]


def test_rules_see_only_keys_of_their_scope() -> None:
    eng = RuleEngine(rules("""
        rules:
          - name: job_rule
            expr: straggler_ratio > 1.1
          - name: rank_rule
            expr: rank_compute_ratio > 1.1
            scope: rank
          - name: gpu_rule
            expr: gpu_temperature > 85C
            scope: gpu
    """))
    values: dict[ScopeKey, dict[str, float]] = {
        "j": {STRAG: 1.3},
        ("j", 3): {RANK_RATIO: 1.2, STRAG: 1.3},
        ("j", 4): {RANK_RATIO: 1.0},
        ("j", "node1", "0"): {"perfd_gpu_temperature_celsius": 90.0, STRAG: 1.3},
    }
    fired = eng.evaluate(0.0, values)
    assert [(f.rule.name, f.key) for f in fired] == [
        ("job_rule", "j"), ("rank_rule", ("j", 3)), ("gpu_rule", ("j", "node1", "0"))]
    assert [f.job for f in fired] == ["j", "j", "j"]
    assert scope_of(("j", "n", "0")) == "gpu" and job_of(("j", 3)) == "j"
    assert fired[1].to_dict()["key"] == ["j", 3] and fired[1].to_dict()["scope"] == "rank"


def test_clock_is_used_when_now_is_none() -> None:
    clock = ManualClock(100.0)
    eng = RuleEngine(alert_engine("0s").rules, clock=clock)
    [f] = eng.evaluate(None, LOW)
    assert f.since == 100.0


def test_duplicate_rule_names_are_rejected() -> None:
    r = alert_engine().rules[0]
    with pytest.raises(ValueError, match="duplicate"):
        RuleEngine([r, r])


# --- capture budget ---------------------------------------------------------------------------
def fire(eng: RuleEngine, now: float, values: dict[str, dict[str, float]] | None = None,
         used: dict[str, int] | None = None) -> Firing:
    [f] = eng.evaluate(now, values or LOW, used)
    if f.capture_allowed:
        eng.capture_finished(f)  # the capture ends at once: only the budget limits the next one
    return f


def test_cooldown() -> None:
    eng = capture_engine(cooldown="30m")
    f = fire(eng, 0.0)
    assert f.capture_allowed and f.ranks == (0,) and f.suppressed_reason is None
    for t in (60.0, 1799.0):
        f = fire(eng, t)
        assert not f.capture_allowed and f.suppressed_reason == "cooldown"
    assert fire(eng, 1800.0).capture_allowed


def test_max_per_hour_is_a_sliding_window() -> None:
    eng = capture_engine(max_per_hour=2)
    assert fire(eng, 0.0).capture_allowed
    assert fire(eng, 10.0).capture_allowed
    assert fire(eng, 20.0).suppressed_reason == "rate"
    assert fire(eng, 3599.0).suppressed_reason == "rate"
    assert fire(eng, 3600.0).capture_allowed  # the capture at 0 left the window
    assert fire(eng, 3605.0).suppressed_reason == "rate"  # 10 and 3600 are inside
    assert eng.captures_in_last_hour("cap", "j", 3605.0) == 2


def test_disk_quota_is_per_job_bytes_already_used() -> None:
    eng = capture_engine(disk_quota="2GiB")
    values = {"a": {MFU: 0.1}, "b": {MFU: 0.1}}
    fired = eng.evaluate(0.0, values, {"a": 2 * GIB, "b": GIB})
    assert [(f.job, f.capture_allowed, f.suppressed_reason) for f in fired] == [
        ("a", False, "quota"), ("b", True, None)]


def test_budget_is_per_rule_and_job() -> None:
    eng = capture_engine(cooldown="1h")
    assert fire(eng, 0.0, {"a": {MFU: 0.1}}).capture_allowed
    assert fire(eng, 1.0, {"b": {MFU: 0.1}}).capture_allowed  # another job: its own budget
    assert fire(eng, 2.0, {"a": {MFU: 0.1}}).suppressed_reason == "cooldown"


def test_alert_rules_have_no_capture_fields() -> None:
    eng = alert_engine("0s")
    [f] = eng.evaluate(0.0, LOW, {"j": 100 * GIB})
    assert not f.capture_allowed and f.suppressed_reason is None and f.ranks is None


# --- the arbiter ------------------------------------------------------------------------------
TWO_CAPTURES = """
    rules:
      - name: mfu_cap
        expr: mfu < 30%
        action: {type: capture, tool: kineto, targets: {slowest_rank: true}, cooldown: 0s}
      - name: strag_cap
        expr: straggler_ratio > 1.1
        action: {type: capture, tool: nsys, targets: {slowest_rank: true}, cooldown: 0s}
"""


def test_two_rules_firing_at_once_start_one_capture() -> None:
    eng = RuleEngine(rules(TWO_CAPTURES), resolve_targets=lambda job, key, targets, values: (5,))
    both = {"j": {MFU: 0.1, STRAG: 1.5}}
    first, second = eng.evaluate(0.0, both)
    assert first.capture_allowed and first.ranks == (5,)
    assert not second.capture_allowed and second.suppressed_reason == "busy"
    assert eng.arbiter.busy("j", 5)
    # While the first capture runs, the second rule keeps waiting; the first rule too (same process).
    a, b = eng.evaluate(10.0, both)
    assert (a.suppressed_reason, b.suppressed_reason) == ("busy", "busy")
    eng.capture_finished(first)
    assert not eng.arbiter.busy("j")
    a, b = eng.evaluate(20.0, both)
    assert a.capture_allowed and b.suppressed_reason == "busy"


def test_unresolved_targets_hold_the_whole_job() -> None:
    eng = RuleEngine(rules(TWO_CAPTURES))  # default resolver: slowest rank is the executor's job
    fired = eng.evaluate(0.0, {"j": {MFU: 0.1, STRAG: 1.5}, "k": {MFU: 0.1}})
    by = {(f.rule.name, f.job): f for f in fired}
    assert by["mfu_cap", "j"].capture_allowed and by["mfu_cap", "j"].ranks is None
    assert by["strag_cap", "j"].suppressed_reason == "busy"
    assert by["mfu_cap", "k"].capture_allowed  # other jobs are independent


def test_rank_scope_capture_targets_the_firing_rank() -> None:
    eng = RuleEngine(rules("""
        rules:
          - name: slow_rank
            expr: rank_compute_ratio > 1.1
            scope: rank
            action: {type: capture, targets: {slowest_rank: true}, cooldown: 0s, max_per_hour: 10}
    """))
    fired = eng.evaluate(0.0, {("j", 1): {RANK_RATIO: 1.3}, ("j", 2): {RANK_RATIO: 1.4}})
    # Budget is per (rule, job): both ranks fire, the arbiter allows disjoint ranks.
    assert [(f.ranks, f.capture_allowed) for f in fired] == [((1,), True), ((2,), True)]


def test_arbiter() -> None:
    arb = CaptureArbiter()
    assert arb.try_acquire("j", [0, 1])
    assert not arb.try_acquire("j", [1, 2])  # rank 1 already under a profiler
    assert arb.try_acquire("j", [2, 3])
    assert not arb.try_acquire("j", None)  # the whole job overlaps everything held
    assert arb.try_acquire("other", None)
    assert not arb.try_acquire("other", [0])
    arb.release("j", [0, 1])
    assert arb.busy("j") and not arb.busy("j", 0) and arb.busy("j", 2)
    arb.release("j", [2, 3])
    assert not arb.busy("j")
    assert arb.try_acquire("j", None)
    arb.release("other", None)
    assert arb.try_acquire("other", [0])
    arb.release("nobody", [1])  # releasing what is not held is harmless
