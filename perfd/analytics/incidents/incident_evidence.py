"""An incident's evidence as typed values (perfd.analytics.incidents.detect.Incident.evidence).

What the run's own steps say (the ranks they name, the typed items perfd.analytics.incidents.evidence decides
over), a collective hang, a live stall (perfd.analytics.incidents.stall.StallSeen), a lasting level shift, and
what only the live aggregator saw while the incident ran: each involved rank's GPU and host snapshot,
the items accumulated over its life, the XID and OOM counts when it opened
(perfd/aggregator/incidents.py). JSON appears only at the edges: :meth:`IncidentEvidence.to_json`
gives the keys the HTTP API, the events and the state store have always carried, in the same order,
with codes where sentences are shown (the evidence's source, a snapshot's observations): the edges
that serve it word them (perfd.report.incident_text.worded_evidence); the ``from_json`` functions
serve the state store's load alone. Pure; no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from perfd.analytics.collectives.collective_hangs import HangView
from perfd.analytics.incidents.attribution import GpuSeen
from perfd.analytics.incidents.evidence import Evidence
from perfd.analytics.incidents.stall import StallSeen
from perfd.analytics.steps.changepoint import ChangePoint
from perfd.core.record_json import JsonRecord, written_after
from perfd.core.typed import objs


class Withdrawal(str, enum.Enum):
    """Why an incident seen live is taken back (a closed set; JSON carries the value)."""

    JOB_EXIT = "job_exit"  # the silence after the last step was the job's exit (perfd/aggregator/stalls.py)
    LATE_RECORDS = "late_records"  # the job's own clock shows no gap: its records came late
    NCU_ARMING = "ncu_arming"  # the armed rank's slower life: the arming's cost (perfd.analytics.run.arming)
    # the loop's own pause, named at its next occurrence on a cadence (perfd.analytics.incidents.cadence)
    CADENCE_PAUSE = "cadence_pause"


class EvidenceSource(str, enum.Enum):
    """Which detector an incident's evidence comes from (a closed set; its sentence is
    perfd.report.incident_text.EVIDENCE_SOURCE_TEXT, worded where the JSON is served)."""

    STEPS = "steps"  # the per-iteration analysis: step timers, the straggler detector
    NCCL_HANG = "nccl_hang"  # collectors/nccl's Flight Recorder hang detector
    LIVE_STALL = "live_stall"  # the aggregator's live stall detector (perfd.analytics.incidents.stall)


V = TypeVar("V")

def as_kept(e: Evidence) -> Evidence:
    """The item with the numbers an incident keeps (JSON has one number type: a kept item reads its
    values back as floats), so a verdict reads the same whether decided now or after a restart."""
    return replace(e, worst=_float(e.worst), first_seen=_float(e.first_seen), last_seen=_float(e.last_seen),
                   n=int(e.n or 1), detail=dict(e.detail))


def _float(v: float | None) -> float | None:
    return float(v) if v is not None else None


def _evidence(xs: object) -> tuple[Evidence, ...]:
    return tuple(e for d in objs(xs) if (e := Evidence.from_json(d, as_written=True)) is not None)


@dataclass(frozen=True)
class LevelShift(JsonRecord):
    """A lasting shift of the step time (perfd.analytics.steps.changepoint) as its incident keeps it."""

    iteration: int  # where the new level began
    before_ms: float
    after_ms: float
    steps_after: int
    new_normal_at: int | None  # where the user took the new level as the new normal

    @staticmethod
    def of(cp: ChangePoint, iteration: int, accepted_iteration: int | None) -> LevelShift:
        return LevelShift(iteration, cp.before_ms, cp.after_ms, cp.n_after, accepted_iteration)

    @property
    @written_after("after_ms")
    def ratio(self) -> float | None:
        return self.after_ms / self.before_ms if self.before_ms else None


@dataclass(frozen=True)
class RankSnapshot:
    """What one rank's GPU and its process on its host showed at ``taken_at`` (perfd/aggregator/
    gpu_views.rank_snapshots): the rank's GPU hint (perfd.analytics.incidents.attribution.GpuHint: what
    it shows, its numbers) and typed items, the kept GPU series, the throttle reasons, and the host's
    observation of the process as its agent sent it (free-form: the agent's own record). Its
    observations are worded where shown (perfd.report.incident_text.seen_text) from ``seen`` and
    ``seen_items`` (the hint's items when it was taken: ``items`` gains the XID and OOM items the
    tracker adds after); its JSON carries ``seen``'s code under "observations" until then. One read back
    from the state store keeps its observations as they were served (``written``), shown as written."""

    rank: int
    node: str | None
    gpu: str | None
    placed: bool
    seen: GpuSeen  # what its observations say: nothing, unplaced, like the others, or its items
    numbers: Mapping[str, object]  # GpuHint.evidence: the pid and the values gpu_hints compared
    items: tuple[Evidence, ...]
    gpu_values: Mapping[str, float]
    throttle_reasons: tuple[str, ...]
    taken_at: float
    host: Mapping[str, object] | None = None
    seen_items: tuple[Evidence, ...] = ()  # what its observations word when ``seen`` is ITEMS
    written: tuple[str, ...] | None = None  # its observations as the state store kept them

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "rank": self.rank, "node": self.node, "gpu": self.gpu, "placed": self.placed,
            "observations": list(self.written) if self.written is not None else self.seen.value,
            "evidence": dict(self.numbers),
            "items": [e.to_json() for e in self.items]}
        if self.host is not None:
            out["host"] = dict(self.host)
        out.update(gpu_values=dict(self.gpu_values), throttle_reasons=list(self.throttle_reasons),
                   taken_at=self.taken_at)
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> RankSnapshot:
        host, placed, items, obs = d.get("host"), bool(d.get("placed", True)), _evidence(d.get("items")), \
            d.get("observations")
        return RankSnapshot(int(d["rank"]), d.get("node"), d.get("gpu"), placed,
                            _seen(obs, placed, items), dict(d.get("evidence") or {}),
                            items, dict(d.get("gpu_values") or {}),
                            tuple(d.get("throttle_reasons") or ()), d.get("taken_at") or 0.0,
                            dict(host) if isinstance(host, Mapping) else None,
                            written=tuple(str(o) for o in obs) if isinstance(obs, list) else None)


@dataclass(frozen=True)
class IncidentEvidence:
    """Everything an incident's verdict and cost were decided from. A part an incident has no source
    for is None (absent from its JSON): the run's steps' part for a hang or a stall, the aggregator's
    part for an incident analysed offline. Rank keys are ints here, strings in JSON."""

    # The run's own steps (perfd.analytics.incidents.detect.detect_incidents)
    named_by_iterations: Mapping[int, int] | None = None  # rank -> iterations that flagged it
    rank_compute_ratio_max: Mapping[int, float] | None = None
    straggler_line_max_rank: Mapping[int, int] | None = None  # rank -> straggler-detector lines naming it
    disturbed_by_capture: int | None = None  # iterations perfd's capture disturbed
    hang: HangView | None = None  # a collective hang: the merged view of its reports
    stuck_ranks: tuple[int, ...] | None = None
    ranks_not_joined: tuple[int, ...] | None = None
    stall: StallSeen | None = None  # the live stall the incident is, or took over
    observed: tuple[Evidence, ...] | None = None  # the steps' typed items
    source: EvidenceSource | None = None
    change_point: LevelShift | None = None
    inside_incident: str | None = None  # a capture's disturbance inside this incident (its id)
    # What the live aggregator saw while it ran (perfd/aggregator/incidents.py)
    gpu: Mapping[int, RankSnapshot] | None = None  # the snapshot kept of each rank
    gpu_observed: tuple[Evidence, ...] | None = None  # accumulated over its life (evidence.merge)
    xid_at_open: Mapping[int, float] | None = None  # each rank GPU's XID count when it opened
    oom_at_open: Mapping[int, int] | None = None  # each rank cgroup's OOM kills when it opened

    def to_json(self, stall_first: bool = False) -> dict[str, object]:
        """``stall_first``: the incident is the stall itself (its evidence has always opened with
        it); an incident that took a stall over got it last."""
        out: dict[str, object] = {}

        def put(key: str, v: object) -> None:
            if v is not None:
                out[key] = v

        put("named_by_iterations", _str_keys(self.named_by_iterations))
        put("rank_compute_ratio_max", _str_keys(self.rank_compute_ratio_max))
        put("straggler_line_max_rank", _str_keys(self.straggler_line_max_rank))
        put("disturbed_by_capture", self.disturbed_by_capture)
        put("hang", self.hang.to_json() if self.hang is not None else None)
        put("stuck_ranks", list(self.stuck_ranks) if self.stuck_ranks is not None else None)
        put("ranks_not_joined", list(self.ranks_not_joined) if self.ranks_not_joined is not None else None)
        stall = self.stall.to_json() if self.stall is not None else None
        if stall_first:
            put("stall", stall)
        put("observed", [e.to_json() for e in self.observed] if self.observed is not None else None)
        put("source", self.source.value if self.source is not None else None)  # a code: worded where served
        put("change_point", self.change_point.to_json() if self.change_point is not None else None)
        put("inside_incident", self.inside_incident)
        put("gpu", {str(r): s.to_json() for r, s in self.gpu.items()} if self.gpu is not None else None)
        put("gpu_observed",
            [e.to_json() for e in self.gpu_observed] if self.gpu_observed is not None else None)
        put("xid_at_open", _str_keys(self.xid_at_open))
        put("oom_at_open", _str_keys(self.oom_at_open))
        if not stall_first:
            put("stall", stall)
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> IncidentEvidence:
        """Back from :meth:`to_json` (the state store's incidents)."""
        def ints(key: str) -> dict[int, Any] | None:
            v = d.get(key)
            return {int(r): x for r, x in v.items()} if isinstance(v, Mapping) else None

        def ranks(key: str) -> tuple[int, ...] | None:
            v = d.get(key)
            return tuple(int(r) for r in v) if isinstance(v, list) else None

        stall, cp, gpu = d.get("stall"), d.get("change_point"), d.get("gpu")
        return IncidentEvidence(
            named_by_iterations=ints("named_by_iterations"),
            rank_compute_ratio_max=ints("rank_compute_ratio_max"),
            straggler_line_max_rank=ints("straggler_line_max_rank"),
            disturbed_by_capture=d.get("disturbed_by_capture"),
            hang=_hang(d["hang"]) if isinstance(d.get("hang"), Mapping) else None,
            stuck_ranks=ranks("stuck_ranks"), ranks_not_joined=ranks("ranks_not_joined"),
            stall=StallSeen.from_json(stall) if isinstance(stall, Mapping) else None,
            observed=_evidence(d["observed"]) if isinstance(d.get("observed"), list) else None,
            source=_source(d.get("source")),
            change_point=LevelShift.from_json(cp) if isinstance(cp, Mapping) else None,
            inside_incident=d.get("inside_incident"),
            gpu=({int(r): RankSnapshot.from_json(s) for r, s in gpu.items()}
                 if isinstance(gpu, Mapping) else None),
            gpu_observed=_evidence(d["gpu_observed"]) if isinstance(d.get("gpu_observed"), list) else None,
            xid_at_open=ints("xid_at_open"), oom_at_open=ints("oom_at_open"))


def _seen(kept: object, placed: bool, items: tuple[Evidence, ...]) -> GpuSeen:
    """A snapshot's ``seen`` from its JSON: its code, or (as served and kept by the state store, its
    observations worded, shown as written) the kind they were of: an unplaced rank's said nothing of
    its GPU (a CPU job's) or that it is unplaced; a placed one's its items, or that it looks like the
    others (the kept items may hold more: the tracker's XID and OOM items)."""
    if isinstance(kept, str) and kept in GpuSeen._value2member_map_:
        return GpuSeen(kept)
    if not placed:
        return GpuSeen.UNPLACED if kept else GpuSeen.NO_GPU
    return GpuSeen.ITEMS if items else GpuSeen.LIKE_OTHERS


def _source(kept: object) -> EvidenceSource | None:
    """The evidence's source from its JSON code (the state store's load turns a served sentence back
    into its code first: perfd.report.incident_text.unworded_evidence)."""
    known = isinstance(kept, str) and kept in EvidenceSource._value2member_map_
    return EvidenceSource(kept) if known else None


def _hang(d: Mapping[str, Any]) -> HangView:
    """Back from HangView.to_json (which keeps its first agent texts: they are all it serves again)."""
    return HangView(
        process_group=str(d.get("process_group")), op=str(d.get("op")), seq=int(d.get("seq") or 0),
        is_p2p=bool(d.get("is_p2p")), stuck_ranks=list(d.get("stuck_ranks") or []),
        ranks_not_joined=list(d.get("ranks_not_joined") or []),
        inferred_not_joined=list(d.get("inferred_not_joined") or []),
        ranks_unknown=list(d.get("ranks_unknown") or []),
        first_reported=d.get("first_reported") or 0.0, last_reported=d.get("last_reported") or 0.0,
        age_at_first_report_s=d.get("age_at_first_report_s"), resolved=bool(d.get("resolved")),
        agents=list(d.get("agents") or []),
        user_frame=d.get("user_frame"), texts=list(d.get("agent_texts") or []))


def _str_keys(m: Mapping[int, V] | None) -> dict[str, V] | None:
    return {str(r): v for r, v in m.items()} if m is not None else None
