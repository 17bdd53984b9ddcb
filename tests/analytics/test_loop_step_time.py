"""perfd's step time against the loop's own clock, on the recorded journals of two published loops on an
H200 (tests/data/loops: nanoGPT's `time ...ms` per iteration; the Trainer's host time between
on_step_end calls), replayed through a fresh aggregator (tests/journal_replay.py).

Iteration by iteration the two agree (the Trainer's to a few tenths of a millisecond) but where the
loop's clock holds a pause perfd's step leaves out: the Trainer's evaluation and save after steps 100,
200, 300, announced (hook.phase), are in its clock's 101, 201, 301. What perfd reports is the mean over
the steps it calls steady; which steps those are is what moves it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from perfd.core.model import HOOK_PAUSE_TIMERS
from tests.journal_replay import LOOPS, Replayed, own_clock, replay, unpack

NANO, HF = "nanogpt_h200", "hf_clm_h200"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loops")
    return {name: unpack(name, root) for name in (NANO, HF)}


def _paused_ms(r: Replayed) -> dict[int, float]:
    """iteration -> the announced pauses its record carries (ms): in the loop's clock, not in perfd's step."""
    out: dict[int, float] = {}
    for rec in r.state.step_records(r.analysis.job.name or ""):
        ms = sum(tv.max_ms or 0.0 for name, tv in rec.timers.items() if name in HOOK_PAUSE_TIMERS.values())
        if ms:
            out[rec.iteration] = out.get(rec.iteration, 0.0) + ms
    return out


@pytest.mark.parametrize(("name", "job"), [(NANO, "nanogpt"), (HF, "hf")])
def test_over_its_steady_steps_perfds_step_is_the_loops(dirs: dict[str, Path], name: str, job: str) -> None:
    r = replay(dirs[name], job)
    own, paused = own_clock(name), _paused_ms(r)
    steady = r.analysis.steady.iterations
    ours = statistics.fmean(it.step_time_ms or 0.0 for it in r.analysis.iterations if it.iteration in steady)
    theirs = statistics.fmean(own[i] - paused.get(i, 0.0) for i in steady)
    assert ours == pytest.approx(r.analysis.summary.median("step_time_ms"))
    assert abs(ours / theirs - 1) < 0.01, (ours, theirs)


def test_nanogpts_steady_step_is_its_own_clocks(dirs: dict[str, Path]) -> None:
    r = replay(dirs[NANO], "nanogpt")
    own = statistics.median(v for k, v in own_clock(NANO).items() if k > 10)
    step = r.analysis.summary.median("step_time_ms")
    assert step is not None and abs(step / own - 1) < 0.01, (step, own)  # 133.64 against 133.48


def _trace_ready(manifest: dict[str, Any]) -> Any:
    """The capture record as an agent of this version reports it: with when its rank's trace was written
    (the recorded manifest's; the journal's record has none)."""
    def edit(d: dict[str, Any]) -> dict[str, Any]:
        if d.get("id") == manifest["command_id"] and isinstance(d.get("result"), dict):
            d["result"] = {**d["result"], "trace_ready_at": manifest["timings"]["trace_ready_at"]}
        return d
    return edit


def test_a_captures_window_ends_when_the_ranks_trace_is_written(dirs: dict[str, Path]) -> None:
    """The Trainer's first capture began at 261.34 and its trace was written at 265.35; its agent then read
    the trace until 270.35. Iterations 47-57 are the slowed ones (276-432 ms); 58-80, run while the agent
    read the trace, ran at the job's own speed (212-304 ms) and were left out of the steady state as the
    capture's."""
    before = replay(dirs[HF], "hf")
    manifest = json.loads((LOOPS / HF / "capture_manifest.json").read_text())
    after = replay(dirs[HF], "hf", edit_capture=_trace_ready(manifest))

    def captured(r: Replayed) -> list[tuple[int, int]]:
        return [(e["first"], e["last"]) for e in r.summary["summary"]["excluded"] if e["kind"] == "capture"]

    assert captured(before)[0] == (47, 80)
    assert captured(after)[0] == (47, 60)  # 58-60 overlap 265.35: the step it was written in, and the next
    own = statistics.median(v for k, v in own_clock(HF).items() if k > 10)
    was, now = before.analysis.summary.median("step_time_ms"), after.analysis.summary.median("step_time_ms")
    assert was is not None and now is not None
    assert abs(now - own) < abs(was - own)  # 299.6 -> 296.3 against the loop's 293.2
