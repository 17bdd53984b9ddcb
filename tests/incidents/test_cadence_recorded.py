"""The loop's own pauses at a cadence, on the recorded journals of two published loops on an H200
(tests/data/loops): nanoGPT's train.py evaluates and saves a checkpoint every 100 iterations outside its
step without announcing it; transformers' Trainer does the same and perfd's callback announces it.

Each journal is replayed through a fresh aggregator as it arrived (tests/journal_replay.py). The
journal keeps no samples: what the agents saw during the pauses (the GPU busy, the process writing) is
added where a test says so, at the recorded pauses' times."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.state import AggregatorState
from perfd.analytics.incidents.cadence import PausePart, SeenKind
from perfd.core import events
from perfd.core.model import HOOK_OUTSIDE, StepRecord, TimerValue
from tests.journal_replay import Extra, Replayed, replay, samples, unpack

NANO, HF = "nanogpt_h200", "hf_clm_h200"
AGENT = "vm/nanogpt"
PHASES = ('with hook.phase("evaluation"):', 'with hook.phase("checkpoint"):')
GPU_LABELS = {"gpu": "0", "node": "vm", "uuid": "GPU-97236da7-4baf-95b3-e1f5-eeb8a7e3fe53"}
UTIL = ("perfd_gpu_utilization_ratio", tuple(sorted(GPU_LABELS.items())))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loops")
    return {name: unpack(name, root) for name in (NANO, HF)}


@pytest.fixture(scope="module")
def nano(dirs: dict[str, Path]) -> Replayed:
    return replay(dirs[NANO], "nanogpt")


def _recs(r: Replayed) -> list[dict[str, Any]]:
    return list(r.summary["report"]["recommendations"])


def test_nanogpts_evaluation_and_save_every_100_iterations_is_a_pause_not_an_incident(nano: Replayed) -> None:
    """Before: inc-100, inc-200, inc-300 "not explained: its GPU and timers showed nothing unusual", 6.6 s
    of incident in goodput, and R1 "Check rank 0: its GPU ..."."""
    assert nano.summary["incidents"] == []
    assert not [i for i in nano.analysis.incidents if i.first_iteration in (100, 200, 300)]
    (cad,) = nano.analysis.summary.pauses
    assert cad.every == 100 and cad.iterations == (100, 200, 300)
    assert 2.0 < cad.typical_s < 2.6  # the recorded pauses: 1.76, 2.32, 2.57 s beyond the steady step
    parts = nano.summary["goodput"]["parts_s"]
    assert parts["incident"] == 0.0
    # Nothing seen during it (the journal keeps no samples): neither part can be told
    assert cad.part is PausePart.UNTOLD and parts["cadence"] == pytest.approx(cad.total_s, abs=1e-6)
    assert 6.0 < parts["cadence"] < 7.0
    finding = next(f for f in nano.summary["report"]["findings"] if f["id"] == "cadence-100-pause")
    assert finding["title"].startswith("A pause every 100 iterations, ~")
    rec = next(r for r in _recs(nano) if r["finding_id"] == "cadence-100-pause")
    assert all(p in rec["action"] for p in PHASES)
    assert not any("Check rank" in r["action"] for r in _recs(nano))
    assert "Largest loss" not in nano.summary["report"]["summary"]["headline"]
    excluded = {(e["first"], e["kind"]) for e in nano.summary["summary"]["excluded"]}
    assert {(100, "pause"), (200, "pause"), (300, "pause")} <= excluded


def test_the_first_pause_is_an_incident_until_the_second_names_it(dirs: dict[str, Path]) -> None:
    """One pause is a one-off so far; the second, 100 iterations on, names both (the first incident is
    taken back)."""
    after_100 = replay(dirs[NANO], "nanogpt", until=1795937170.0, tail_s=0.0)  # iteration 100 ended 167.78
    assert [i["id"] for i in after_100.summary["incidents"]] == ["inc-100"]
    assert after_100.analysis.summary.pauses == ()
    after_200 = replay(dirs[NANO], "nanogpt", until=1795937186.0, tail_s=0.0)  # 200 ended 183.46
    assert after_200.summary["incidents"] == []
    (cad,) = after_200.analysis.summary.pauses
    assert cad.iterations == (100, 200)
    closed = [e for e in after_200.state.recent_events(limit=10_000)
              if e.get("kind") == events.INCIDENT_CLOSED.name and "inc-100" in str(e.get("text"))]
    assert closed and "cadence_pause" in str(closed[-1]["text"])


def _one_off_at_150(r: StepRecord) -> StepRecord:
    """A 2 s stall outside the step at iteration 150 (off the cadence)."""
    if r.iteration != 150 or r.step_time_ms is None:
        return r
    out = r.timers[HOOK_OUTSIDE]
    ms = (out.max_ms or 0.0) + 2000.0
    return dataclasses.replace(r, step_time_ms=r.step_time_ms + 2000.0,
                               timers={**r.timers, HOOK_OUTSIDE: TimerValue(ms, ms, {0: ms})})


def test_a_one_off_pause_off_the_cadence_stays_an_incident(dirs: dict[str, Path]) -> None:
    r = replay(dirs[NANO], "nanogpt", edit=_one_off_at_150)
    assert [i["id"] for i in r.summary["incidents"]] == ["inc-150"]
    (cad,) = r.analysis.summary.pauses
    assert cad.iterations == (100, 200, 300)
    assert r.summary["goodput"]["parts_s"]["incident"] > 1.5


def _during_pauses(nano: Replayed, every_s: float = 0.25) -> list[float]:
    """Times inside the recorded pauses (their steps' periods, less their steady step)."""
    out = []
    for p in nano.analysis.summary.pauses[0].pauses:
        assert p.start_time is not None and p.end_time is not None
        t = p.start_time + 0.2
        while t < p.end_time - 0.2:
            out.append(t)
            t += every_s
    return out


def _util(at: float, value: float) -> Extra:
    return at, lambda st: samples(st, AGENT, at, {UTIL: value})


def _writing(at: float, bps: float) -> Extra:
    def put(st: AggregatorState) -> None:
        st.ingest_events(AGENT, [{
            "kind": events.RANK_PROCESSES.name, "severity": "info", "time": at, "job": "nanogpt",
            "labels": {"job": "nanogpt", "node": "vm"}, "text": "",
            "payload": {"job": "nanogpt", "interval_s": 1.0, "node": {},
                        "ranks": [{"rank": 0, "pid": 628, "source": "launch", "state": "running",
                                   "state_since": 1795937117.63, "observed_at": at,
                                   "started_at": 1795937099.51,
                                   "cpu_cores": 1.0, "write_bytes_per_second": bps}]}}])
    return at, put


def test_the_gpu_busy_without_steps_tells_an_evaluation(dirs: dict[str, Path], nano: Replayed) -> None:
    r = replay(dirs[NANO], "nanogpt", extra=[_util(t, 0.97) for t in _during_pauses(nano)])
    (cad,) = r.analysis.summary.pauses
    assert cad.part is PausePart.EVALUATION
    assert [s.kind for s in cad.seen] == [SeenKind.GPU_BUSY]
    parts = r.summary["goodput"]["parts_s"]
    assert parts["evaluation"] == pytest.approx(cad.total_s, abs=1e-6) and parts["cadence"] == 0.0
    rec = next(x for x in _recs(r) if x["finding_id"] == "cadence-100-pause")
    assert PHASES[0] in rec["action"] and PHASES[1] not in rec["action"]


def test_the_process_writing_to_disk_tells_a_checkpoint_save(dirs: dict[str, Path], nano: Replayed) -> None:
    ts = _during_pauses(nano, every_s=1.0)
    r = replay(dirs[NANO], "nanogpt",
               extra=[*(_util(t, 0.05) for t in _during_pauses(nano)), *(_writing(t, 1.5e9) for t in ts)])
    (cad,) = r.analysis.summary.pauses
    assert cad.part is PausePart.CHECKPOINT
    assert {s.kind for s in cad.seen} == {SeenKind.DISK_WRITES, SeenKind.GPU_IDLE}
    assert r.summary["goodput"]["parts_s"]["checkpoint"] == pytest.approx(cad.total_s, abs=1e-6)
    rec = next(x for x in _recs(r) if x["finding_id"] == "cadence-100-pause")
    assert PHASES[1] in rec["action"] and PHASES[0] not in rec["action"]
    finding = next(f for f in r.summary["report"]["findings"] if f["id"] == "cadence-100-pause")
    assert "wrote 1500 MB/s to disk" in finding["observation"]


def test_the_trainers_announced_pauses_are_booked_as_what_they_are(dirs: dict[str, Path]) -> None:
    """transformers' Trainer under perfd's callback: evaluation and checkpoint announced (hook.phase), so no
    slow step, no cadence; goodput's parts are the announced times (recorded: evaluation 1.25 + 0.62 +
    0.37 s, checkpoint 1.76 + 1.74 + 2.41 s)."""
    r = replay(dirs[HF], "hf")
    assert r.analysis.summary.pauses == ()
    parts = r.summary["goodput"]["parts_s"]
    assert parts["evaluation"] == pytest.approx(1.2497 + 0.6236 + 0.3747, abs=0.01)
    assert parts["checkpoint"] == pytest.approx(1.7609 + 1.7437 + 2.4058, abs=0.01)
    assert parts["cadence"] == 0.0
    assert not [i for i in r.summary["incidents"] if i["first_iteration"] in (100, 101, 200, 201, 300, 301)]
