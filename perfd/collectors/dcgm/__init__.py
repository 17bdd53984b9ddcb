"""DCGM collector: SM / tensor / DRAM activity from a running dcgm-exporter, on GPUs without GPM.

See README.md in this folder for the fields, labels, config keys and failure behaviour.
"""

from __future__ import annotations

from perfd.collectors.collector import Registry
from perfd.collectors.dcgm.collector import FIELDS, SOURCE, DcgmCollector, DcgmConfig, samples_from_exposition

__all__ = ["FIELDS", "SOURCE", "DcgmCollector", "DcgmConfig", "register", "samples_from_exposition"]


def register(registry: Registry) -> None:
    registry.register("dcgm", lambda cfg: DcgmCollector({k: v for k, v in cfg.items() if k != "interval_s"}))
