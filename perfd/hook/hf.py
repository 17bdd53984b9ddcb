"""A Hugging Face ``transformers.TrainerCallback`` driving :class:`perfd.hook.StepHook`.

``Trainer(..., callbacks=[hf_callback(tokens_per_step=...)])``. The subclass is created on the
first call, importing ``transformers`` only then: importing this module does not need it.

Step = one optimizer step, numbered ``state.global_step`` after it: opened at ``on_step_begin``
(the Trainer has fetched the step's batches, every gradient-accumulation micro-batch, just before),
closed at ``on_step_end``. The fetch, and the logging, evaluation and saving the Trainer does after
``on_step_end``, lie between two steps: the hook counts that time in the next step's period, the
fetch as its data wait (the Trainer's DataLoader fetches are stamped: perfd.hook.loader), the rest as
"outside the step".
"""

from __future__ import annotations

import importlib
from typing import Any

from perfd.hook.step import StepHook

_CLASS: type | None = None


def _make_class() -> type:
    try:
        base: type = importlib.import_module("transformers").TrainerCallback
    except ImportError as exc:
        raise ImportError("perfd.hook.hf needs transformers installed") from exc

    class PerfdHFCallback(base):  # type: ignore[misc]
        def __init__(self, hook: StepHook) -> None:
            self.hook = hook

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.hook.step_begin(int(state.global_step) + 1)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.hook.step_end()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.hook.abandon_step()  # a step the Trainer stopped in (none in a normal end)
            self.hook.close(timeout_s=1.0)

    return PerfdHFCallback


def hf_callback(hook: StepHook | None = None, **hook_kwargs: Any) -> Any:
    """A ``TrainerCallback`` instance around ``hook`` (or a new ``StepHook(**hook_kwargs)``)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_class()
    return _CLASS(hook if hook is not None else StepHook(**hook_kwargs))
