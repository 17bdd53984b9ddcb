"""What a job's GPUs and hosts show, read for its incidents: the rank snapshots an incident is given
(each named rank's GPU and host, or the ranks whose GPU stands out) and the steady baseline sightings
they are compared with (perfd.aggregator.incidents.GpuBaseline).

Split from perfd/aggregator/state.py: it reads the node view, the rank hosts and the placement cache,
and keeps the view a big job's snapshots share (reading 8,000 ranks' GPUs is most of a snapshot's
cost); the state's incident pass (AggregatorState.track_live_incidents) calls it.
"""

from __future__ import annotations

from collections.abc import Callable

from perfd.aggregator.class_inputs import STEPPING_MIN_S
from perfd.aggregator.gpu_views import (
    SIGHTING_SERIES,
    SNAPSHOT_READS,
    PlacementCache,
    SnapshotView,
    rank_snapshots,
    swap_of,
)
from perfd.aggregator.hosts import HostView
from perfd.aggregator.incidents import GpuBaseline
from perfd.aggregator.jobs import JobStore
from perfd.aggregator.nodes import NodeView
from perfd.analytics.incidents.attribution import gpu_hints
from perfd.analytics.incidents.detect import Incident
from perfd.analytics.incidents.host_evidence import host_items
from perfd.analytics.incidents.incident_evidence import RankSnapshot

# ClassInputs.stepping: whether the job's last step is recent enough that its GPUs show its work.
Stepping = Callable[[str, "float | None", float], bool]


class Sightings:
    """Each job's GPU and host readings for its incidents and its steady baseline."""

    def __init__(self, jobs: JobStore, nodes: NodeView, hosts: HostView, placements: PlacementCache,
                 baseline: GpuBaseline, stepping: Stepping) -> None:
        self.jobs = jobs
        self.nodes = nodes
        self.hosts = hosts
        self.placements = placements
        self.baseline = baseline
        self.stepping = stepping
        self._views: dict[str, SnapshotView] = {}  # job -> the view its snapshots read last

    def forget(self, job: str) -> None:
        """The job's held view goes (no incident open any more, or the job was pruned)."""
        self._views.pop(job, None)

    def baseline_sighting(self, job: str, now: float) -> None:
        """What every placed rank's GPU shows while the job runs steadily (perfd.aggregator.incidents
        .GpuBaseline); only while it steps."""
        ov = self.jobs.overview(job)
        if not self.stepping(job, ov.last_step_age_s if ov else None, STEPPING_MIN_S):
            return
        agents, version = self.jobs.agents_of(job), self.nodes.placement_version  # the version first
        # only what gpu_hints reads
        procs, values, throttles = self.nodes.gpu_view(agents, SIGHTING_SERIES, job=job)
        placed = self.placements.from_view(job, agents, version, procs)
        hosts = self.hosts.observations(job, now)  # the ranks' hosts: CPU contention in steady state too
        items = {h.rank: h.items for h in gpu_hints(sorted(placed), placed, values, throttles, procs, now)}
        for r, obs in hosts.items():
            items[r] = [*items.get(r, []), *host_items(r, obs, obs.get("node"), swap_of(obs))]
        if items:
            self.baseline.add(job, items, now)

    def read_view(self, job: str) -> SnapshotView:
        """The job's GPUs as incident snapshots read them, now."""
        agents, version = self.jobs.agents_of(job), self.nodes.placement_version  # the version first
        procs, values, throttles = self.nodes.gpu_view(agents, SNAPSHOT_READS, job=job)
        taken_at = self.jobs.clock.time()
        return SnapshotView(taken_at, procs, values, throttles,
                            self.placements.from_view(job, agents, version, procs))

    def view(self, job: str) -> SnapshotView:
        """The view an analysis pass's snapshots read: a job whose last steady sighting held more than
        BASELINE_RANKS_PER_EVERY_S ranks keeps it while younger than its sighting interval less
        BASELINE_EVERY_S (8,000 ranks: 6.8 s; reading it is most of a snapshot's ~0.2 s there), so
        its snapshots cost no more than its sightings would; any other job reads it at every pass."""
        held = self._views.get(job)
        keep_s = self.baseline.interval_s(job) - self.baseline.every_s  # 0 up to that size
        if held is not None and keep_s > 0 and 0.0 <= self.jobs.clock.time() - held.taken_at < keep_s:
            return held
        view = self._views[job] = self.read_view(job)
        return view

    def gpu_snapshot(self, job: str, inc: Incident,
                     view: SnapshotView | None = None) -> dict[int, RankSnapshot]:
        """rank -> what its GPU shows in ``view`` (by default read now), for the ranks an incident
        names; with none named, the job's ranks whose GPU stands out (a co-tenant, throttling, a low
        clock). ``taken_at`` and the evidence's times are when the view was read."""
        v = view if view is not None else self.read_view(job)
        hosts = self.hosts.observations(job, v.taken_at)  # each rank's process on its host, as last reported
        return rank_snapshots(inc.ranks, v, hosts, lambda items: self.baseline.annotate(job, items),
                              inc.cpu_only)
