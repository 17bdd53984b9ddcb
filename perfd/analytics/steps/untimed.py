"""The collectives a job's step timers do not time, said wherever exposed communication is.

Megatron-LM's timers time the data-parallel gradient sync (``all-grads-sync``, ``params-all-gather``,
the embedding all-reduce) and the pipeline's send/recv; the collectives of the other parallel groups
run inside ``forward-compute`` / ``backward-compute``: the tensor-parallel all-reduces (or
all-gathers and reduce-scatters with sequence parallelism), context parallelism's attention
exchanges, expert parallelism's token all-to-all. So on a TP=2 job "exposed communication 0.1%" is
the gradient sync alone: it must never read as "communication is small". A source that times no
communication at all (the step hook, torchtitan's log) claims nothing, so nothing is said here.

A capture's timeline (or the Flight Recorder's collectives) times every NCCL kernel: a report
whose step budget comes from a capture does not need this. The groups and their sizes are said where
shown (perfd.report.bottleneck_text.untimed_text). Pure.
"""

from __future__ import annotations

from perfd.analytics.common import TextEnum
from perfd.analytics.steps.vocabulary import FRAMEWORK_VOCABULARIES, MEGATRON_VOCABULARY


class Group(TextEnum):
    """A parallel group whose collectives run inside the compute timers."""

    TP = "TP"
    CP = "CP"
    EP = "EP"


Untimed = tuple[tuple[Group, int], ...]  # (group, its size), in Group order


def untimed_groups(framework: str | None, tp: int | None, cp: int | None, ep: int | None) -> Untimed:
    """The groups of size > 1 whose collectives the job's step timers cannot see, with their sizes:
    only for a source that times some communication (Megatron's timers); () where none is timed."""
    vocab = FRAMEWORK_VOCABULARIES.get(framework or "", MEGATRON_VOCABULARY)
    if not vocab.grad_sync and not vocab.pp_p2p:
        return ()
    sizes = ((Group.TP, tp), (Group.CP, cp), (Group.EP, ep))
    return tuple((g, n) for g, n in sizes if n is not None and n > 1)


def names(groups: Untimed) -> list[str]:
    """["TP", "EP"]: the groups, as JSON carries them."""
    return [g.value for g, _ in groups]
