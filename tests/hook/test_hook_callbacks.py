"""The Lightning and Hugging Face callbacks, driven with stand-in framework modules (neither
framework is installed here): the call order each framework documents, and the steps it yields."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import types
from typing import Any, cast

import pytest

import perfd.hook.hf as hf
import perfd.hook.lightning as lightning
from perfd.hook import StepHook, wire


def received(sock: socket.socket) -> list[wire.StepMsg]:
    out: list[wire.StepMsg] = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return out
        recs, problem = wire.split_records(data)
        assert problem is None
        out += [wire.unpack_step(d) for k, d in recs if k in wire.STEP_KINDS]


def test_importing_the_hook_imports_no_framework_and_no_torch() -> None:
    code = ("import sys, perfd.hook, perfd.hook.hf, perfd.hook.lightning, collectors.hook; "
            "bad = [m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning') "
            "if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_calling_without_the_framework_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    monkeypatch.setattr(hf, "_CLASS", None)
    monkeypatch.setattr(lightning, "_CLASS", None)
    with pytest.raises(ImportError, match="transformers"):
        hf.hf_callback(cuda=False)
    with pytest.raises(ImportError, match="lightning"):
        lightning.lightning_callback(cuda=False)


def _slow(n: int, sleep_s: float) -> Any:
    for k in range(n):
        time.sleep(sleep_s)
        yield k


FETCH_S, WORK_S = 0.02, 0.01


def test_hf_callback_steps(agent: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    """The Trainer's order: the step's batches fetched, on_step_begin, the step, on_step_end (then its
    logging and saving). The fetch lies between the steps: the next step's period and data wait."""
    fake = types.ModuleType("transformers")

    class TrainerCallback:
        pass

    fake.TrainerCallback = TrainerCallback  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)
    monkeypatch.setattr(hf, "_CLASS", None)
    hook = StepHook(agent[0], warmup_steps=0, cuda=False, rank=0)
    cb = hf.hf_callback(hook)
    assert isinstance(cb, TrainerCallback)
    cb = cast(Any, cb)
    state = types.SimpleNamespace(global_step=10)  # resumed at step 10
    batches = iter(hook.loader(_slow(3, FETCH_S)))
    for _ in range(3):
        next(batches)  # get_batch_samples
        cb.on_step_begin(None, state, None)
        time.sleep(WORK_S)
        state.global_step += 1
        cb.on_step_end(None, state, None)
    cb.on_train_end(None, state, None)
    got = received(agent[1])
    assert [m.step for m in got] == [11, 12, 13]
    assert hook.counters()["unpaired"] == 0
    for m in got[1:]:
        assert m.flags & wire.FLAG_HAS_DATA and m.flags & wire.FLAG_FETCH
        assert m.data_wait_ns is not None and m.period_ns is not None
        assert FETCH_S <= m.data_wait_ns / 1e9 < m.period_ns / 1e9
        assert WORK_S <= m.step_ns / 1e9 < (m.period_ns - m.data_wait_ns + 1e6) / 1e9
    assert got[0].period_ns is None  # the first step has no previous end


def test_lightning_callback_with_gradient_accumulation(agent: tuple[str, socket.socket],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's order: each micro-batch fetched, on_train_batch_start, its work,
    on_train_batch_end (the global step moves after the last of an optimizer step's). The step opens
    at its first micro-batch: one fetch lies between the steps, the second inside it; both are its
    data wait."""
    fake = types.ModuleType("pytorch_lightning")

    class Callback:
        pass

    fake.Callback = Callback  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)  # only the old package "installed"
    monkeypatch.setitem(sys.modules, "pytorch_lightning", fake)
    monkeypatch.setattr(lightning, "_CLASS", None)
    hook = StepHook(agent[0], warmup_steps=0, cuda=False, rank=0)
    cb: Any = lightning.lightning_callback(hook)
    assert isinstance(cb, Callback)  # (narrowing to Callback would hide the hook methods)
    cb = cast(Any, cb)
    trainer = types.SimpleNamespace(global_step=0)
    batches = iter(hook.loader(_slow(6, FETCH_S)))
    for batch_idx in range(6):  # accumulate 2 micro-batches per optimizer step
        next(batches)
        cb.on_train_batch_start(trainer, None, None, batch_idx)
        time.sleep(WORK_S)
        if batch_idx % 2 == 1:
            trainer.global_step += 1
        cb.on_train_batch_end(trainer, None, None, None, batch_idx)
    cb.on_train_end(trainer, None)
    got = received(agent[1])
    assert [m.step for m in got] == [1, 2, 3]
    for m in got[1:]:
        assert m.data_wait_ns is not None and m.period_ns is not None
        assert 2 * FETCH_S <= m.data_wait_ns / 1e9 < m.period_ns / 1e9  # both micro-batches' fetches
        assert FETCH_S + 2 * WORK_S <= m.step_ns / 1e9  # the second fetch is inside the step
        assert m.period_ns / 1e9 >= 2 * (FETCH_S + WORK_S)
