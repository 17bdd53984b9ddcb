"""Rank processes collector: each rank process's state, CPU, run-queue wait, allowed CPUs and who else
runs on them, its cgroup's throttling, pressure and OOM kills.

See README.md in this folder for what it reads, each metric, costs, config keys and failure behaviour.
"""

from __future__ import annotations

from perfd.collectors.collector import Registry
from perfd.collectors.ranks.collector import SOURCES, RanksCollector, RanksConfig

__all__ = ["SOURCES", "RanksCollector", "RanksConfig", "register"]


def register(registry: Registry) -> None:
    registry.register("ranks", lambda cfg: RanksCollector(cfg))
