"""Run a Megatron-LM training script with the perfd step hook around each iteration, unmodified.

    torchrun --nproc_per_node 8 -m perfd.hook.megatron pretrain_gpt.py --tensor-model-parallel-size ...

Megatron-LM's ``train()`` (megatron/training/training.py) calls the module-level ``train_step``
once per iteration and looks the name up at call time, so wrapping that one function brackets
every iteration (data fetch, forward/backward of every micro-batch, the optimizer step) with
``step_begin()`` / ``step_end()`` without touching the training code. The step number is
Megatron's own iteration (``args.iteration`` after ``train_step`` returns is the iteration it ran,
+1 from the count it had), so hook records join the log's iteration lines. Everything else
(socket, rank, CUDA events) is :class:`perfd.hook.StepHook`'s defaults and environment
(``PERFD_HOOK_SOCKET``, which ``perfd launch --agent-socket`` sets).

If the Megatron-LM in use has no ``megatron.training.training.train_step`` (another layout), the
script runs without the hook and says so on stderr once: the job is never stopped by perfd.
"""

from __future__ import annotations

import functools
import importlib
import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

from perfd.hook.step import StepHook

_TARGET = ("megatron.training.training", "train_step")


def _iteration(module: Any) -> int | None:
    """Megatron's iteration counter before this step (``get_args().iteration``), if readable."""
    try:
        args = module.get_args()
    except Exception:
        return None
    it = getattr(args, "iteration", None)
    return it if isinstance(it, int) else None


def install(make_hook: Callable[[], Any] = StepHook) -> bool:
    """Wrap Megatron-LM's ``train_step`` with the hook; False (and a note) when it cannot.

    The hook is made at the first step, not here: its CUDA events belong to the current device,
    which Megatron sets (``torch.cuda.set_device(local_rank)``) only during initialisation.
    """
    try:
        module = importlib.import_module(_TARGET[0])
        original: Callable[..., Any] = getattr(module, _TARGET[1])
    except (ImportError, AttributeError) as exc:
        print(f"perfd.hook.megatron: no {'.'.join(_TARGET)} ({exc}); running without the step hook",
              file=sys.stderr, flush=True)
        return False
    if getattr(original, "__perfd_hook__", False):
        return True
    hooks: list[Any] = []

    @functools.wraps(original)
    def train_step(*args: Any, **kwargs: Any) -> Any:
        if not hooks:
            hooks.append(make_hook())
        h = hooks[0]
        it = _iteration(module)
        h.step_begin(None if it is None else it + 1)
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
