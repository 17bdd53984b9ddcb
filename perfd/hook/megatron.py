"""Run a Megatron-LM training script with the perfd step hook around each iteration, unmodified.

    torchrun --nproc_per_node 8 -m perfd.hook.megatron pretrain_gpt.py --tensor-model-parallel-size ...

Megatron-LM's ``train()`` (megatron/training/training.py) calls the module-level ``train_step``
once per iteration and looks the name up at call time, so wrapping that one function brackets
every iteration (data fetch, forward/backward of every micro-batch, the optimizer step) with
``step_begin()`` / ``step_end()`` without touching the training code. Everything else (socket,
rank, CUDA events) is :class:`perfd.hook.StepHook`'s defaults and environment
(``PERFD_HOOK_SOCKET``, which ``perfd launch --agent-socket`` sets).

Step numbers are the iteration numbers Megatron logs, so hook records join the log's iteration
lines and a profile request for "step N" opens at the iteration the log calls N. ``train()`` keeps
its count in a local ``iteration`` (the iterations done so far), hands it to ``train_step`` as
``iteration=`` (core >= 0.17) and stores it in ``args.curr_iteration`` just before the call (every
version since at least core 0.12), and logs ``iteration + 1`` for that step. ``args.iteration`` is
NOT that counter: it is the iteration loaded from the checkpoint (0 for a fresh run) and stays put
while training runs — reading it numbered every step of a fresh run 1, so a profile request for a
later step never opened (seen on core 0.20 under ``perfd nsys-prefix``).

If the Megatron-LM in use has no ``megatron.training.training.train_step`` (another layout), the
script runs without the hook and says so on stderr once: the job is never stopped by perfd. If
neither counter can be read, the hook numbers the steps itself (from 1).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import runpy
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Protocol

from perfd.hook.step import StepHook

_TARGET = ("megatron.training.training", "train_step")


class StepBoundaries(Protocol):
    """What the wrapper calls (a StepHook's step boundaries)."""

    def step_begin(self, step: int | None, /) -> None: ...

    def step_end(self) -> None: ...

    def abandon_step(self) -> None: ...


def _param_index(fn: Callable[..., object], name: str) -> int | None:
    """Position of parameter ``name`` in ``fn``'s signature (for a caller that passes it
    positionally), or None when it has none."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    for i, p in enumerate(params):
        if p.name == name and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return i
    return None


def _done_before(module: ModuleType, args: tuple[object, ...], kwargs: Mapping[str, object],
                 index: int | None) -> int | None:
    """Iterations Megatron had completed before this ``train_step`` call: the ``iteration``
    argument it was given, else ``get_args().curr_iteration``; None when neither is an int."""
    it = kwargs.get("iteration")
    if it is None and index is not None and len(args) > index:
        it = args[index]
    if isinstance(it, int) and not isinstance(it, bool):
        return it
    try:
        it = getattr(module.get_args(), "curr_iteration", None)
    except Exception:
        return None
    return it if isinstance(it, int) and not isinstance(it, bool) else None


def install(make_hook: Callable[[], StepBoundaries] = StepHook) -> bool:
    """Wrap Megatron-LM's ``train_step`` with the hook.

    The hook is made at the first step, not here: its CUDA events belong to the current device,
    which Megatron sets (``torch.cuda.set_device(local_rank)``) only during initialisation.

    Args:
        make_hook: what makes the hook at the first step (``StepHook``; a test gives its own).

    Returns:
        True when ``train_step`` is wrapped (or already was); False, with a note on stderr, when
        Megatron-LM's training module or its ``train_step`` cannot be imported.
    """
    try:
        module = importlib.import_module(_TARGET[0])
        original: Callable[..., object] = getattr(module, _TARGET[1])
    except (ImportError, AttributeError) as exc:
        print(f"perfd.hook.megatron: no {'.'.join(_TARGET)} ({exc}); running without the step hook",
              file=sys.stderr, flush=True)
        return False
    if getattr(original, "__perfd_hook__", False):
        return True
    hooks: list[StepBoundaries] = []
    index = _param_index(original, "iteration")

    @functools.wraps(original)
    def train_step(*args: object, **kwargs: object) -> object:
        if not hooks:
            hooks.append(make_hook())
        h = hooks[0]
        done = _done_before(module, args, kwargs, index)
        h.step_begin(None if done is None else done + 1)  # the number Megatron logs for this step
        try:
            out = original(*args, **kwargs)
        except BaseException:
            h.abandon_step()  # a step that raised is not a step time
            raise
        h.step_end()
        return out

    train_step.__perfd_hook__ = True  # type: ignore[attr-defined]
    setattr(module, _TARGET[1], train_step)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    script = argv[0]
    if not os.path.isfile(script):
        print(f"perfd.hook.megatron: {script}: no such training script", file=sys.stderr)
        return 2
    # The script imports megatron relative to its own directory, as `python pretrain_gpt.py` would.
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    sys.argv = argv
    install()
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
