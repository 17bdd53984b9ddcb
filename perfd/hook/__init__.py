"""The optional in-process step hook: step times, data wait and percentiles to the local agent.

Importing this package does not import torch; ``StepHook(cuda=True)`` does, lazily. Framework
callbacks live in ``perfd.hook.lightning`` and ``perfd.hook.hf`` and import their framework only
when called. See collectors/hook/README.md for the agent side and the wire format.
"""

from perfd.hook.step import StepHook
from perfd.hook.timing import HostMarker, RollingPercentiles

__all__ = ["HostMarker", "RollingPercentiles", "StepHook"]
