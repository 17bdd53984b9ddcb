"""Where a per-iteration number came from, or why it is absent: as a code and its arguments.

A metric function returns a :class:`Measured` (its value and a :class:`Cited`): the code names one
sentence (:class:`Code`, each declared once with its kind and its template), the arguments are that
iteration's numbers, its record's provenance and the texts other modules declare (a vocabulary's
absence reasons, the FLOPs formula, the peak table's row). The English is made only where it is
shown (:func:`line`, :func:`text`: the report, the JSON rows' legend, a finding that quotes it), so a
run's table keeps the code and the numbers, not a sentence per row (iteration_table._Cites).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

from perfd.model import Provenance


class Kind(enum.Enum):
    """What a sentence says: the source of a present number, the reason of an absent one, or the
    caveat a source carries (an inference)."""

    SOURCE = "source"
    ABSENT = "absent"
    CAVEAT = "caveat"


_S, _A, _C = Kind.SOURCE, Kind.ABSENT, Kind.CAVEAT


class Code(enum.Enum):
    """One sentence: its kind and its template (``str.format`` over the arguments, positional; a
    nested :class:`Cited` is its text, a tuple of names is joined by commas). The member's name is
    the code."""

    # The record itself, the log's own figures.
    RECORD = (_S, "{0}")  # the record's provenance (its log line, the hook's rank and pid)
    STEP_TIME = (_S, "{0}: step time")  # a record without provenance: its source's step time
    LOSS = (_S, "{0}: loss")
    QUOTED = (_S, "{0}")  # a source declared elsewhere (the logged throughput's name, no straggler line)
    STRAGGLER_LINE = (_S, "megatron: straggler detector line (MnRtt/MxRtt)")
    NO_STRAGGLER_LINE = (_S, "{0}: {1}")  # the vocabulary's source and its straggler_absent
    # Throughput and MFU.
    THROUGHPUT = (_S, "analytics:FLOPs/(step s·1e12·world={0}); {1}")
    THROUGHPUT_LOGGED = (_S, "{0}:logged throughput per GPU (perfd's formula unavailable: {1})")
    MFU = (_S, "analytics:model TFLOP/s per GPU ÷ {0}")
    # Shares of the step from timers.
    TIMER_SHARE = (_S, "{0}:timer {1} ({2}) {3:g} ms ÷ step time {4:g} ms; {5}")
    COMM_PER_RANK = (_S, "{0}:per-rank Σ({1}) on worst rank {2}: {3:.2f} ms ÷ step {4:g} ms; {5}")
    COMM_ONE_MAX = (_S, "{0}:Σ max across ranks({1}) = {2:.2f} ms ÷ step {3:g} ms; {4}")
    COMM_SUM_OF_MAX = (_S, "{0}:Σ max across ranks({1}) = {2:.2f} ms ÷ step {3:g} ms (maxima may come "
                           "from different ranks: upper bound); {4}")
    # The pipeline.
    NO_BUBBLE = (_S, "analytics:pp=1: no pipeline bubble")
    BUBBLE_1F1B = (_S, "analytics:1F1B (p-1)/(m+p-1) = {0}/({1}+{0})")
    BUBBLE_INTERLEAVED = (_S, "analytics:interleaved 1F1B (p-1)/(v·m+p-1) = {0}/({1}·{2}+{0})")
    IDLE_RANK_MAX = (_S, "megatron:per-rank timers: rank {0} idle = 1 − (forward-compute + backward-compute)"
                         " / forward-backward = 1 − {1:.2f}/{2:.2f}; {3}")
    IDLE_RANK_MIN = (_S, "megatron:per-rank timers: rank {0} idle = 1 − {1:.2f}/{2:.2f}; {3}")
    IDLE_LIGHTER = (_S, "megatron:1 − (forward-compute min {0:g} + backward-compute min {1:g}) / "
                        "forward-backward max {2:g}; {3}")
    IDLE_HEAVIER = (_S, "megatron:1 − (forward-compute max {0:g} + backward-compute max {1:g}) / "
                        "forward-backward max {2:g}; {3}")
    IMBALANCE = (_S, "analytics:max stage idle − analytic bubble: attributed to stage imbalance")
    MINMAX_PAIRING = (_C, "inference: min forward paired with min backward (lighter stage), max with max "
                          "(heavier stage); minmax timers do not say which rank holds which value")
    # Absent: why.
    UNKNOWN = (_A, "unknown")  # no reason given
    WHY = (_A, "{0}")  # a reason declared elsewhere (a vocabulary's, the FLOPs count's, the peak's)
    NO_LOSS = (_A, "no loss on this iteration (a NaN loss removes the field)")
    MISSING = (_A, "missing {0}")
    NON_POSITIVE = (_A, "non-positive step time {0} ms or world {1}")
    NO_STEP_TIME = (_A, "step time absent")
    NO_TIMERS = (_A, "no {0} timers present")
    FLOPS_UNKNOWN = (_A, "model FLOPs unknown")
    THROUGHPUT_UNKNOWN = (_A, "throughput unknown")
    PEAK_UNKNOWN = (_A, "peak TFLOP/s unknown")
    PP_UNKNOWN = (_A, "pipeline-parallel size unknown")
    MICROBATCHES_UNKNOWN = (_A, "micro-batches per iteration unknown")
    NO_STAGES = (_A, "pp=1: no pipeline stages")
    NO_STAGE_TIMERS = (_A, "forward-backward / forward-compute / backward-compute timers absent (needs "
                           "--timing-log-level >= 1)")
    MAX_ONLY = (_A, "max-only timers (--timing-log-option max): per-stage idle needs min and max (minmax) "
                    "or per-rank values (all)")
    FB_ZERO = (_A, "forward-backward timer is zero")
    IMBALANCE_INPUTS = (_A, "needs the measured stage idle and the analytic bubble")

    kind: Kind
    template: str

    def __new__(cls, kind: Kind, template: str) -> Code:
        # Numbered in declaration order (two codes may share a template: the name tells them apart).
        obj = object.__new__(cls)
        obj._value_ = len(cls.__members__) + 1
        obj.kind, obj.template = kind, template
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


def _shown(a: Arg) -> object:
    if isinstance(a, Cited):
        return text(a)
    if isinstance(a, tuple):
        return ", ".join(a)
    if isinstance(a, Provenance):
        return str(a)
    return a


def text(c: Cited) -> str:
    """The sentence alone: a source's detail, an absence's reason (as another sentence quotes it)."""
    return c.code.template.format(*map(_shown, c.args))


def line(c: Cited) -> str:
    """The sentence as a metric's source reads: ``absent: why``, or the source with its caveat."""
    if c.absent:
        return f"absent: {text(c)}"
    out = text(c)
    return f"{out} [{c.caveat.template}]" if c.caveat is not None else out


def lines(sources: Mapping[str, Cited]) -> dict[str, str]:
    """Every metric's source as it reads (the legend, the report)."""
    return {k: line(c) for k, c in sources.items()}
