"""A slowdown perfd's own capture left behind (perfd.analytics.incidents.after_capture): a Kineto trace
without TEARDOWN_CUPTI=1 leaves CUPTI on every later launch, and a host-bound job steps slower to its end.
Its steady median drifts up to the new pace, so the same slowdown opens incidents later that begin
nowhere near the capture: each is the capture's while the steps never came back to their pace.

On the recorded Trainer run (tests/data/loops/hf_clm_h200: ~219 ms a step before its capture at
iterations 47–135, 290–380 after, by the loop's own clock), replayed through a fresh aggregator."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfd.analytics.incidents.after_capture import MIN_BEFORE, MIN_SINCE, since_capture
from tests.journal_replay import Replayed, replay, unpack


def test_a_pace_that_never_came_back_is_the_captures() -> None:
    before, cap, slow = [100.0] * 30, [None] * 5, [130.0] * 20
    sized: list[float | None] = [*before, *cap, *slow]
    got = since_capture([list(range(30, 35))], 45, sized)
    assert got is not None and list(got.capture) == list(range(30, 35))
    assert got.before_ms == 100.0 and got.since_ms == 130.0 and got.ratio == pytest.approx(1.3)


def test_a_pace_that_came_back_or_too_few_steps_say_nothing() -> None:
    back: list[float | None] = [*([100.0] * 30), *([None] * 5), *([104.0] * 20)]
    assert since_capture([list(range(30, 35))], 45, back) is None  # 4%: under the bar
    assert since_capture([], 45, back) is None  # no capture before it
    assert since_capture([list(range(50, 55))], 45, back) is None  # the capture is after it
    few: list[float | None] = [*([100.0] * (MIN_BEFORE - 1)), None, *([130.0] * 20)]
    assert since_capture([[MIN_BEFORE - 1]], 25, few) is None
    short: list[float | None] = [*([100.0] * 30), None, *([130.0] * (MIN_SINCE - 1))]
    assert since_capture([[30]], 31 + MIN_SINCE - 1, short) is None


def test_the_pace_is_the_one_before_the_first_capture() -> None:
    """A capture's warm-up is a stretch of its own, the steps after it already slowed: the pace is read
    before the first of them (the Trainer's recording: 47–80, then the trace at 98–135)."""
    sized: list[float | None] = [*([100.0] * 30), None, *([125.0] * 10), None, *([128.0] * 20)]
    got = since_capture([[30], [41]], 60, sized)
    assert got is not None and list(got.capture) == [41] and got.before_ms == 100.0


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Replayed:
    return replay(unpack("hf_clm_h200", Path(tmp_path_factory.mktemp("loops"))), "hf")


def test_the_trainers_slowdown_after_its_capture_is_the_captures_to_the_end(hf: Replayed) -> None:
    """Before: inc-136 the capture's, then inc-239 and inc-304 "not explained: its GPU and timers showed
    nothing unusual" with "check rank 0's GPU" on a host-bound job."""
    stretches = hf.summary["summary"]["capture_disturbances"]["stretches"]
    last = max(s["last_iteration"] for s in stretches)
    after = [i for i in hf.summary["incidents"] if i["first_iteration"] > last]
    assert len(after) >= 2
    for inc in after:
        assert inc["verdict"]["cause"] == "after_capture", inc["id"]
        assert "not explained" not in inc["cause"]
    later = [i for i in after if i["verdict"]["lead"]["detail"].get("since_ms") is not None]
    assert later and all(i["verdict"]["lead"]["worst"] >= 1.1 for i in later)
    recs = [r for r in hf.summary["report"]["recommendations"]
            if r["finding_id"] in {f"incident-{i['id']}" for i in after}]
    assert recs and all("TEARDOWN_CUPTI=1" in r["action"] and "Check rank" not in r["action"] for r in recs)
