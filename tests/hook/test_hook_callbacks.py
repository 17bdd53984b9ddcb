"""The Lightning and Hugging Face callbacks, driven with stand-in framework modules (neither
framework is installed here): the call order each framework documents, and the steps it yields."""

from __future__ import annotations

import socket
import sys
import time
import types
from pathlib import Path
from typing import Any, cast

import pytest

import perfd.hook.hf as hf
import perfd.hook.lightning as lightning
from perfd.core.model import JobInfo
from perfd.hook import StepHook, wire
from tests.hook.sim_clock import SimClock


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


def _slow(sim: SimClock, n: int, fetch_s: float) -> Any:
    for k in range(n):
        sim.advance(fetch_s)
        yield k


FETCH_S, WORK_S = 0.02, 0.01  # on the simulated clock: 20 and 10 ms to the ns
FETCH_NS, WORK_NS = 20_000_000, 10_000_000


def test_hf_callback_steps(agent: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch,
                           sim_clock: SimClock) -> None:
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
    batches = iter(hook.loader(_slow(sim_clock, 3, FETCH_S)))
    for _ in range(3):
        next(batches)  # get_batch_samples
        cb.on_step_begin(None, state, None)
        sim_clock.advance(WORK_S)
        state.global_step += 1
        cb.on_step_end(None, state, None)
    cb.on_train_end(None, state, None)
    got = received(agent[1])
    assert [m.step for m in got] == [11, 12, 13]
    assert hook.counters()["unpaired"] == 0
    for m in got[1:]:
        assert m.flags & wire.FLAG_HAS_DATA and m.flags & wire.FLAG_FETCH
        assert m.data_wait_ns is not None and m.period_ns is not None
        # the fetch before the step is its data wait and in its period, not in the step
        assert (m.data_wait_ns, m.step_ns, m.period_ns) == (FETCH_NS, WORK_NS, FETCH_NS + WORK_NS)
    assert got[0].period_ns is None  # the first step has no previous end


def test_lightning_callback_with_gradient_accumulation(agent: tuple[str, socket.socket],
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       sim_clock: SimClock) -> None:
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
    batches = iter(hook.loader(_slow(sim_clock, 6, FETCH_S)))
    for batch_idx in range(6):  # accumulate 2 micro-batches per optimizer step
        next(batches)
        cb.on_train_batch_start(trainer, None, None, batch_idx)
        sim_clock.advance(WORK_S)
        if batch_idx % 2 == 1:
            trainer.global_step += 1
        cb.on_train_batch_end(trainer, None, None, None, batch_idx)
    cb.on_train_end(trainer, None)
    got = received(agent[1])
    assert [m.step for m in got] == [1, 2, 3]
    for m in got[1:]:
        assert m.data_wait_ns is not None and m.period_ns is not None
        assert m.data_wait_ns == 2 * FETCH_NS  # both micro-batches' fetches
        assert m.step_ns == FETCH_NS + 2 * WORK_NS  # the second fetch is inside the step
        assert m.period_ns == 2 * (FETCH_NS + WORK_NS)


def _fake_trainer(monkeypatch: pytest.MonkeyPatch, framework: str) -> Any:
    """A stand-in transformers (or lightning.pytorch) with its version, and the callback factory for it."""
    if framework == "hf_trainer":
        fake = types.ModuleType("transformers")
        fake.TrainerCallback = type("TrainerCallback", (), {})  # type: ignore[attr-defined]
        fake.__version__ = "5.17.0"  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "transformers", fake)
        monkeypatch.setattr(hf, "_CLASS", None)
        return hf.hf_callback
    fake = types.ModuleType("lightning.pytorch")
    fake.Callback = type("Callback", (), {})  # type: ignore[attr-defined]
    fake.__version__ = "2.6.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning.pytorch", fake)
    monkeypatch.setattr(lightning, "_CLASS", None)
    return lightning.lightning_callback


def _records(data: bytes) -> list[tuple[int, bytes]]:
    recs, problem = wire.split_records(data)
    assert problem is None
    return recs


@pytest.mark.parametrize(("framework", "version"), [("hf_trainer", "5.17.0"), ("lightning", "2.6.0")])
def test_a_trainers_callback_names_its_trainer_to_the_aggregator(
        framework: str, version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The callback marks its hook (the trainer and the version it imported): the hook's job record names
    it (wire.KIND_FRAMEWORK, after the steps), the agent's collector makes it the job's framework, and
    the aggregator's job info keeps it across the wire (its JSON) and beside a plain hook's word."""
    from perfd.aggregator.jobs import JobStore
    from perfd.collectors.collector import Collected
    from perfd.collectors.hook import HookCollector
    from perfd.core.jobinfo_json import job_info_from_json, job_info_to_json

    make = _fake_trainer(monkeypatch, framework)
    sock = str(tmp_path / "hook.sock")
    c = HookCollector({"socket_path": sock, "job": "j"})
    c.start()
    try:
        hook = StepHook(sock, warmup_steps=0, cuda=False, rank=0, flush_interval_s=0)
        make(hook)
        assert hook.trainer is not None and hook.trainer[1] == version
        for _ in range(3):
            with hook.step():
                pass
        hook.close()
        out = Collected()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not c.counts.get("framework_records"):
            got = c.collect(time.time())
            out.steps += got.steps
            out.job_info.update(got.job_info)
            time.sleep(0.01)
    finally:
        c.stop()
    info = out.job_info["j"]
    assert (info.framework, info.framework_version) == (framework, version)
    store = JobStore(min_recompute_s=0.0)
    store.ingest_job_info("agent-a", "j", job_info_from_json(job_info_to_json(info)))  # as the agent sends it
    store.ingest_job_info("agent-b", "j", JobInfo(framework="pytorch"))  # another node's older hook
    held = store.job_info("j")
    assert held is not None and (held.framework, held.framework_version) == (framework, version)


def test_the_framework_record_follows_the_steps_and_an_older_agent_keeps_them(
        agent: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain StepHook names no trainer; a trainer's hook sends its record after the step records, so an
    agent that does not know the kind stops there and keeps every step before it."""
    plain = StepHook(agent[0], warmup_steps=0, cuda=False, rank=0, flush_interval_s=0)
    with plain.step():
        pass
    plain.close()
    kinds = [k for d in _datagrams(agent[1]) for k, _ in _records(d)]
    assert wire.KIND_JOB in kinds and wire.KIND_FRAMEWORK not in kinds
    hook = StepHook(agent[0], warmup_steps=0, cuda=False, rank=0, flush_interval_s=0)
    _fake_trainer(monkeypatch, "hf_trainer")(hook)
    with hook.step():
        pass
    hook.close()
    (data,) = [d for d in _datagrams(agent[1]) if wire.KIND_JOB in {k for k, _ in _records(d)}]
    recs = _records(data)
    assert [k for k, _ in recs][-1] == wire.KIND_FRAMEWORK
    assert wire.unpack_framework(recs[-1][1]) == wire.FrameworkMsg(0, hook.pid, wire.FRAMEWORK_HF_TRAINER,
                                                                   "5.17.0")
    monkeypatch.delitem(wire.EXPECTED_SIZE, wire.KIND_FRAMEWORK)  # an agent older than the record
    older, problem = wire.split_records(data)
    assert problem == "unknown_kind" and [k for k, _ in older] == [k for k, _ in recs[:-1]]
    assert wire.KIND_STEP2 in [k for k, _ in older]


def _datagrams(sock: socket.socket) -> list[bytes]:
    out: list[bytes] = []
    while True:
        try:
            out.append(sock.recv(65536))
        except BlockingIOError:
            return out
