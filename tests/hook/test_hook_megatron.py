"""perfd.hook.megatron: Megatron-LM's train_step wrapped, step numbers from its iteration counter."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.hook import megatron as hm


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def step_begin(self, step: int | None) -> None:
        self.calls.append(("begin", step))

    def step_end(self) -> None:
        self.calls.append(("end", None))

    def abandon_step(self) -> None:
        self.calls.append(("abandon", None))


@pytest.fixture
def fake_megatron(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in for megatron.training.training: train_step advances args.iteration as Megatron's
    train() does around it (the counter is read before the call)."""
    args = types.SimpleNamespace(iteration=41)
    mod = types.ModuleType("megatron.training.training")

    def train_step(x: int, fail: bool = False) -> int:
        if fail:
            raise RuntimeError("loss is NaN")
        return x * 2

    mod.train_step = train_step  # type: ignore[attr-defined]
    mod.get_args = lambda: args  # type: ignore[attr-defined]
    for name in ("megatron", "megatron.training"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "megatron.training.training", mod)
    yield mod


def test_each_train_step_is_one_hook_step_numbered_by_megatrons_iteration(
        fake_megatron: types.ModuleType) -> None:
    rec = Recorder()
    made: list[int] = []

    def make() -> Recorder:
        made.append(1)
        return rec

    assert hm.install(make) is True
    assert made == []  # made at the first step, after Megatron set the device
    assert fake_megatron.train_step(3) == 6
    fake_megatron.get_args().iteration += 1
    assert fake_megatron.train_step(4) == 8
    assert rec.calls == [("begin", 42), ("end", None), ("begin", 43), ("end", None)] and made == [1]
    with pytest.raises(RuntimeError):
        fake_megatron.train_step(1, fail=True)
    assert rec.calls[-2:] == [("begin", 43), ("abandon", None)]
    assert hm.install(make) is True  # installing twice does not wrap twice
    fake_megatron.train_step(1)
    assert rec.calls[-2:] == [("begin", 43), ("end", None)]


def test_without_megatron_the_script_runs_unhooked_and_says_so(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('trained', sys.argv[1:])\n")
    proc = subprocess.run([sys.executable, "-m", "perfd.hook.megatron", str(script), "--lr", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "trained ['--lr', '1']" in proc.stdout
    assert "running without the step hook" in proc.stderr


def test_a_missing_script_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "perfd.hook.megatron", str(tmp_path / "nope.py")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no such training script" in proc.stderr
