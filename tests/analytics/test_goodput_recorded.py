"""Goodput on recorded real Megatron-LM jobs that saved, evaluated, stopped and resumed from a
checkpoint (tests/data/megatron/h100_resume_save_eval.log and h100_resume_older.log, one H100, two
runs in one log each): each part against the log's own figures, computed here from its lines, within
1%."""

from __future__ import annotations

import itertools
import math
import re
from datetime import datetime, timezone
from pathlib import Path

from perfd.app.commands.analyze import analyze_megatron_file

DATA = Path(__file__).resolve().parents[1] / "data" / "megatron"
LOG = DATA / "h100_resume_save_eval.log"
OLDER = DATA / "h100_resume_older.log"  # run 2 loads iteration 10's save after run 1 reached 20
_TS = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\]"


def _t(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def _steps(text: str) -> list[tuple[int, float, float]]:
    """(iteration, stamp, logged elapsed ms) of every iteration line, in log order."""
    return [(int(i), _t(ts), float(ms)) for ts, i, ms in re.findall(
        _TS + r" iteration\s+(\d+)/.*?elapsed time per iteration \(ms\): ([0-9.]+)", text)]


def _stepped(steps: list[tuple[int, float, float]]) -> list[float]:
    """Each step's seconds by the log: its logged time, but never more than the wall time between its
    line and the one before (Megatron's first iterations of a run log an elapsed time that overlaps
    the previous one's: iteration 2 logs 2,067 ms 752 ms after iteration 1's line)."""
    out = [steps[0][2] / 1e3]
    for (_, t_prev, _), (_, t, ms) in itertools.pairwise(steps):
        out.append(min(ms / 1e3, t - t_prev))
    return out


def test_goodput_parts_match_the_logs_own_figures() -> None:
    text = LOG.read_text()
    saving = [_t(m) for m in re.findall(_TS + r" saving checkpoint at iteration", text)]
    saved = [_t(m) for m in re.findall(_TS + r" successfully saved checkpoint", text)]
    steps = _steps(text)
    assert len(saving) == len(saved) == 4 and [s[0] for s in steps] == list(range(1, 41))
    _, analysis = analyze_megatron_file(str(LOG), gpu="NVIDIA H100 80GB HBM3")
    g = analysis.summary.to_json()["goodput"]
    parts = g["parts_s"]
    assert g["runs"] == 2 and g["restarts"] == 1
    assert math.isclose(sum(parts.values()), g["wall_s"], abs_tol=1e-6)
    # Checkpoint saves: the 'saving' → 'successfully saved' stamps.
    want_ckpt = sum(b - a for a, b in zip(saving, saved, strict=True))
    assert math.isclose(parts["checkpoint"], want_ckpt, rel_tol=0.01)
    # The restart: from run 1's last step (and the save after it) to the start of run 2's first step.
    end_1 = next(t for i, t, _ in steps if i == 20)
    first_2 = next((t, ms) for i, t, ms in steps if i == 21)
    save_after = next(b - a for a, b in zip(saving, saved, strict=True) if a >= end_1 - 0.01)
    want_restart = (first_2[0] - first_2[1] / 1e3) - end_1 - save_after
    assert math.isclose(parts["restart"], want_restart, rel_tol=0.01)
    # Training and incidents: every step's time by the log (_stepped).
    want_train = sum(_stepped(steps))
    assert math.isclose(parts["training"] + parts["incident"], want_train, rel_tol=0.01)
    assert parts["evaluation"] > 0 and parts["redone"] == 0.0


def test_resume_from_an_older_checkpoint_counts_the_iterations_trained_again() -> None:
    """Run 1 trained 1–20 (saves at 10 and 20); run 2 loaded iteration 10's save and trained 11–40:
    its 11–20 are redone, the rest of its steps training."""
    text = OLDER.read_text()
    assert re.search(r"successfully loaded checkpoint from .* at iteration 10", text)
    steps = _steps(text)
    second = next(k for k in range(1, len(steps)) if steps[k][0] <= steps[k - 1][0])
    assert [s[0] for s in steps] == [*range(1, 21), *range(11, 41)] and second == 20
    _, analysis = analyze_megatron_file(str(OLDER), gpu="NVIDIA H100 80GB HBM3")
    g = analysis.summary.to_json()["goodput"]
    parts = g["parts_s"]
    assert g["runs"] == 2 and g["restarts"] == 1
    assert math.isclose(sum(parts.values()), g["wall_s"], abs_tol=1e-6)
    stepped = _stepped(steps)
    want_redone = sum(s for k, s in enumerate(stepped) if k >= second and steps[k][0] <= 20)
    assert math.isclose(parts["redone"], want_redone, rel_tol=0.01)  # 8.04 s on this recording
    assert math.isclose(parts["training"] + parts["incident"] + parts["redone"], sum(stepped), rel_tol=0.01)
