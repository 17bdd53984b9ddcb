"""Live, a checkpoint save's or an evaluation's timer reaches its record (the H100 log of a real
Megatron-LM core 0.20 run with saves every 10 iterations and an evaluation at 15).

The timer (``save-checkpoint``, ``evaluate``) is printed as the pause ends, seconds after the
iteration line; the collector emits a pending record once the log has been quiet for
``flush_after_s``. Before, a save longer than that lost its time live (the record was out, the timer
went nowhere) and goodput read the save as a stall; the offline parse of the same log had it."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfd.analytics.run.run_analysis import analyze_run
from perfd.collectors.megatron import collector as collector_module
from perfd.collectors.megatron.collector import MegatronCollector
from perfd.collectors.megatron.parser import parse_file
from perfd.core.model import StepRecord

ROOT = Path(__file__).resolve().parents[4]
LOG = ROOT / "tests" / "data" / "megatron" / "h100_resume_save_eval.log"
PAUSE_TIMERS = ("save-checkpoint", "evaluate")


def _live(tmp_path: Path, quiet_after: str, cut_at: int = 1) -> tuple[list[StepRecord], MegatronCollector]:
    """Write the log as the job did, with the log quiet (a collect that reads nothing, past
    ``flush_after_s``) after each of the first ``cut_at`` lines that contain ``quiet_after``."""
    lines = LOG.read_text().splitlines(keepends=True)
    log = tmp_path / "train.log"
    log.write_text("")
    col = MegatronCollector({"path": str(log), "job": "j", "flush_after_s": 0.0})
    col.start()
    steps: list[StepRecord] = []
    cuts = 0
    with log.open("a") as f:
        for line in lines:
            f.write(line)
            if quiet_after in line and cuts < cut_at:
                cuts += 1
                f.flush()
                steps.extend(col.collect(0.0).steps)
                steps.extend(col.collect(0.0).steps)  # nothing new: the log is quiet
        f.flush()
    steps.extend(col.collect(0.0).steps)
    steps.extend(col.flush(0.0).steps)
    col.stop()
    return steps, col


def _pauses(records: list[StepRecord]) -> dict[tuple[int, str], float | None]:
    return {(r.iteration, name): r.timers[name].max_ms for r in records for name in PAUSE_TIMERS
            if name in r.timers}


def test_the_offline_parse_has_every_pause_timer() -> None:
    # The reference the live reads are held to: the whole log parsed at once.
    got = _pauses(parse_file(LOG, job="j").records)
    assert got[(10, "save-checkpoint")] == 16749.73 and got[(30, "save-checkpoint")] == 22802.67
    assert got[(15, "evaluate")] == 3029.98


@pytest.mark.parametrize("quiet_after", ["saving checkpoint at iteration", "RerunMode.DISABLED"])
def test_a_quiet_log_during_an_announced_pause_holds_the_record_for_its_timer(
        tmp_path: Path, quiet_after: str) -> None:
    steps, col = _live(tmp_path, quiet_after, cut_at=99)
    assert _pauses(steps) == _pauses(parse_file(LOG, job="j").records)
    assert [r.iteration for r in steps] == [r.iteration for r in parse_file(LOG, job="j").records]
    assert "parse:timer-after-record" not in col.errors
    # What goodput makes of them: live as offline (before, a save read live as a stall).
    offline = parse_file(LOG, job="j")
    want = analyze_run(offline.job_info, offline.records).summary.to_json()["goodput"]["parts_s"]
    got = analyze_run(col.parser.job_info, steps).summary.to_json()["goodput"]["parts_s"]
    assert got == pytest.approx(want) and got["checkpoint"] > 40  # saves of 16.7 s and 22.8 s


def test_without_the_hold_the_timer_is_counted_not_taken_for_start_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A pause longer than perfd believes announced (STALL_PHASE_MAX_S): the record goes out on the
    # quiet, and its late timer is counted, not filed as a start-up timer of the job.
    monkeypatch.setattr(collector_module, "PHASE_MAX_S", 0.0)
    steps, col = _live(tmp_path, "saving checkpoint at iteration")
    got = _pauses(steps)
    assert (10, "save-checkpoint") not in got and got[(30, "save-checkpoint")] == 22802.67
    assert col.errors["parse:timer-after-record"] == 1  # the agent's collector errors count it
    assert "save-checkpoint" not in col.parser.job_info.startup_timers


def test_a_quiet_log_with_no_pause_open_emits_the_record() -> None:
    # The hold is only for an announced pause: after the save's end line the next quiet emits.
    from perfd.collectors.megatron.parser import MegatronLogParser

    p = MegatronLogParser(job="j")
    for line in LOG.read_text().splitlines():
        p.feed(line)
        if "saving checkpoint at iteration" in line:
            assert p.phase_open == "checkpoint"
        elif "successfully saved checkpoint" in line:
            assert p.phase_open is None
        elif "RerunMode.DISABLED" in line:
            assert p.phase_open == "evaluation"
        elif " validation loss at iteration" in line:
            assert p.phase_open is None
