"""What the collective findings and recommendations say, as typed facts: each question of
perfd.analytics.collectives.collective_analysis gives its finding and recommendation a kind and their
numbers; the words are made where they are served (perfd.report.collective_text). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from perfd.analytics.collectives.bandwidth import GroupBandwidth
from perfd.analytics.collectives.collective_hangs import HangView
from perfd.analytics.common import TextEnum
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.core.record_json import unwritten


class ShareAbsent(TextEnum):
    """Why the analysis has no total communication share (worded where served:
    perfd.report.collective_text)."""

    NO_TIMING = "no_timing"  # Flight Recorder records without durations (TORCH_NCCL_ENABLE_TIMING unset)
    NO_RECORDS = "no_records"  # no Flight Recorder records at all
    NO_WINDOW = "no_window"  # records, but none covering a step window yet


@dataclass(frozen=True, slots=True, kw_only=True)
class HangFacts:
    """A collective that hangs (or stalled, then completed): the merged view of the agents' reports."""

    hang: HangView


@dataclass(frozen=True, slots=True, kw_only=True)
class TotalShareFacts:
    """The total communication share (median over ranks), by group class (largest first), the method,
    whether it is of the step (step windows) or of the observed time, and the windows per rank it is
    over (0: not by windows)."""

    share: float
    by_group: tuple[tuple[str, float], ...]
    method: str
    of_step: bool
    windows: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DpShareFacts:
    """The data-parallel groups' share of the step over the playbook's threshold (``threshold``)."""

    share: float
    threshold: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareAbsentFacts:
    """No total communication share, and why (CollectiveAnalysis.absent)."""

    reason: ShareAbsent


@dataclass(frozen=True, slots=True, kw_only=True)
class BandwidthFacts:
    """A group class's large ops at a low share of their link's bandwidth; the size they count from."""

    bandwidth: GroupBandwidth
    ratio: float
    min_mib: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TpNodesFacts:
    """A tensor-parallel group whose ranks run on more than one node."""

    group: str | None
    ranks: tuple[int, ...]
    nodes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LastRankFacts:
    """A rank that arrives last at collectives (the others wait for it): how often, against chance."""

    rank: int
    last: int
    decisive: int
    last_share: float | None
    by_chance: float


CollectiveFacts = (HangFacts | TotalShareFacts | DpShareFacts | ShareAbsentFacts | BandwidthFacts
                   | TpNodesFacts | LastRankFacts)
CollectiveRecFacts = HangFacts | DpShareFacts | BandwidthFacts | TpNodesFacts | LastRankFacts


@dataclass
class CollectiveFinding(Finding):
    """A collective finding with its title and observation left to where it is served."""

    facts: CollectiveFacts | None = field(default=None, metadata=unwritten())


@dataclass
class CollectiveRecommendation(Recommendation):
    """A collective recommendation with its action and detail left to where it is served."""

    facts: CollectiveRecFacts | None = field(default=None, metadata=unwritten())
