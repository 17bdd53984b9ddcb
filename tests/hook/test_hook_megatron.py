"""perfd.hook.megatron: Megatron-LM's train_step wrapped, each step numbered as Megatron logs it, and a
profile range opening at the step the agent asks for."""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perfd.hook.step
from perfd.capture.hook_ranges import next_range_start
from perfd.collectors.collector import Collected
from perfd.collectors.hook.collector import HookCollector
from perfd.hook import megatron as hm
from perfd.hook.step import StepHook


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def step_begin(self, step: int | None) -> None:
        self.calls.append(("begin", step))

    def step_end(self) -> None:
        self.calls.append(("end", None))

    def abandon_step(self) -> None:
        self.calls.append(("abandon", None))


class StandIn:
    """megatron.training.training of core 0.20 as far as the wrapper meets it (the mirror's
    megatron/training/training.py): ``train_step`` with its real signature, and a ``train`` that
    keeps the iteration count in a local, stores it in ``args.curr_iteration``, passes it as
    ``iteration=`` and logs ``iteration + 1`` after the step. ``args.iteration`` is the iteration
    loaded from the checkpoint and is not advanced while training runs. ``legacy``: core <= 0.16,
    whose ``train_step`` has no ``iteration`` parameter (only ``args.curr_iteration`` tells)."""

    def __init__(self, loaded_iteration: int = 0, legacy: bool = False) -> None:
        self.args = types.SimpleNamespace(iteration=loaded_iteration, curr_iteration=None, train_iters=0)
        self.logged: list[int] = []  # the "iteration N/ M" numbers of the log
        self.module = types.ModuleType("megatron.training.training")
        self.module.get_args = lambda: self.args  # type: ignore[attr-defined]
        if legacy:
            def train_step_legacy(forward_step_func: Any, data_iterator: Any, model: Any, optimizer: Any,
                                  opt_param_scheduler: Any, config: Any, forward_backward_func: Any) -> Any:
                return self._step(forward_step_func, data_iterator)
            self.module.train_step = train_step_legacy  # type: ignore[attr-defined]
        else:
            def train_step(forward_step_func: Any, data_iterator: Any, model: Any, optimizer: Any,
                           opt_param_scheduler: Any, config: Any, forward_backward_func: Any,
                           iteration: int | None = None, pg_collection: Any = None,
                           p2p_communicator: Any = None) -> Any:
                return self._step(forward_step_func, data_iterator)
            self.module.train_step = train_step  # type: ignore[attr-defined]
        self.legacy = legacy

    @staticmethod
    def _step(forward_step_func: Any, data_iterator: Any) -> tuple[Any, ...]:
        loss = forward_step_func(next(data_iterator))  # forward_backward_func over the micro-batches
        # loss_dict, skipped_iter, should_checkpoint, should_exit, exit_code, grad_norm,
        # num_zeros_in_grad, max_attention_logit
        return {"lm loss": loss}, 0, False, False, None, 1.0, None, None

    def train(self, forward_step_func: Any, train_iters: int) -> int:
        args = self.args
        args.train_iters = train_iters
        iteration: int = args.iteration
        data = iter(range(10**6))
        while iteration < args.train_iters:
            args.curr_iteration = iteration
            # train() calls the module global, looked up at call time (what the wrapper replaces).
            step = self.module.train_step
            if self.legacy:
                out = step(forward_step_func, data, [None], None, None, None, None)
            else:
                out = step(forward_step_func, data, [None], None, None, None, None, iteration=iteration,
                           pg_collection=None, p2p_communicator=None)
            _loss_dict, _skipped, _ckpt, should_exit, *_ = out
            if should_exit:
                break
            iteration += 1
            self.logged.append(iteration)  # training_log(..., iteration, ...) after the increment
        return iteration


