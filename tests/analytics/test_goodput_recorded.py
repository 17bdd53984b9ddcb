"""Goodput on a recorded real Megatron-LM job that saved, evaluated, stopped and resumed from its
checkpoint (tests/data/megatron/h100_resume_save_eval.log, one H100, two runs in one log): each part
against the log's own figures, computed here from its lines, within 1%."""

from __future__ import annotations

import itertools
import math
import re
from datetime import datetime, timezone
from pathlib import Path

from perfd.commands.analyze import analyze_megatron_file

LOG = Path(__file__).resolve().parents[1] / "data" / "megatron" / "h100_resume_save_eval.log"
_TS = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\]"


def _t(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def test_goodput_parts_match_the_logs_own_figures() -> None:
    text = LOG.read_text()
    saving = [_t(m) for m in re.findall(_TS + r" saving checkpoint at iteration", text)]
    saved = [_t(m) for m in re.findall(_TS + r" successfully saved checkpoint", text)]
    steps = [(int(i), _t(ts), float(ms)) for ts, i, ms in re.findall(
        _TS + r" iteration\s+(\d+)/.*?elapsed time per iteration \(ms\): ([0-9.]+)", text)]
    assert len(saving) == len(saved) == 4 and [s[0] for s in steps] == list(range(1, 41))
    _, analysis = analyze_megatron_file(str(LOG), gpu="NVIDIA H100 80GB HBM3")
    g = analysis.summary["goodput"]
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
    # Training and incidents: every step's logged time, but never more than the wall time between its
    # line and the one before (Megatron's first iterations of a run log an elapsed time that overlaps
    # the previous one's: iteration 2 logs 2,067 ms 752 ms after iteration 1's line).
    windows = {i: t - t_prev for (_, t_prev, _), (i, t, _) in itertools.pairwise(steps)}
    want_train = sum(min(ms / 1e3, windows.get(i, ms / 1e3)) for i, _, ms in steps)
    assert math.isclose(parts["training"] + parts["incident"], want_train, rel_tol=0.01)
    assert parts["evaluation"] > 0 and parts["redone"] == 0.0
