"""Goodput of a job (perfd.analytics.steps.goodput) on recorded Megatron-LM logs: the parts add up to the
wall time, and each part matches the log's own figures (its timestamps and timers) within 1%.

Recorded jobs that save, evaluate and resume are checked in test_goodput_recorded.py
(tests/gpu/megatron_goodput.sh made them). The fixtures here are *constructed* from real logs, and
say so:
- a restart: two real runs (tests/data/megatron, recorded one after the other by the same script on
  the same machine, each a new set of processes starting at iteration 1) read as one log;
- a checkpoint save and an evaluation: the lines Megatron-LM prints for them (the text of
  megatron/training/checkpointing.py and training.py) spliced into a real log after iteration 20,
  every later timestamp moved by the time they took.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.steps import goodput as gpm
from perfd.analytics.steps.goodput import StepSpan, job_goodput, with_stall
from perfd.collectors.megatron.parser import parse_lines

ROOT = Path(__file__).resolve().parents[2]
COTENANT = ROOT / "tests/data/incidents/costraggler_dp2/dp2_cotenant.log"
RUN_A = ROOT / "tests/data/megatron/dp2_all_timers.log"
RUN_B = ROOT / "tests/data/megatron/dp2_ep2_moe_top2.log"

_ITER = re.compile(r"^ \[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\] iteration\s+(\d+)/"
                   r".*elapsed time per iteration \(ms\): ([\d.]+)")
_DT = re.compile(r"^\[([^\]]+)\] datetime: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)")
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d+)?\]")


def _epoch(text: str) -> float:
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S"
    return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()


def _own_figures(lines: list[str]) -> tuple[list[tuple[float, int, float]], list[tuple[str, float]]]:
    """What the log says itself, read with regular expressions independent of perfd's parser:
    (end time, iteration, elapsed ms) of every iteration line, and every print_datetime stamp."""
    its, stamps = [], []
    for line in lines:
        m = _ITER.match(line)
        if m:
            its.append((_epoch(m[1]), int(m[2]), float(m[3])))
        d = _DT.match(line)
        if d:
            stamps.append((d[1], _epoch(d[2])))
    return its, stamps


def _stepping(its: list[tuple[float, int, float]]) -> float:
    """Seconds a run stepped by its own lines: from its first iteration's start (the line's stamp
    less its elapsed time) to its last iteration line. (Summing the elapsed times would count the
    first iteration twice: Megatron-LM's second log averages over both, see parser._interval.)"""
    return its[-1][0] - (its[0][0] - its[0][2] / 1e3)


def _goodput(lines: list[str]) -> dict[str, Any]:
    parsed = parse_lines(lines)
    analysis = analyze_run(parsed.job_info, parsed.records)
    gp = analysis.summary.to_json()["goodput"]
    assert gp is not None
    assert math.isclose(sum(gp["parts_s"].values()), gp["wall_s"], abs_tol=1e-6)  # epoch-time rounding
    assert set(gp["parts_s"]) == set(gpm.KINDS)
    return {**gp, "summary": analysis.summary.to_json()}


def _near(a: float, b: float) -> None:
    assert a == pytest.approx(b, rel=0.01), (a, b)


def test_cotenant_incident_parts_match_the_log() -> None:
    lines = COTENANT.read_text().splitlines()
    gp = _goodput(lines)
    its, stamps = _own_figures(lines)
    first_end, _, first_ms = its[0]
    start = min(t for _, t in stamps)
    parts = gp["parts_s"]
    # wall: from the earliest start-up stamp to the last iteration line (no save after it)
    _near(gp["wall_s"], its[-1][0] - start)
    _near(parts["startup"], first_end - first_ms / 1e3 - start)
    # what trained: the log's own per-iteration times, the incident's excess included
    _near(parts["training"] + parts["incident"] + parts["profiling"] + parts["other"], _stepping(its))
    assert parts["incident"] == pytest.approx(gp["summary"]["incidents_cost_s"])
    assert parts["incident"] > 10  # the co-tenant's 30 s cost the job ~17 s
    assert parts["restart"] == parts["checkpoint"] == parts["evaluation"] == parts["stall"] == 0
    assert gp["runs"] == 1
    _near(gp["ratio"], parts["training"] / gp["wall_s"])


def test_two_runs_in_one_log_count_the_restart() -> None:
    a, b = RUN_A.read_text().splitlines(), RUN_B.read_text().splitlines()
    gp = _goodput(a + b)
    its_a, stamps_a = _own_figures(a)
    its_b, stamps_b = _own_figures(b)
    assert gp["runs"] == 2 and gp["restarts"] == 1
    # The parser marks the first record of each run (start-up output came before it), and no other.
    records = parse_lines(a + b).records
    assert [r.iteration for r in records if r.first_of_run] == [1, 1]
    assert records.index(next(r for r in records[1:] if r.first_of_run)) == len(its_a)
    parts = gp["parts_s"]
    # restart: from the first run's last step to the second run's first step start
    first_b_start = its_b[0][0] - its_b[0][2] / 1e3
    _near(parts["restart"], first_b_start - its_a[-1][0])
    # ... which the second run's own stamp agrees with: it starts its training loop at that point
    before_b = dict(stamps_b)["before the start of training step"]
    _near(parts["restart"], before_b - its_a[-1][0])
    _near(parts["startup"], its_a[0][0] - its_a[0][2] / 1e3 - min(t for _, t in stamps_a))
    _near(parts["training"] + parts["incident"] + parts["redone"] + parts["other"],
          _stepping(its_a) + _stepping(its_b))
    _near(gp["wall_s"], its_b[-1][0] - min(t for _, t in stamps_a))


def _shift(line: str, by: float) -> str:
    def moved(m: re.Match[str]) -> str:
        frac = m[2] or ""
        t = datetime.strptime(m[1] + (frac or ".0"), "%Y-%m-%d %H:%M:%S.%f") + timedelta(seconds=by)
        return "[" + t.strftime("%Y-%m-%d %H:%M:%S") + (t.strftime(".%f") if frac else "") + "]"
    return _STAMP.sub(moved, line)


def _with_save_and_eval(save_ms: tuple[float, float], eval_ms: tuple[float, float]) -> list[str]:
    """RUN_A with an evaluation and a checkpoint save after iteration 20, as Megatron-LM prints them
    (--timing-log-option all): evaluate_and_print_results' validation line and timers.log(['evaluate']),
    then save_checkpoint's 'saving checkpoint at iteration' / 'successfully saved checkpoint from
    iteration' and timers.log(['save-checkpoint'])."""
    lines = RUN_A.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if " iteration       21/" in ln)
    t20 = _own_figures(lines)[0][19][0]
    ev, sv = max(eval_ms) / 1e3, max(save_ms) / 1e3

    def ts(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")

    inserted = [
        "-" * 120,
        " validation loss at iteration 20 | lm loss value: 6.331E+00 | lm loss PPL: 5.618E+02 | ",
        "-" * 120,
        "INFO:megatron.core.timers:times across ranks (ms):",
        "  evaluate:", f"     rank  0: {eval_ms[0]:.2f}", f"     rank  1: {eval_ms[1]:.2f}",
        f"[{ts(t20 + ev)}] saving checkpoint at iteration      20 to /ckpt in torch_dist format",
        f"  [{ts(t20 + ev + sv)}] successfully saved checkpoint from iteration      20 to /ckpt "
        "[ t 1/1, gtp_remat 1/1, p 1/1 ]",
        "INFO:megatron.core.timers:times across ranks (ms):",
        "  save-checkpoint:", f"     rank  0: {save_ms[0]:.2f}", f"     rank  1: {save_ms[1]:.2f}",
    ]
    return lines[:at] + inserted + [_shift(ln, ev + sv) for ln in lines[at:]]


def test_checkpoint_save_and_evaluation_from_the_frameworks_timers() -> None:
    lines = _with_save_and_eval(save_ms=(3100.0, 3101.5), eval_ms=(1990.0, 2004.0))
    gp = _goodput(lines)
    parts = gp["parts_s"]
    saving = [_epoch(m[1]) for ln in lines if (m := re.search(r"\[([\d-]+ [\d:.]+)\] saving checkpoint", ln))]
    saved = [_epoch(m[1]) for ln in lines
             if (m := re.search(r"\[([\d-]+ [\d:.]+)\] successfully saved checkpoint", ln))]
    _near(parts["checkpoint"], saved[0] - saving[0])  # the log's own stamps
    _near(parts["checkpoint"], 3.1015)  # the slowest rank's save-checkpoint timer
    _near(parts["evaluation"], 2.004)
    assert parts["stall"] == 0 and parts["restart"] == 0
    its, _ = _own_figures(lines)
    _near(parts["training"] + parts["incident"] + parts["other"],
          _stepping(its) - parts["checkpoint"] - parts["evaluation"])


def test_restart_and_stall_kinds_on_spans() -> None:
    """The pure function on spans: an unexplained gap is a stall, a repeated iteration a restart,
    iterations trained again after a restart from an earlier checkpoint are redone."""
    spans = [StepSpan(i, 100.0 + i, 1.0) for i in range(1, 11)]  # 1..10, one second each
    spans.append(StepSpan(11, 100.0 + 11 + 60, 1.0))  # a 60 s gap: stall
    spans += [StepSpan(i, 300.0 + i, 1.0) for i in range(6, 16)]  # resumed from iteration 5
    gp = job_goodput(spans, started_at=90.0)
    assert gp is not None
    assert gp.runs == 2
    assert gp.parts[gpm.STALL] == pytest.approx(60.0)
    assert gp.parts[gpm.STARTUP] == pytest.approx(10.0)
    assert gp.parts[gpm.REDONE] == pytest.approx(6.0)  # iterations 6..11 again
    assert gp.parts[gpm.RESTART] == pytest.approx(306.0 - 1.0 - 171.0)
    assert sum(gp.parts.values()) == pytest.approx(gp.wall_s)
    # Live, the aggregator holds one record per iteration: a resume whose records replaced the old
    # run's shows iterations that only go up. The first record of the new run says it is one.
    held = [StepSpan(i, 100.0 + i, 1.0) for i in range(1, 6)]
    held += [StepSpan(6, 200.0, 1.0, new_run=True), *(StepSpan(i, 194.0 + i, 1.0) for i in range(7, 10))]
    resumed = job_goodput(held)
    assert resumed is not None and resumed.runs == 2
    assert resumed.parts[gpm.RESTART] == pytest.approx(200.0 - 1.0 - 105.0) and resumed.parts[gpm.STALL] == 0
    unmarked = job_goodput([StepSpan(s.iteration, s.end_time, s.step_s) for s in held])
    assert unmarked is not None and unmarked.runs == 1 and unmarked.parts[gpm.STALL] > 90  # what it was
    live = with_stall(gp, 30.0)
    assert live.parts["stall"] == pytest.approx(90.0)
    assert sum(live.parts.values()) == pytest.approx(live.wall_s)
    assert job_goodput([]) is None


def test_torchtitan_log_and_step_hook_records() -> None:
    """Any job perfd analyses: a real torchtitan log (start-up from its first line), and step-hook
    records (one per rank, folded per iteration; no start-up stamp, the wall starts at the first step)."""
    from perfd.aggregator.jobs import job_level_steps
    from perfd.collectors.torchtitan.parser import TorchtitanLogParser
    from perfd.core.model import JobInfo, StepRecord

    log = ROOT / "perfd/collectors/torchtitan/tests/data/llama3_debugmodel_1gpu.log"
    parser = TorchtitanLogParser("titan", log.name)
    records = [r for line in log.read_text().splitlines() for r in parser.feed(line)]
    assert [r.iteration for r in records if r.first_of_run] == [1]  # after "Training starts at step 1"
    gp = analyze_run(parser.job_info, records).summary.to_json()["goodput"]
    stamps = [_epoch(m[1].replace(",", ".")) for line in log.read_text().splitlines()
              if (m := re.match(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)", line))]
    starts = [_epoch(m[1].replace(",", ".")) for line in log.read_text().splitlines()
              if (m := re.match(r"\[titan\] (\S+ \S+) - root - INFO - Training starts", line))]
    assert math.isclose(sum(gp["parts_s"].values()), gp["wall_s"], abs_tol=1e-6)
    _near(gp["wall_s"], records[-1].end_time - stamps[0])  # type: ignore[operator]
    _near(gp["parts_s"]["startup"], starts[0] - stamps[0])
    _near(gp["parts_s"]["training"] + gp["parts_s"]["incident"] + gp["parts_s"]["other"],
          records[-1].end_time - starts[0])  # type: ignore[operator]

    hook = [StepRecord("h", it, rank=r, end_time=1000.0 + it * 0.5 + 0.01 * r, step_time_ms=500.0)
            for it in range(1, 41) for r in (0, 1)]
    gp = analyze_run(JobInfo(framework="hook"), job_level_steps(hook)).summary.to_json()["goodput"]
    assert gp["parts_s"]["startup"] == 0 and gp["notes"]
    _near(gp["wall_s"], 1000.0 + 40 * 0.5 + 0.01 - (1000.5 + 0.01 - 0.5))
    assert math.isclose(sum(gp["parts_s"].values()), gp["wall_s"], abs_tol=1e-6)


def test_perfd_captures_count_as_profiling() -> None:
    """perfd's own capture inside the co-tenant incident (iterations marked as the aggregator marks
    a capture window's) and one on a steady stretch: their excess is profiling, not training, not
    the incident's."""
    import dataclasses

    parsed = parse_lines(COTENANT.read_text().splitlines())
    marked = [dataclasses.replace(r, disturbed_by_capture=True) if r.iteration in (75, 76, 130, 131) else r
              for r in parsed.records]
    # The capture that stopped at iteration 76 took 3 s more for its report (as nsys's flush does):
    # beyond the incident's own level, that is the capture's.
    marked = [dataclasses.replace(r, step_time_ms=(r.step_time_ms or 0.0) + 3000.0)
              if r.iteration == 76 else r for r in marked]
    analysis = analyze_run(parsed.job_info, marked)
    s = analysis.summary.to_json()
    parts = s["goodput"]["parts_s"]
    inside = sum(i.capture_cost_s or 0.0 for i in analysis.incidents)
    assert inside == pytest.approx(3.0, abs=0.5)  # the flush beyond the incident's level
    assert parts["profiling"] == pytest.approx(inside + (s["capture_disturbances"]["excess_s"] or 0.0))
    assert parts["incident"] == pytest.approx(s["incidents_cost_s"])
    assert math.isclose(sum(parts.values()), s["goodput"]["wall_s"], abs_tol=1e-6)
