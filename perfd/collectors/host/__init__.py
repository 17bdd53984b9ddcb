"""Host collector (psutil): CPU, load, memory, network and disk rates of the node.

See README.md in this folder for each metric, costs, config keys and failure behaviour.
"""

from __future__ import annotations

from perfd.collectors.collector import Registry
from perfd.collectors.host.collector import METRIC_NAMES, HostCollector, HostConfig

__all__ = ["METRIC_NAMES", "HostCollector", "HostConfig", "register"]


def register(registry: Registry) -> None:
    registry.register("host", lambda cfg: HostCollector(cfg))
