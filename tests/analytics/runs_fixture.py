"""Logs of one job's several runs, cut from the real H100 recording tests/data/megatron/
h100_resume_save_eval.log (README there): its run 1 (iterations 1-20, a checkpoint saved at 20) is
the unarmed run; the second run is either run 1's lines again (a restart from iteration 1) or the
recording's own run 2 (a resume from the checkpoint of iteration 20, iterations 21-40), shifted in
time after the first. An armed second run has ``perfd ncu-exec``'s line before its start-up (as the job's
log has it: perfd.core.armed) and its steps ARMED_FACTOR times as long (the H100 measured 544 -> 790 ms
armed on a 12-layer Megatron-LM job:
docs/evidence/entries/29-the-documented-ncu-workflow-both-ways-each-figure-from-its-r.md), its logged
throughput and timestamps made to agree.
Derived, not recorded: what the GPU script tests/gpu/ncu_workflow_live.py records is the real one."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from perfd.core.armed import armed_line

DATA = Path(__file__).resolve().parents[1] / "data" / "megatron"
SOURCE = DATA / "h100_resume_save_eval.log"
ARMED_FACTOR = 1.45
GAP_S = 40.0  # between the first run's exit and the second run's first output

_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]")
_ELAPSED = re.compile(r"(elapsed time per iteration \(ms\): )([0-9.]+)")
_TPUT = re.compile(r"(throughput per GPU \(TFLOP/s/GPU\): )([0-9.]+)")
_DATETIME = re.compile(r"(datetime: )(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")


def _lines() -> list[str]:
    return SOURCE.read_text().splitlines(keepends=True)


def _split() -> tuple[list[str], list[str]]:
    """(run 1's lines, through its exit; run 2's lines)."""
    lines = _lines()
    end = next(i for i, ln in enumerate(lines) if ln.startswith("[exiting program at iteration 20]"))
    return lines[:end + 2], lines[end + 2:]


def _parse(ts: str) -> datetime.datetime:
    return datetime.datetime.strptime(ts, "%Y-%m-%d %H:%M:%S.%f" if "." in ts else "%Y-%m-%d %H:%M:%S")


def _fmt(t: datetime.datetime, like: str) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S.%f" if "." in like else "%Y-%m-%d %H:%M:%S")


def _shifted(lines: list[str], shift_s: float, factor: float) -> list[str]:
    """``lines`` later by ``shift_s``, each step ``factor`` times as long (the steps after it later by
    the extra time, their throughput lower by the factor)."""
    out, extra = [], 0.0
    for ln in lines:
        m = _ELAPSED.search(ln)
        if m is not None and "iteration" in ln:
            ms = float(m.group(2))
            extra += (factor - 1.0) * ms / 1e3
            ln = _ELAPSED.sub(f"\\g<1>{ms * factor:.1f}", ln)
            ln = _TPUT.sub(lambda x: f"{x.group(1)}{float(x.group(2)) / factor:.1f}", ln)
        ln = _later(ln, datetime.timedelta(seconds=shift_s + extra))
        out.append(ln)
    return out


def _later(ln: str, delta: datetime.timedelta) -> str:
    """The line with every timestamp in it ``delta`` later."""
    ln = _STAMP.sub(lambda x: f"[{_fmt(_parse(x.group(1)) + delta, x.group(1))}]", ln)
    return _DATETIME.sub(lambda x: f"{x.group(1)}{_fmt(_parse(x.group(2)) + delta, x.group(2))}", ln)


def _run1_span_s(run1: list[str]) -> float:
    stamps = [_parse(m.group(1)) for ln in run1 for m in [_STAMP.search(ln)] if m is not None]
    return (max(stamps) - min(stamps)).total_seconds()


def restart_log(armed: bool) -> str:
    """Run 1, then the same job restarted from iteration 1 (armed: under ncu)."""
    run1, _ = _split()
    second = _shifted(run1, _run1_span_s(run1) + GAP_S, ARMED_FACTOR if armed else 1.0)
    mark = [armed_line(0, "megatron") + "\n"] if armed else []
    return "".join(run1 + mark + second)


def resume_log(armed: bool) -> str:
    """Run 1, then the recording's own run 2 resumed from the checkpoint of iteration 20 (armed: under
    ncu, its steps ARMED_FACTOR times as long)."""
    run1, run2 = _split()
    mark = [armed_line(0, "megatron") + "\n"] if armed else []
    return "".join(run1 + mark + (_shifted(run2, 0.0, ARMED_FACTOR) if armed else run2))


def run1_log() -> str:
    """Run 1 alone: what the two-run logs' first run is."""
    return "".join(_split()[0])
