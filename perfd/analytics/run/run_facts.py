"""What the run's findings and recommendations say, as typed facts: each analyzer of
perfd.analytics.run.run_findings gives its finding a kind and its numbers (:class:`RunFinding`), its
recommendation the same (:class:`RunRecommendation`); the words are made where they are shown
(perfd.report.finding_text). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from perfd.analytics.advice.remedies import Framework
from perfd.analytics.common import TextEnum
from perfd.analytics.finding_types import Finding, Recommendation, Severity
from perfd.analytics.incidents.cadence import CadencePause
from perfd.analytics.run.runs import Runs
from perfd.analytics.steps.beat import SlowSteps
from perfd.analytics.steps.untimed import Untimed
from perfd.core.record_json import unwritten


@dataclass(frozen=True, slots=True, kw_only=True)
class ImbalanceFacts:
    """The stages' imbalance outweighs the schedule's bubble: each stage's idle share, the analytic
    bubble, the layout (p, m, v) and the two stages' forward+backward compute (ms); ``minmax``: the stages'
    idle paired from the timers' min and max (an inference, said in its source)."""

    idle_lighter: float
    idle_heavier: float | None
    bubble: float
    pp: int
    microbatches: int | None
    vpp: int | None
    imbalance: float
    lighter_ms: float
    heavier_ms: float
    minmax: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowerRank:
    """The straggler detector's usual slower rank: its stage, and in how many steady iterations of those
    that name one."""

    rank: int
    stage: int
    pp: int
    count: int
    of: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RebalanceFacts:
    """What backs the rebalancing of the pipeline stages: the slower rank, the logit GEMM's worth in
    layers (the padded vocabulary and the ratio), whether an uneven split is configured already, and the
    estimate of moving layers (perfd.analytics.steps.pipeline.rebalance_estimate)."""

    slower: SlowerRank | None = None
    padded_vocab: int | None = None
    logit_layers: float | None = None  # the logit GEMM's FLOPs ÷ one transformer layer's
    uneven: bool = False
    per_layer_ms: float | None = None  # None: no estimate
    layers_per_stage: int = 0
    gap_ms: float = 0.0
    best_move: int = 0  # 0: one whole layer would flip the imbalance
    new_heavier_ms: float = 0.0
    lighter_ms: float = 0.0
    heavier_ms: float = 0.0
    num_layers: int | None = None
    pp: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class BubbleFacts:
    """A high pipeline bubble: analytic and idle shares, the layout, and what would bring it to the target
    (the micro-batches needed; interleaving with v=2)."""

    bubble: float
    idle_lighter: float
    pp: int
    microbatches: int | None
    need: int
    v2: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GradSyncFacts:
    """Exposed gradient sync over its threshold; ``overlap``: a Megatron job that does not overlap it yet."""

    dp_share: float
    dp: int | None = None
    overlap: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PpWaitFacts:
    """Exposed p2p time that is the pipeline waiting: the exposed shares and the stage idle."""

    total: float
    pp_share: float
    dp_share: float | None
    idle_lighter: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ExposedFacts:
    """Exposed communication over its threshold, not the gradient sync's."""

    total: float


@dataclass(frozen=True, slots=True, kw_only=True)
class UntimedFacts:
    """The exposed share leaves out collectives the timers cannot see (perfd.analytics.steps.untimed)."""

    total: float
    untimed: Untimed


@dataclass(frozen=True, slots=True, kw_only=True)
class DataShareFacts:
    """The data wait's share of the step, its state (the severity), the timer it is read from as the
    job's step source names it, and for the recommendation the framework whose loader's knobs it names
    (None: no recommendation; a CPU-only job's without pinned memory: ``cpu_only``; their words:
    perfd.report.data_text.knobs_text) and the step time's CV where it jitters too."""

    share: float
    state: Severity
    timer: str
    across_ranks: str
    source: str = ""  # the job's step source (steps.vocabulary.Vocabulary.source): the timer's
    knobs_of: Framework | None = None
    cpu_only: bool = False
    jitter_cv: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OutsideFacts:
    """Host time between the steps (the step hook's), its share of the step."""

    share: float


@dataclass(frozen=True, slots=True, kw_only=True)
class JitterFacts:
    """Step time jitter: its CV and the slow steps (with their period where they keep one: ``beat``)."""

    cv: float
    slow: SlowSteps | None
    beat: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerFacts:
    """A persistent straggler: the rank and in what share of the steady iterations it was flagged."""

    rank: int
    fraction: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SpreadFacts:
    """Compute time spread across ranks (pp=1) over the straggler ratio in a share of the iterations, and
    the framework whose per-rank times would name the rank."""

    fraction: float
    framework: Framework = Framework.MEGATRON


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSpreadFacts:
    """The straggler detector's spread is between stages: its median ratio and in what share."""

    rtt_ratio: float | None
    fraction: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFiguresFacts:
    """Where the job's figures come from when its current run cannot give them."""

    runs: Runs


@dataclass(frozen=True, slots=True, kw_only=True)
class OutlierFacts:
    """Slow iterations left out of the steady state (each one's exclusion is quoted: QuotingFinding)."""

    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CadenceFacts:
    """A pause the loop takes every N steps without announcing it (perfd.analytics.incidents.cadence): the
    cadence, with its occurrences, the goodput part it is booked under and what was seen during it; ``run_s``:
    the run's time it is a share of (None: unknown)."""

    cadence: CadencePause
    run_s: float | None = None


class Divider(TextEnum):
    """How the compute time can be divided where the timers leave it whole (the next step's action)."""

    UNARMED_TIMELINE = "unarmed-timeline"  # live, a rank under ncu: a timeline of a rank not armed
    TIMELINE = "timeline"  # live: a steady-state capture
    NEXT_RUN = "next-run"  # a finished log: how to have a capture next time, and how to pass it


@dataclass(frozen=True, slots=True, kw_only=True)
class NextStepFacts:
    """What would divide an undivided compute time where MFU is low: how (``divider``), for which job,
    what the budget says of the compute (ms, share, the model's ideal time) and the job's notes (its TP
    size, a small hidden size)."""

    divider: Divider
    job: str
    hook_loop: bool = False  # a PyTorch job: the step hook in the loop, not perfd launch
    compute_ms: float | None = None  # None: the timers do not divide the compute time
    compute_share: float = 0.0
    ideal_ms: float | None = None
    tp: int | None = None  # a TP size over 1
    hidden_size: int | None = None  # a small one (GEMMs far below peak)


RunFacts = (ImbalanceFacts | BubbleFacts | GradSyncFacts | PpWaitFacts | ExposedFacts | UntimedFacts
            | DataShareFacts | OutsideFacts | JitterFacts | StragglerFacts | SpreadFacts | StageSpreadFacts
            | RunFiguresFacts | OutlierFacts | CadenceFacts)
RunRecFacts = (RebalanceFacts | BubbleFacts | GradSyncFacts | DataShareFacts | OutsideFacts | JitterFacts
               | StragglerFacts | SpreadFacts | NextStepFacts | CadenceFacts)


@dataclass
class RunFinding(Finding):
    """One of the run's findings with its title and observation left to the report
    (perfd.report.finding_text words them from ``facts``)."""

    facts: RunFacts | None = field(default=None, metadata=unwritten())


@dataclass
class RunRecommendation(Recommendation):
    """One of the run's recommendations with its action and detail left to the report."""

    facts: RunRecFacts | None = field(default=None, metadata=unwritten())
