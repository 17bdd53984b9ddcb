"""Where a per-iteration number came from, or why it is absent: as a code and its arguments.

A metric function returns a :class:`Measured` (its value and a :class:`Cited`): the code names one
sentence (:class:`Code`, each declared once with its kind and how many arguments it takes), the
arguments are that iteration's numbers, its record's provenance and the texts other modules declare
(the FLOPs formula, the peak table's row); a step source's absence reasons are codes too. No English
here: each code's sentence is declared once where it is shown (perfd.report.provenance_text: the report, the
JSON rows' legend, a finding that quotes it), so a run's table keeps the code and the numbers, not a
sentence per row (iteration_table._Cites), and analytics decide with codes, never with wording.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from perfd.core.model import Provenance


class Kind(enum.Enum):
    """What a sentence says: the source of a present number, the reason of an absent one, the
    caveat a source carries (an inference), a note on how a row was read (the straggler check's), or
    why a row is out of the steady state (with its numbers: perfd.analytics.steps.steady)."""

    SOURCE = "source"
    ABSENT = "absent"
    CAVEAT = "caveat"
    NOTE = "note"
    EXCLUDED = "excluded"


_S, _A, _C, _N, _X = Kind.SOURCE, Kind.ABSENT, Kind.CAVEAT, Kind.NOTE, Kind.EXCLUDED


class Code(enum.Enum):
    """One sentence: its kind and its arity (how many positional arguments its sentence takes,
    perfd.report.provenance_text.TEMPLATE). The member's name is the code."""

    # The record itself, the log's own figures.
    RECORD = _S, 1  # the record's provenance (its log line, the hook's rank and pid)
    STEP_TIME = _S, 1  # a record without provenance: its source's step time
    LOSS = _S, 1
    QUOTED = _S, 1  # a source declared elsewhere (the logged throughput's name, no straggler line)
    STRAGGLER_LINE = _S, 0
    NO_STRAGGLER_LINE = _S, 2  # the vocabulary's source and its straggler_absent (cited)
    # Throughput and MFU.
    THROUGHPUT = _S, 2
    THROUGHPUT_LOGGED = _S, 2
    MFU = _S, 1
    # Shares of the step from timers.
    TIMER_SHARE = _S, 6
    COMM_PER_RANK = _S, 6
    COMM_ONE_MAX = _S, 5
    COMM_SUM_OF_MAX = _S, 5
    # The pipeline.
    NO_BUBBLE = _S, 0
    BUBBLE_1F1B = _S, 2
    BUBBLE_INTERLEAVED = _S, 3
    IDLE_RANK_MAX = _S, 4
    IDLE_RANK_MIN = _S, 4
    IDLE_LIGHTER = _S, 4
    IDLE_HEAVIER = _S, 4
    IMBALANCE = _S, 0
    MINMAX_PAIRING = _C, 0
    # Absent: why.
    UNKNOWN = _A, 0  # no reason given
    WHY = _A, 1  # a reason declared elsewhere (the FLOPs count's notes, a serving figure's)
    NO_LOSS = _A, 0
    MISSING = _A, 1  # the fields missing (names)
    MISSING_NOTED = _A, 2  # the fields missing, and the notes on how they were read
    NON_POSITIVE = _A, 2
    NO_STEP_TIME = _A, 0
    NO_TIMERS = _A, 1
    FLOPS_UNKNOWN = _A, 0
    THROUGHPUT_UNKNOWN = _A, 0
    PEAK_UNKNOWN = _A, 0
    PP_UNKNOWN = _A, 0
    MICROBATCHES_UNKNOWN = _A, 0
    NO_STAGES = _A, 0
    NO_STAGE_TIMERS = _A, 0
    MAX_ONLY = _A, 0
    FB_ZERO = _A, 0
    IMBALANCE_INPUTS = _A, 0
    # Where a peak comes from (perfd.analytics.steps.gpus: PeakResult.source, BandwidthResult.source):
    # the table's or the configuration's code around the row's or the setting's detail.
    FROM_GPU_TABLE = _S, 1  # gpus: the detail
    FROM_CONFIG = _S, 1  # config: the detail
    PEAK_TABLE = _S, 4  # the GPU model, the dtype, TFLOP/s, the datasheet
    PEAK_OVERRIDE = _S, 1  # the configured TFLOP/s
    PEAK_VALUE = _S, 1  # a peak without a source: its TFLOP/s
    BANDWIDTH_TABLE = _S, 3  # the GPU model, TB/s, the datasheet
    BANDWIDTH_OVERRIDE = _S, 1  # the configured bytes/s
    # Why there is no peak to measure against (perfd.analytics.steps.gpus: PeakResult.reason,
    # BandwidthResult.reason; a CPU job's, perfd.analytics.run.run_analysis).
    PEAK_NOT_POSITIVE = _A, 1  # the configured peak TFLOP/s
    PEAK_NO_GPU = _A, 0
    PEAK_GPU_UNLISTED = _A, 1  # the GPU's name
    PEAK_NO_DTYPE = _A, 0
    PEAK_DTYPE_UNRECOGNISED = _A, 2  # the dtype given, the dtypes known
    PEAK_NO_FIGURE = _A, 2  # the dtype, the GPU model
    PEAK_CPU_ONLY = _A, 0
    BANDWIDTH_NOT_POSITIVE = _A, 1  # the configured bytes/s
    BANDWIDTH_NO_GPU = _A, 0
    BANDWIDTH_GPU_UNLISTED = _A, 1  # the GPU's name
    # Serving (perfd.analytics.serving): a value's source is its collector's code around its detail
    # (the detail alone is what another source quotes: MetricValue.detail); its parts, its reasons.
    SG_LOG = _S, 1  # sglang-log: the detail
    SG_METRICS = _S, 2  # sglang-metrics: the detail, the scrape's source
    SG_ANALYTICS = _S, 1
    SG_CONFIG = _S, 1
    SG_PER_GROUP_ONE = _S, 2  # what was read, over which lines (one DP group)
    SG_PER_GROUP_SUM = _S, 3  # ... summed over n DP groups
    SG_PER_GROUP_MEAN = _S, 3  # ... averaged over n DP groups
    SG_NO_LINES = _S, 0
    SG_ONE_LINE = _S, 1  # its line number
    SG_LINES = _S, 3  # how many, the first and last line numbers
    SG_GEN_TPUT = _S, 0  # what a per-group value reads of the log's lines
    SG_INPUT_TPUT = _S, 0
    SG_INPUT_FROM_SPAN = _S, 0
    SG_RUNNING = _S, 0
    SG_QUEUE = _S, 0
    SG_QUEUE_SLOPE = _S, 0
    SG_KV_USAGE = _S, 0
    SG_HIT_TOKENS = _S, 0
    SG_LAST_HIT_RATE = _S, 0
    SG_HIT_BATCHES = _S, 0
    SG_CUDA_GRAPH = _S, 0
    SG_ACCEPT_LEN = _S, 0
    SG_BATCH_FILL = _S, 1  # max_running_requests
    SG_GAUGE = _S, 3  # the gauge, how its series combine, how many
    SG_GAUGE_NOTED = _S, 4  # ... and its caveat
    SG_HIT_GAUGE_CAVEAT = _S, 0
    SG_OVER_SECONDS = _S, 2  # what, over the seconds between two scrapes
    SG_RATE = _S, 1
    SG_RATE_MINUS = _S, 2
    SG_RATE_WITH_CACHED = _S, 1
    SG_HIT_COUNTERS = _S, 1  # the seconds between two scrapes
    SG_QUANTILE = _S, 5  # q, the histogram, its window, the series summed, the observations
    SG_QUANTILE_RESETS = _S, 2  # the method, the series reset
    SG_QUANTILE_LEFT_OUT = _S, 2  # the method, the series left out
    SG_BUCKETS_DELTA = _S, 1  # the seconds between two scrapes
    SG_BUCKETS_LIFETIME = _S, 0
    SG_MFU = _S, 5  # the FLOPs per token's detail, the throughput, its source, the GPUs, the peak's source
    SG_MBU = _S, 7  # weights, their source, KV per token, its source, TB/s, its source, the lines
    SG_KV_INFERRED = _S, 1  # the MBU's detail, its KV tokens inferred
    SG_WEIGHT_BYTES = _S, 1
    SG_PARAMS_QUANT = _S, 2
    SG_PARAMS_DTYPE = _S, 4  # params, bytes per weight, the dtype, where the dtype came from
    SG_DTYPE_CONFIG = _S, 0
    SG_DTYPE_SERVER_ARGS = _S, 0
    SG_DTYPE_LOAD_WEIGHT = _S, 0
    SG_KV_BYTES = _S, 1
    SG_KV_FORMULA = _S, 5  # layers, KV heads, head dim, bytes, the KV dtype's sentence
    SG_KV_DTYPE_MODEL = _S, 1
    SG_KV_DTYPE_GIVEN = _S, 1
    SG_KV_REPLICATED = _S, 2  # the detail, the replication factor
    SG_PER_GPU = _S, 2  # the detail, the GPUs per DP group
    SG_WEIGHTS_LOGGED = _S, 1  # GB per GPU
    SG_KV_LOGGED = _S, 2  # GB, tokens
    SG_FLOPS_PER_TOKEN = _S, 2  # which parameter count, its value
    SG_GPUS_CONFIG = _S, 2  # the configured GPUs, the DP groups
    SG_GPUS_TP_PP = _S, 2
    SG_WINDOW = _S, 2  # batch lines, seconds
    SG_WINDOW_NO_SPAN = _S, 1
    SG_NO_BATCH_LINES = _S, 0
    SG_BOTH = _A, 2  # two reasons, one after the other
    SG_TPUT_ABSENT = _A, 2  # the throughput's key, its reason
    SG_NO_GEN_TPUT = _A, 0
    SG_NO_INPUT_TPUT = _A, 0
    SG_NO_RUNNING = _A, 0
    SG_NO_QUEUE = _A, 0
    SG_QUEUE_POINTS = _A, 1
    SG_NO_KV_USAGE = _A, 0
    SG_NO_MRR = _A, 0
    SG_NO_RUNNING_FOR_FILL = _A, 0
    SG_NO_HIT = _A, 0
    SG_NO_HIT_BATCHES = _A, 0
    SG_NO_CUDA_GRAPH = _A, 0
    SG_NO_ACCEPT_LEN = _A, 0
    SG_NO_SCRAPE = _A, 1  # the histogram
    SG_TWO_SCRAPES = _A, 0
    SG_NOT_EXPOSED = _A, 2  # the histogram's names, the scrape's source
    SG_NO_OBSERVATIONS = _A, 0
    SG_NO_OBSERVATIONS_OF = _A, 1  # the histogram
    SG_NO_MBU_LINES = _A, 0
    SG_QUANT_UNKNOWN = _A, 1
    SG_NO_WEIGHT_DTYPE = _A, 1  # the dtype's sentence
    SG_DTYPE_UNKNOWN = _A, 0
    SG_KV_MISSING = _A, 1  # the inputs missing (names)
    SG_WEIGHTS_PER_GPU_UNKNOWN = _A, 1  # why the GPUs are unknown
    SG_KV_PER_GPU_UNKNOWN = _A, 1
    SG_WEIGHTS_UNKNOWN = _A, 0
    SG_KV_UNKNOWN = _A, 0
    SG_PARAMS_UNKNOWN = _A, 0
    SG_GPUS_UNKNOWN = _A, 0
    SG_TP_UNKNOWN = _A, 0
    SG_DP_ATTENTION = _A, 0
    SG_PEAK_FLOPS_UNKNOWN = _A, 0
    SG_PEAK_BANDWIDTH_UNKNOWN = _A, 0
    # Notes of the straggler check (perfd.analytics.steps.stragglers): why a spread names no rank.
    RTT_BETWEEN_STAGES = _N, 5  # the ratio, then rank and stage of the fastest and of the slowest
    RTT_STAGES_UNKNOWN = _N, 1  # the ratio
    SPREAD_WITH_PP = _N, 0  # pp > 1: a compute spread is the stages' imbalance
    PER_RANK_NO_PP = _N, 0
    PER_RANK_NO_STAGE = _N, 0
    PER_RANK_INSTEAD = _N, 0  # per-rank timers compared, not the min/max spread
    # Why a row is out of the steady state (steady.Exclusion says which kind; these, with its numbers).
    WARMUP_ROWS = _X, 1  # how many records the warm-up is
    CAPTURED = _X, 0  # disturbed by perfd's own capture
    NO_STEP = _X, 0
    ARMED_STEP = _X, 0  # its rank runs under a profiler
    OUTLIER_STEP = _X, 3  # the step, the outlier factor, the steady step
    IN_INCIDENT = _X, 1  # the incident's id (its cause is the incident's, worded where it is shown)
    IN_CAPTURE = _X, 1  # the capture disturbance's id
    # How the FLOPs count was made, or why there is none (perfd.analytics.steps.flops: FlopsResult.notes;
    # an absent count's reason quotes them). Declared after the others: a code's number is its place.
    FLOPS_NOTES = _N, 2  # two notes, one after the other
    FLOPS_MLA = _N, 0
    FLOPS_MOE_FFN_FALLBACK = _N, 0
    FLOPS_VERSION_UNKNOWN = _N, 0
    FLOPS_VERSION_UNPARSEABLE = _N, 1  # the version as the log gave it
    FLOPS_LAYERS_OUT_OF_BOUNDS = _N, 3  # num_layers, the bounds' low and high
    FLOPS_MOE_FREQ_NOT_POSITIVE = _N, 1  # moe_layer_freq
    FLOPS_MOE_PATTERN_LENGTH = _N, 2  # the pattern's entries, num_layers
    FLOPS_6N_NO_ATTENTION = _N, 0
    FLOPS_FORMULA_UNAVAILABLE = _N, 1  # the formula's inputs missing (names)
    FLOPS_TOKENS_NO_SPEC = _N, 0
    # Where the training dtype comes from (perfd.analytics.run.run_analysis.resolve_dtype: JobGpu's
    # dtype_source); none known: UNKNOWN.
    DTYPE_ARGUMENT = _S, 0
    DTYPE_MODEL_SPEC = _S, 0
    DTYPE_FLAG = _S, 1  # the framework's argument that says it (fp8, bf16, fp16)
    DTYPE_NO_FLAG = _S, 0  # neither bf16 nor fp16 set: fp32
    # Why a step source has no number for a phase (perfd.analytics.steps.vocabulary.Vocabulary: each source's
    # reasons, chosen there; worded in perfd.report.provenance_text). Declared last: a code's number is
    # its place.
    NO_OWN_THROUGHPUT = _A, 0  # a source that states no throughput
    NO_STRAGGLER_PER_RANK = _A, 0  # per-rank step records, no straggler line
    OUTSIDE_IN_STEP = _A, 0  # the step time covers the whole iteration
    MEGATRON_NO_DATA_TIMER = _A, 0
    MEGATRON_NO_COMM_TIMERS = _A, 0
    MEGATRON_NO_THROUGHPUT = _A, 0
    MEGATRON_NO_STRAGGLER = _A, 0
    HOOK_NO_DATA_WAIT = _A, 0
    HOOK_NO_COMM = _A, 0
    HOOK_NO_OUTSIDE = _A, 0
    TORCHTITAN_NO_DATA = _A, 0
    TORCHTITAN_NO_COMM = _A, 0
    TORCHTITAN_NO_THROUGHPUT = _A, 0
    TORCHTITAN_NO_STRAGGLER = _A, 0
    # Declared after the others (a code's number is its place): an iteration left out for the loop's
    # own pause at a cadence (perfd.analytics.incidents.cadence), the cadence's id.
    IN_PAUSE = _X, 1

    kind: Kind
    arity: int

    def __new__(cls, kind: Kind, arity: int) -> Code:
        # Numbered in declaration order (codes of one kind and arity are still distinct members).
        obj = object.__new__(cls)
        obj._value_ = len(cls.__members__) + 1
        obj.kind, obj.arity = kind, arity
        return obj


# What an argument may be: a number, a name, a record's provenance, names (timers), a nested cite.
Arg = Union[int, float, str, Provenance, tuple[str, ...], "Cited"]


@dataclass(frozen=True, slots=True)
class Cited:
    """A sentence as a code and its arguments; ``caveat``: a caveat's code shown after a source."""

    code: Code
    args: tuple[Arg, ...] = ()
    caveat: Code | None = None

    @property
    def absent(self) -> bool:
        return self.code.kind is Kind.ABSENT


def cite(code: Code, *args: Arg, caveat: Code | None = None) -> Cited:
    return Cited(code, args, caveat)


@dataclass(frozen=True, slots=True)
class Measured:
    """A number with where it came from, or None with why it is absent (never a silent 0)."""

    value: float | None
    cite: Cited

    @staticmethod
    def absent(code: Code, *args: Arg) -> Measured:
        return Measured(None, Cited(code, args))

    @staticmethod
    def absent_as(why: Cited) -> Measured:
        """Absent for the reason another value is (a share of an absent throughput)."""
        return Measured(None, why)

    @property
    def present(self) -> bool:
        return self.value is not None

