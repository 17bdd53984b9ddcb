"""A PyTorch Lightning callback driving :class:`perfd.hook.StepHook`.

``trainer = Trainer(callbacks=[lightning_callback(tokens_per_step=...)])``. The ``Callback`` subclass
is created on the first call, importing ``lightning.pytorch`` (or the older ``pytorch_lightning``)
only then: importing this module needs neither.

Step = one optimizer step, numbered ``trainer.global_step`` after it (the number other sources use):
opened at the ``on_train_batch_start`` of its first micro-batch (its batch fetched just before),
closed at the ``on_train_batch_end`` after which the global step has moved. The time between two
steps (the fetch, Lightning's logging, a validation run) counts in the next step's period; the
fetches, between the steps or of a gradient-accumulation step's later micro-batches, are its data
wait (Lightning's DataLoader fetches are stamped: perfd.hook.loader). A validation run between the
steps is announced as an evaluation (``hook.phase``), so its time and its loader's fetches are not
the next step's.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Protocol

from perfd.hook import wire
from perfd.hook.jobinfo import module_version
from perfd.hook.step import StepHook

if TYPE_CHECKING:
    from lightning.pytorch import Callback
    from typing_extensions import Unpack

    from perfd.hook.hook_types import StepHookOptions

    class LightningCallback(Callback):
        """What :func:`lightning_callback` returns (its class is made at the first call, when
        Lightning is imported)."""

        hook: StepHook

        def __init__(self, hook: StepHook) -> None: ...

_CLASS: type[LightningCallback] | None = None


class _Trainer(Protocol):
    """What the callback reads of Lightning's ``Trainer``."""

    global_step: int
    sanity_checking: bool


def _base() -> tuple[type, str | None]:
    """Lightning's Callback class and the version of the package it came from."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        base: type = mod.Callback
        # lightning.pytorch is a part of the lightning package, whose version is its parent's
        return base, module_version(mod) or module_version(sys.modules.get(name.split(".")[0]))
    raise ImportError("perfd.hook.lightning needs lightning (or pytorch_lightning) installed")


def _make_class() -> type[LightningCallback]:
    base, version = _base()

    class PerfdLightningCallback(base):  # type: ignore[valid-type,misc]
        def __init__(self, hook: StepHook) -> None:
            super().__init__()
            self.hook = hook
            hook.driven_by(wire.FRAMEWORK_LIGHTNING, version)  # the job's advice in Lightning's terms
            self._opened_at: int | None = None  # global_step when the open step began

        def on_train_batch_start(self, trainer: _Trainer, pl_module: object, batch: object,
                                 batch_idx: int) -> None:
            if self._opened_at is None:  # the first micro-batch of an optimizer step
                self._opened_at = int(trainer.global_step)
                self.hook.step_begin(self._opened_at + 1)

        def on_train_batch_end(self, trainer: _Trainer, pl_module: object, outputs: object, batch: object,
                               batch_idx: int) -> None:
            if self._opened_at is not None and trainer.global_step > self._opened_at:
                self.hook.step_end()  # the optimizer stepped: one step done
                self._opened_at = None

        def on_validation_start(self, trainer: _Trainer, pl_module: object) -> None:
            if not trainer.sanity_checking:  # the sanity check runs before the first step
                self.hook.phase_begin("evaluation", int(trainer.global_step))

        def on_validation_end(self, trainer: _Trainer, pl_module: object) -> None:
            if not trainer.sanity_checking:
                self.hook.phase_end()

        def on_train_end(self, trainer: _Trainer, pl_module: object) -> None:
            self.hook.abandon_step()  # an accumulation the epoch's end cut short
            self._opened_at = None
            self.hook.close(timeout_s=1.0)

    return PerfdLightningCallback


def lightning_callback(hook: StepHook | None = None, **hook_kwargs: Unpack[StepHookOptions]
                       ) -> LightningCallback:
    """A Lightning ``Callback`` that times the Trainer's optimizer steps with a :class:`StepHook`.

    Args:
        hook: the hook to drive; None: a new ``StepHook(**hook_kwargs)``.
        **hook_kwargs: :class:`StepHook`'s arguments (``tokens_per_step=``, ``model=``, ...), when
            ``hook`` is None.

    Returns:
        The callback, for ``Trainer(callbacks=[...])``; it closes the hook at ``on_train_end``.

    Raises:
        ImportError: neither lightning nor pytorch_lightning is installed.
    """
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_class()
    return _CLASS(hook if hook is not None else StepHook(**hook_kwargs))
