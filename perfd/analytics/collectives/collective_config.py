"""The collective analysis's settings and the names of its record sources (pure). Apart from
:mod:`perfd.analytics.collectives.collective_analysis` so that its parts
(:mod:`perfd.analytics.collectives.bandwidth`)
and the aggregator that configures it read one declaration without importing the analysis itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfd.analytics.collectives.groups import DEFAULT_INTER_NODE_LINK, DEFAULT_ORDER
from perfd.core import limits as L

FR = "flight_recorder"
INSPECTOR = "nccl_inspector"


@dataclass
class CollectiveConfig:
    intra_node_link: str | None = None  # None: from the GPU model (perfd.analytics.collectives.groups)
    inter_node_link: str = DEFAULT_INTER_NODE_LINK
    intra_node_busbw_gbs: float | None = None  # overrides the link table
    inter_node_busbw_gbs: float | None = None
    min_bandwidth_bytes: int = 64 << 20
    low_bandwidth_fraction: float = 0.5
    recent_windows: int = L.COMM_RECENT_WINDOWS  # the summary: over the latest complete windows a rank
    straggler_min_ops: int = 20
    order: str = DEFAULT_ORDER
    max_iterations_out: int = L.COMM_ITERATIONS_OUT