@pytest.fixture
def megatron(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    m = StandIn()
    for name in ("megatron", "megatron.training"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "megatron.training.training", m.module)
    yield m


def test_each_iteration_is_one_hook_step_numbered_as_megatron_logs_it(megatron: StandIn) -> None:
    rec = Recorder()
    made: list[int] = []

    def make() -> Recorder:
        made.append(1)
        return rec

    assert hm.install(make) is True
    assert made == []  # made at the first step, after Megatron set the device
    assert megatron.train(lambda batch: float(batch), train_iters=4) == 4
    assert megatron.logged == [1, 2, 3, 4]
    assert rec.calls == [c for n in (1, 2, 3, 4) for c in (("begin", n), ("end", None))] and made == [1]
    assert hm.install(make) is True  # installing twice does not wrap twice
    assert megatron.train(lambda batch: float(batch), train_iters=6) == 6  # resumed from args.iteration 0
    assert [s for k, s in rec.calls if k == "begin"][-6:] == [1, 2, 3, 4, 5, 6]


def test_a_step_that_raises_is_abandoned(megatron: StandIn) -> None:
    rec = Recorder()
    hm.install(lambda: rec)

    def forward(batch: int) -> float:
        if batch == 2:
            raise RuntimeError("loss is NaN")
        return 1.0

    with pytest.raises(RuntimeError):
        megatron.train(forward, train_iters=5)
    assert rec.calls == [("begin", 1), ("end", None), ("begin", 2), ("end", None), ("begin", 3),
                         ("abandon", None)]


def test_a_resumed_run_counts_from_the_checkpoint(megatron: StandIn) -> None:
    megatron.args.iteration = 500  # loaded from a checkpoint
    rec = Recorder()
    hm.install(lambda: rec)
    megatron.train(lambda batch: 1.0, train_iters=503)
    assert megatron.logged == [501, 502, 503]
    assert [s for k, s in rec.calls if k == "begin"] == [501, 502, 503]


def test_older_megatron_without_the_iteration_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    m = StandIn(loaded_iteration=7, legacy=True)
    monkeypatch.setitem(sys.modules, "megatron.training.training", m.module)
    rec = Recorder()
    assert hm.install(lambda: rec) is True
    m.train(lambda batch: 1.0, train_iters=10)
    assert [s for k, s in rec.calls if k == "begin"] == m.logged == [8, 9, 10]


def test_without_a_readable_counter_the_hook_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("megatron.training.training")
    mod.train_step = lambda *a, **k: 0  # type: ignore[attr-defined]
    mod.get_args = lambda: (_ for _ in ()).throw(RuntimeError("args not initialised"))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron.training.training", mod)
    rec = Recorder()
    hm.install(lambda: rec)
    mod.train_step(1, iteration="3")  # not an int: ignored
    assert rec.calls == [("begin", None), ("end", None)]


def test_a_profile_range_opens_at_the_step_the_agent_asks_for(
        megatron: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The nsys-by-rule path on Megatron's loop, CPU only: the real hook collector and step hook,
    the agent's choice of start step (two past the rank's last reported step), and cudaProfiler
    calls recorded in place of CUDA's. On a fresh run every step used to be numbered 1 (from
    ``args.iteration``), so the range was accepted "at step 3" and never opened."""
    monkeypatch.setattr(perfd.hook.step, "_POLL_INTERVAL_NS", 0)  # poll at every step: no timing
    collector = HookCollector({"socket_path": str(tmp_path / "hook.sock"), "job": "j"})
    collector.start()
    profiled: list[tuple[str, int]] = []
    hooks: list[StepHook] = []
    collected = Collected()
    asked: list[int] = []

    def collect(until: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = collector.collect(time.time())
            collected.steps += got.steps
            collected.events += got.events
            if until():
                return
            time.sleep(0.005)

    def make() -> StepHook:
        h = StepHook(str(tmp_path / "hook.sock"), warmup_steps=0, cuda=False, rank=0, flush_interval_s=0,
                     profiler=(lambda: profiled.append(("start", megatron.args.curr_iteration + 1)),
                               lambda: profiled.append(("stop", megatron.args.curr_iteration + 1))))
        hooks.append(h)
        return h

    def forward(batch: int) -> float:
        # In step with the agent (iteration batch + 1 runs; the previous ones have been reported): a
        # datagram socket queues ~10, and a receiver thread starved on a busy machine must not drop any.
        collect(lambda: len(collected.steps) >= batch)
        if batch == 9:  # during iteration 10 the rule fires and the agent asks rank 0 for 3 steps
            start = next_range_start(collector.peers[0].last_step)
            assert collector.request_profile(0, start, 3) is not None
            asked.append(start)
        return 1.0

    try:
        assert hm.install(make)
        megatron.train(forward, train_iters=20)
        hooks[0].close()
        collect(lambda: len(collected.events) >= 3 and len(collected.steps) >= 20)
    finally:
        collector.stop()
    (start,) = asked
    assert start == 11  # last reported step 9 (Megatron's iteration 9): the range starts at 11
    assert profiled == [("start", 11), ("stop", 13)]
    states = [(e["state"], e["step"]) for e in collected.events if e["kind"] == "hook_profile"]
    assert states == [("accepted", 11), ("started", 11), ("stopped", 13)]
    assert [s.iteration for s in collected.steps] == megatron.logged == list(range(1, 21))
    assert [s.iteration for s in collected.steps if s.disturbed_by_capture] == [11, 12, 13]


def _run_module(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                *argv: str) -> tuple[int, str, str]:
    """``python -m perfd.hook.megatron ARGV``: its main() in this process (return value, stdout, stderr).
    main() puts the script's folder on sys.path and the script's arguments in sys.argv, as the command
    does for the script it runs: both are this process's, so monkeypatch puts them back after."""
    monkeypatch.setattr(sys, "path", sys.path[:])
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    capsys.readouterr()
    rc = hm.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_without_megatron_the_script_runs_unhooked_and_says_so(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('trained', sys.argv[1:])\n")
    # Megatron-LM is not installed here; None in sys.modules makes its import fail so in this process
    # too, whatever stand-in another test of the worker imported.
    monkeypatch.setitem(sys.modules, hm._TARGET[0], None)
    rc, out, err = _run_module(capsys, monkeypatch, str(script), "--lr", "1")
    assert rc == 0 and "trained ['--lr', '1']" in out
    assert "running without the step hook" in err


def test_a_missing_script_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rc, _, err = _run_module(capsys, monkeypatch, str(tmp_path / "nope.py"))
    assert rc == 2 and "no such training script" in err
