"""A Hugging Face ``transformers.TrainerCallback`` driving :class:`perfd.hook.StepHook`.

``Trainer(..., callbacks=[hf_callback(tokens_per_step=...)])``. The subclass is created on the
first call, importing ``transformers`` only then: importing this module does not need it.

Step = one optimizer step, numbered ``state.global_step`` after it: opened at ``on_step_begin``
(the Trainer has fetched the step's batches, every gradient-accumulation micro-batch, just before),
closed at ``on_step_end``. The fetch, and the logging, evaluation and saving the Trainer does after
``on_step_end``, lie between two steps: the hook counts that time in the next step's period, the
fetch as its data wait (the Trainer's DataLoader fetches are stamped: perfd.hook.loader), the rest as
"outside the step". The Trainer's own evaluations and checkpoint saves between the steps are
announced (``hook.phase``), so that their time and their loaders' fetches are not the next step's:
at ``on_step_end`` the Trainer's flow callback (always the first) has already said what follows
(``control.should_evaluate``, ``should_save``), and ``on_evaluate`` / ``on_save`` come when each is
done.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from perfd.hook import wire
from perfd.hook.jobinfo import module_version
from perfd.hook.step import StepHook

if TYPE_CHECKING:
    from transformers import TrainerCallback
    from typing_extensions import Unpack

    from perfd.hook.hook_types import StepHookOptions

    class HFCallback(TrainerCallback):
        """What :func:`hf_callback` returns (its class is made at the first call, when transformers
        is imported)."""

        hook: StepHook

        def __init__(self, hook: StepHook) -> None: ...

_CLASS: type[HFCallback] | None = None


class _TrainerState(Protocol):
    """What the callback reads of transformers' ``TrainerState``."""

    global_step: int


def _make_class() -> type[HFCallback]:
    try:
        module = importlib.import_module("transformers")
    except ImportError as exc:
        raise ImportError("perfd.hook.hf needs transformers installed") from exc
    base: type = module.TrainerCallback
    version = module_version(module)

    class PerfdHFCallback(base):  # type: ignore[misc]
        def __init__(self, hook: StepHook) -> None:
            self.hook = hook
            hook.driven_by(wire.FRAMEWORK_HF_TRAINER, version)  # the job's advice in TrainingArguments
            self._phase: str | None = None  # the pause announced and not yet ended
            self._save_next = False  # a checkpoint save follows the evaluation

        def on_step_begin(self, args: object, state: _TrainerState, control: object,
                          **kwargs: object) -> None:
            self._end_phase()
            self.hook.step_begin(int(state.global_step) + 1)

        def on_step_end(self, args: object, state: _TrainerState, control: object, **kwargs: object) -> None:
            self.hook.step_end()
            self._save_next = bool(getattr(control, "should_save", False))
            if getattr(control, "should_evaluate", False):
                self._begin_phase("evaluation", state)
            elif self._save_next:
                self._save_next = False
                self._begin_phase("checkpoint", state)

        def on_evaluate(self, args: object, state: _TrainerState, control: object, **kwargs: object) -> None:
            if self._phase == "evaluation":
                self._end_phase()
                if self._save_next:
                    self._save_next = False
                    self._begin_phase("checkpoint", state)

        def on_save(self, args: object, state: _TrainerState, control: object, **kwargs: object) -> None:
            if self._phase == "checkpoint":
                self._end_phase()

        def on_train_end(self, args: object, state: _TrainerState, control: object, **kwargs: object) -> None:
            self.hook.abandon_step()  # a step the Trainer stopped in (none in a normal end)
            self._end_phase()
            self.hook.close(timeout_s=1.0)

        def _begin_phase(self, phase: str, state: _TrainerState) -> None:
            self._phase = phase
            self.hook.phase_begin(phase, int(state.global_step))

        def _end_phase(self) -> None:
            if self._phase is not None:
                self._phase = None
                self.hook.phase_end()

    return PerfdHFCallback


def hf_callback(hook: StepHook | None = None, **hook_kwargs: Unpack[StepHookOptions]) -> HFCallback:
    """A ``TrainerCallback`` that times the Trainer's optimizer steps with a :class:`StepHook`.

    Args:
        hook: the hook to drive; None: a new ``StepHook(**hook_kwargs)``.
        **hook_kwargs: :class:`StepHook`'s arguments (``tokens_per_step=``, ``model=``, ...), when
            ``hook`` is None.

    Returns:
        The callback, for ``Trainer(callbacks=[...])``; it closes the hook at ``on_train_end``.

    Raises:
        ImportError: transformers is not installed.
    """
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_class()
    return _CLASS(hook if hook is not None else StepHook(**hook_kwargs))
