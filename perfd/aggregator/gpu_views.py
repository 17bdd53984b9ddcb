"""Cached views of a job's GPUs for the aggregator's frequent readers.

Placing every rank of a big job (perfd.analytics.incidents.attribution.place_ranks over every GPU's process
list) costs ~2.5 us a rank (8,000 ranks: 16-20 ms on a 2-core VM, plus 30 ms to copy the lists out
of the node view; `perfd bench baseline`), and /metrics, the rules, the liveness of every job and
every incident snapshot asked for it anew. :class:`PlacementCache` keeps each job's placement until
a process list changes in a way that can move it (NodeView.placement_version) or the job's agents
change. :class:`SnapshotView` is what an analysis pass's incident snapshots read of the job's GPUs.

Thread safety: entries are immutable (a frozen dataclass over a read-only mapping) and swapped under
a lock; they are computed outside it, so two threads may both compute one, and either result is right.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from perfd.aggregator.nodes import GpuKey, NodeView
from perfd.analytics.incidents.attribution import HINT_SERIES, RankPlacement, gpu_hints, gpu_seen, place_ranks
from perfd.analytics.incidents.evidence import Evidence, causal_key
from perfd.analytics.incidents.host_evidence import host_items
from perfd.analytics.incidents.incident_evidence import RankSnapshot
from perfd.core import catalog
from perfd.core.events import GpuProcess

# The GPU series an incident keeps as evidence of the time (besides gpu_hints' comparison).
SNAPSHOT_SERIES = frozenset({
    "perfd_gpu_sm_clock_hertz", "perfd_gpu_power_watts", "perfd_gpu_power_limit_watts",
    "perfd_gpu_temperature_celsius", "perfd_gpu_utilization_ratio", "perfd_gpu_xid_errors_total",
    "perfd_gpu_xid_last", "perfd_gpu_throttle_reasons", "perfd_gpu_processes", "perfd_gpu_sm_util_ratio",
    "perfd_gpu_tensor_util_ratio", "perfd_gpu_dram_bw_util_ratio", "perfd_gpu_memory_used_bytes"})

# What a steady sighting reads of each GPU: gpu_hints' values and the throttle flags, not its ~25 series
# (8,000 GPUs on a 2-core VM: the view 120-144 ms with every series, 81-90 ms with these; benchmarks/README).
SIGHTING_SERIES = (*HINT_SERIES, catalog.GPU_THROTTLE_ACTIVE)
# What an incident's snapshot reads: the series it keeps, gpu_hints' values and the throttle flags.
SNAPSHOT_READS = tuple(sorted(SNAPSHOT_SERIES | set(HINT_SERIES) | {catalog.GPU_THROTTLE_ACTIVE}))


def swap_of(obs: Mapping[str, Any]) -> float | None:
    """The node's swap-in rate reported beside a rank's observation."""
    v = (obs.get("node_values") or {}).get("swap_in_bytes_per_second")
    return float(v) if isinstance(v, (int, float)) else None


# (job, world size) placements held: far more than the jobs one aggregator serves; past it the least
# recently computed go (a job that ended is never asked again).
MAX_PLACEMENTS = 4096
# A placement that took longer than this to compute (a job of ~20,000 ranks and more) is held, once the
# process lists change, for PLACE_EVERY times what it took: at 100,000 ranks one takes ~0.4 s, and while
# its nodes' lists come in (a job starting, each node's agent sending them) every tick recomputed it,
# which held a job's root past its lag (perfd bench engine). Placement then costs at most a tenth of
# the time; the ranks placed are at most a few seconds late. Smaller jobs are placed as they change.
PLACE_SLOW_S = 0.05
PLACE_EVERY = 10.0


@dataclass(frozen=True)
class Placement:
    """A job's rank placement as of ``version`` of the node view's process lists and its agents."""

    version: int
    agents: frozenset[str]
    gpus: int  # GPUs of the job with a process list (0: nothing to place ranks from)
    ranks: Mapping[int, RankPlacement]  # read-only; its RankPlacements are shared: never mutate them
    computed_at: float = 0.0  # time.monotonic() when it was computed
    cost_s: float = 0.0  # what computing it took

    def held_over(self, now: float) -> bool:
        """Whether a slow placement is kept though its inputs changed (PLACE_SLOW_S)."""
        return self.cost_s > PLACE_SLOW_S and now - self.computed_at < PLACE_EVERY * self.cost_s


@dataclass(frozen=True)
class SnapshotView:
    """What incident snapshots read of a job's GPUs, and when (``taken_at``: the time it was read)."""

    taken_at: float
    procs: Mapping[GpuKey, list[GpuProcess]]
    values: Mapping[GpuKey, dict[str, float]]
    throttles: Mapping[GpuKey, list[str]]
    placed: Mapping[int, RankPlacement]
    # Incidents already given a snapshot from this view: a view kept for later passes (a big job) is
    # not a new sighting of their evidence. Touched by the analysis pass only.
    served: set[str] = field(default_factory=set, compare=False)


