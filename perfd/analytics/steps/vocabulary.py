"""Each step source's vocabulary: how its step records say the framework-neutral phases of a step
(the step, data wait, compute, exposed communication, optimizer, the time between steps), and why a
phase has none from it (provenance codes, worded in perfd.report.provenance_text). Declared once
here; every analysis reads a phase through the record's vocabulary (:func:`vocabulary_of`). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfd.analytics.common import (
    BACKWARD_COMPUTE,
    BATCH_GENERATOR,
    FORWARD_COMPUTE,
    GRAD_SYNC_TIMERS,
    OPTIMIZER,
    PP_P2P_TIMERS,
)
from perfd.analytics.steps.provenance import Code
from perfd.core.model import HOOK_COMPUTE, HOOK_DATA_WAIT, HOOK_FRAMEWORKS, HOOK_OUTSIDE, StepRecord


@dataclass(frozen=True)
class Vocabulary:
    """How one source's step records say the framework-neutral phases of a step.

    The phases: the step itself (``StepRecord.step_time_ms``), data wait, compute, exposed
    communication (gradient sync and pipeline point-to-point), optimizer and pipeline idle. Each
    analysis reads a phase through the record's vocabulary, so it is named for what it measures,
    not for a framework, and a source is mapped here once. An empty tuple: the source does not
    time that phase (the metric is then absent, with ``*_absent`` saying why and where to get it).
    Flight Recorder windows are not a step source: their total communication share comes from the
    collective records (perfd.analytics.collectives.collective_analysis), whatever the step source.
    """

    source: str  # Provenance.collector of the records this vocabulary reads
    data_wait: tuple[str, ...]
    compute: tuple[str, ...]
    grad_sync: tuple[str, ...]
    pp_p2p: tuple[str, ...]
    optimizer: tuple[str, ...]
    # Why a phase has no number from this source: codes, worded in perfd.report.provenance_text.
    data_wait_absent: Code
    comm_absent: Code
    throughput_absent: Code = Code.NO_OWN_THROUGHPUT
    straggler_absent: Code = Code.NO_STRAGGLER_PER_RANK
    # How the values across ranks are read: "max across ranks" for Megatron's minmax timers, the
    # slowest rank's value for records folded from per-rank hooks.
    across_ranks: str = "max across ranks"
    # Host time between two steps that was neither a data fetch nor an announced pause (the step
    # hook's periods hold it); a source whose step time covers the whole iteration has none to say.
    outside: tuple[str, ...] = ()
    outside_absent: Code = Code.OUTSIDE_IN_STEP


MEGATRON_VOCABULARY = Vocabulary(
    "megatron", data_wait=(BATCH_GENERATOR,), compute=(FORWARD_COMPUTE, BACKWARD_COMPUTE),
    grad_sync=GRAD_SYNC_TIMERS, pp_p2p=PP_P2P_TIMERS, optimizer=(OPTIMIZER,),
    data_wait_absent=Code.MEGATRON_NO_DATA_TIMER, comm_absent=Code.MEGATRON_NO_COMM_TIMERS,
    throughput_absent=Code.MEGATRON_NO_THROUGHPUT, straggler_absent=Code.MEGATRON_NO_STRAGGLER)
HOOK_VOCABULARY = Vocabulary(
    "hook", data_wait=(HOOK_DATA_WAIT,), compute=(HOOK_COMPUTE,), grad_sync=(), pp_p2p=(), optimizer=(),
    data_wait_absent=Code.HOOK_NO_DATA_WAIT, comm_absent=Code.HOOK_NO_COMM,
    outside=(HOOK_OUTSIDE,), outside_absent=Code.HOOK_NO_OUTSIDE)
TORCHTITAN_VOCABULARY = Vocabulary(
    "torchtitan", data_wait=(), compute=(), grad_sync=(), pp_p2p=(), optimizer=(),
    data_wait_absent=Code.TORCHTITAN_NO_DATA, comm_absent=Code.TORCHTITAN_NO_COMM,
    throughput_absent=Code.TORCHTITAN_NO_THROUGHPUT, straggler_absent=Code.TORCHTITAN_NO_STRAGGLER)
VOCABULARIES: dict[str, Vocabulary] = {v.source: v for v in (MEGATRON_VOCABULARY, HOOK_VOCABULARY,
                                                              TORCHTITAN_VOCABULARY)}
# A job's framework (JobInfo.framework) -> the vocabulary its steps speak: a plain PyTorch job's, and a
# Hugging Face or Lightning Trainer's, come from the step hook (before, its data-loading line named
# Megatron's batch-generator timer).
FRAMEWORK_VOCABULARIES: dict[str, Vocabulary] = {**VOCABULARIES,
                                                 **{name: HOOK_VOCABULARY for name in HOOK_FRAMEWORKS}}


def vocabulary_of(rec: StepRecord) -> Vocabulary:
    """The vocabulary of a record's source (its provenance's collector). A record without a known
    source is read as Megatron's, the one source whose records may come without provenance (tests,
    older spools), unless it carries the hook's data-wait timer."""
    if rec.source is not None and rec.source.collector in VOCABULARIES:
        return VOCABULARIES[rec.source.collector]
    return HOOK_VOCABULARY if HOOK_DATA_WAIT in rec.timers else MEGATRON_VOCABULARY
