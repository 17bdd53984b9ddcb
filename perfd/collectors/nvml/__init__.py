"""NVML + GPM collector: per-GPU samples, process lists, XID events; record and replay.

See README.md in this folder for what it reads, each metric, costs, config keys and failure
behaviour.
"""

from __future__ import annotations

from perfd.collectors.collector import Registry
from perfd.collectors.nvml.collector import (
    METRIC_NAMES,
    THROTTLE_REASONS,
    NvmlCollector,
    NvmlConfig,
    decode_throttle,
)
from perfd.collectors.nvml.replay import ReplaySource
from perfd.collectors.nvml.wrapper import Nvml

__all__ = [
    "METRIC_NAMES", "THROTTLE_REASONS", "Nvml", "NvmlCollector", "NvmlConfig", "ReplaySource",
    "decode_throttle", "register",
]


def register(registry: Registry) -> None:
    """Register the one "nvml" collector; ``source`` in its config picks real, replay:FILE or off."""
    registry.register("nvml", lambda cfg: NvmlCollector(cfg))