class PlacementCache:
    def __init__(self, nodes: NodeView) -> None:
        self._nodes = nodes
        self._lock = threading.Lock()
        self._held: dict[tuple[str, int | None], Placement] = {}

    def _hit(self, job: str, world_size: int | None, version: int,
             agents: frozenset[str]) -> Placement | None:
        with self._lock:
            p = self._held.get((job, world_size))
        if p is None:
            return None
        return p if (p.version == version and p.agents == agents) or p.held_over(time.monotonic()) else None

    def get(self, job: str, agents: Collection[str], world_size: int | None = None) -> Placement:
        """place_ranks over the job's process lists (NodeView.procs_of), computed again only when
        they changed (placement_version) or the job's agents did (a slow one: PLACE_SLOW_S)."""
        agents_f = frozenset(agents)
        version = self._nodes.placement_version  # before the data: a racing change makes it stale
        hit = self._hit(job, world_size, version, agents_f)
        if hit is not None:
            return hit
        t0 = time.monotonic()
        procs = self._nodes.procs_of(set(agents_f), job=job)
        ranks = MappingProxyType(place_ranks(procs, world_size, job=job))
        t1 = time.monotonic()
        return self._put(job, world_size, Placement(version, agents_f, len(procs), ranks, t1, t1 - t0))

    def from_view(self, job: str, agents: Collection[str], version: int,
                  procs: Mapping[GpuKey, list[GpuProcess]]) -> Mapping[int, RankPlacement]:
        """The placement of ``procs``, the job's process lists read (NodeView.gpu_view with
        ``job``: the same lists procs_of gives) after ``version`` was taken: the held one when
        nothing changed since, else computed from them and held."""
        agents_f = frozenset(agents)
        hit = self._hit(job, None, version, agents_f)
        if hit is not None and self._nodes.placement_version == version:
            return hit.ranks
        return self._put(job, None, Placement(version, agents_f, len(procs),
                                              MappingProxyType(place_ranks(procs, job=job)))).ranks

    def forget(self, job: str) -> None:
        with self._lock:
            for key in [k for k in self._held if k[0] == job]:
                del self._held[key]

    def _put(self, job: str, world_size: int | None, p: Placement) -> Placement:
        with self._lock:
            self._held.pop((job, world_size), None)  # re-inserted last: the oldest go first
            self._held[(job, world_size)] = p
            while len(self._held) > MAX_PLACEMENTS:
                del self._held[next(iter(self._held))]
        return p


def rank_snapshots(named: Sequence[int], v: SnapshotView, hosts: Mapping[int, Mapping[str, Any]],
                   annotate: Callable[[list[Evidence]], list[Evidence]],
                   cpu_only: bool = False) -> dict[int, RankSnapshot]:
    """rank -> what its GPU (in ``v``) and its process on its host (``hosts``: the ranks' latest
    host observations, perfd.aggregator.hosts) show, as typed evidence, for the ranks an incident
    names; with none named, the job's ranks whose GPU or host stands out (a co-tenant, throttling, a
    low clock, CPU contention, a stopped process). ``annotate`` marks what steady state showed too.
    ``taken_at`` and the evidence's times are when the view was read. ``cpu_only``: the job computes on
    CPUs: a rank on no GPU is what it is, not "its GPU is unknown"."""
    procs, values, throttles, placed, now = v.procs, v.values, v.throttles, v.placed, v.taken_at
    ranks = list(named) or sorted(set(placed) | set(hosts))
    out: dict[int, RankSnapshot] = {}
    for h in gpu_hints(ranks, placed, values, throttles, procs, now):
        obs = hosts.get(h.rank)
        if obs is not None:
            h.items = sorted([*h.items, *host_items(h.rank, obs, obs.get("node"), swap_of(obs))],
                             key=causal_key)
        if not named and not h.items:  # with no rank named, only those that stand out
            continue
        h.items = annotate(h.items)
        vals: dict[str, float] = {}
        reasons: list[str] = []
        if h.node is not None and h.gpu is not None:
            vals, reasons = values.get((h.node, h.gpu), {}), list(throttles.get((h.node, h.gpu), []))
        out[h.rank] = RankSnapshot(
            rank=h.rank, node=h.node, gpu=h.gpu, placed=h.placed,
            seen=gpu_seen(h.placed, h.items, cpu_only), seen_items=tuple(h.items),
            numbers=dict(h.evidence), items=tuple(h.items),
            gpu_values={k: x for k, x in vals.items() if k in SNAPSHOT_SERIES},
            throttle_reasons=tuple(reasons), taken_at=now,
            host={k: x for k, x in obs.items() if k != "node_values"} if obs is not None else None)
    return out
