"""torchtitan log collector: step, loss, memory, tps, tflops and MFU from torchtitan's training log.

See README.md in this folder for the format (read from torchtitan 0.3.0's source) and limits.
"""

from perfd.collectors.collector import Registry
from perfd.collectors.torchtitan.parser import TorchtitanLogParser

__all__ = ["TorchtitanLogParser", "register"]


def register(registry: Registry) -> None:
    """Add this collector to the agent's registry."""
    from perfd.collectors.torchtitan.collector import TorchtitanCollector

    registry.register("torchtitan", TorchtitanCollector)
