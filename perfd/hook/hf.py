"""A Hugging Face ``transformers.TrainerCallback`` driving :class:`perfd.hook.StepHook`.

``Trainer(..., callbacks=[hf_callback(tokens_per_step=...)])``. The subclass is created on the
first call, importing ``transformers`` only then: importing this module does not need it.

Step = one optimizer step, numbered ``state.global_step`` after it. The Trainer fetches a step's
batches before ``on_step_begin``, so the step is opened at the end of the previous one and
``on_step_begin`` marks the data as ready: the fetch is the data wait.
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
            self._open = False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._begin(state)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not self._open:
                self._begin(state)
            self.hook.data_ready()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._open:
                self.hook.step_end()
            self._begin(state)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.hook.abandon_step()
            self._open = False
            self.hook.close(timeout_s=1.0)

        def _begin(self, state: Any) -> None:
            self.hook.step_begin(int(state.global_step) + 1)
            self._open = True

    return PerfdHFCallback


def hf_callback(hook: StepHook | None = None, **hook_kwargs: Any) -> Any:
    """A ``TrainerCallback`` instance around ``hook`` (or a new ``StepHook(**hook_kwargs)``)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_class()
    return _CLASS(hook if hook is not None else StepHook(**hook_kwargs))
