"""Where a per-iteration number came from, or why it is absent: as a code and its arguments.

A metric function returns a :class:`Measured` (its value and a :class:`Cited`): the code names one
sentence (:class:`Code`, each declared once with its kind and how many arguments it takes), the
arguments are that iteration's numbers, its record's provenance and the texts other modules declare
(a vocabulary's absence reasons, the FLOPs formula, the peak table's row). No English here: each
code's sentence is declared once where it is shown (perfd.report.provenance_text: the report, the
JSON rows' legend, a finding that quotes it), so a run's table keeps the code and the numbers, not a
sentence per row (iteration_table._Cites), and analytics decide with codes, never with wording.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from perfd.model import Provenance


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
    NO_STRAGGLER_LINE = _S, 2  # the vocabulary's source and its straggler_absent
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
    WHY = _A, 1  # a reason declared elsewhere (a vocabulary's, the FLOPs count's, the peak's)
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

