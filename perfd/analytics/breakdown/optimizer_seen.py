"""The job's optimizer as a captured trace shows it: its torch.optim class, from the step annotation
torch.optim records around every ``step()`` (``Optimizer.step#SGD.step``), and its implementation,
from the op its step launches last (the update itself: ``aten::_foreach_add_``, ``aten::_fused_adamw_``,
a per-parameter ``aten::add_``). perfd.capture.ops reads them off the trace; the fused-optimizer remedy
(perfd.analytics.advice.remedy_steps) names them. Pure: names in, typed values out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfd.analytics.common import TextEnum
from perfd.core.record_json import JsonRecord, key, or_absent

_STEP_PREFIX = "optimizer.step#"


class OptimizerImpl(TextEnum):
    """How torch.optim runs the update (its ``foreach`` / ``fused`` switches, as the ops show them)."""

    FOREACH = "foreach"  # multi-tensor: a kernel per operation over every parameter (_foreach_*)
    FUSED = "fused"  # one kernel per parameter group (_fused_*)
    PER_PARAMETER = "per-parameter"  # the for-loop (_single_tensor_*): kernels per parameter and operation


# torch.optim's classes with a fused CUDA kernel (fused=True): Adam and AdamW since torch 2.0, SGD since
# 2.3. Adagrad's fused=True ran on the CPU only until a recent release: left out rather than offered to
# a job whose torch may refuse it on its GPU.
FUSED_ON_CUDA = frozenset({"SGD", "Adam", "AdamW"})
# The ones whose update a fused Adam replaces (the remedy's model of what fusing saves is Adam's).
ADAM_CLASSES = frozenset({"Adam", "AdamW"})


@dataclass(frozen=True)
class OptimizerSeen(JsonRecord):
    """The optimizer of the captured steps: its class (None: the trace names no one class) and its
    implementation (None: its step launched nothing the trace shows)."""

    cls: str | None = field(metadata=key("class") | or_absent())  # read back: a name, or none
    impl: OptimizerImpl | None

    @property
    def fusable(self) -> bool:
        """torch has a fused CUDA kernel for the class, and the job does not run it already."""
        return self.cls in FUSED_ON_CUDA and self.impl is not OptimizerImpl.FUSED


def step_class(annotation: str) -> str | None:
    """``Optimizer.step#SGD.step`` → ``SGD``; None for another name."""
    if not annotation.lower().startswith(_STEP_PREFIX):
        return None
    cls = annotation[len(_STEP_PREFIX):].rsplit(".", 1)[0]
    return cls or None


def impl_of(op: str) -> OptimizerImpl:
    """The implementation an optimizer's last launching op shows (its innermost op, or a Python frame
    of torch.optim's where the trace has stacks: ``_single_tensor_adam``, ``_multi_tensor_sgd``)."""
    low = op.lower()
    if "_fused_" in low:
        return OptimizerImpl.FUSED
    if "_foreach_" in low or "_multi_tensor_" in low:
        return OptimizerImpl.FOREACH
    return OptimizerImpl.PER_PARAMETER


def seen(classes: list[str], last_ops: list[str]) -> OptimizerSeen | None:
    """The optimizer of a trace's steps: ``classes`` the class each step annotation names, ``last_ops``
    the op each step launched last. None: no step annotation."""
    if not classes:
        return None
    names = set(classes)
    impls = {impl_of(op) for op in last_ops}
    return OptimizerSeen(next(iter(names)) if len(names) == 1 else None,
                         next(iter(impls)) if len(impls) == 1 else None)
