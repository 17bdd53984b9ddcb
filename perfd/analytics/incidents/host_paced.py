"""The host ran slower: an incident whose step excess spread over the host-timed parts of the step in
proportion, on a job whose GPU waits on its host.

On a host-bound job (the GPU waits out the gaps the host leaves between its launches) every part of the
step is the host's time: the data wait, the time outside the step, and the rest of the step, where the GPU
waits for the host to launch its work. A host that runs slower (other processes on the node, a lower CPU
frequency, less of a CPU for the rank) stretches each of them by about the step's own factor
(th.HOST_PACE_TOLERANCE); a GPU that slowed stretches the rest alone, a data loader the data wait alone.
The item (:data:`EvidenceKind.HOST_SLOWER`) carries each part's factor; the host's own evidence
(perfd.analytics.incidents.host_evidence: other processes on the rank's CPUs, its CPU quota) outranks it
where the agent saw any. Whether the job is host-bound is the run's to say (perfd.analytics.run
.run_incidents.host_bound: it reads the capture's class, a layer above). Pure; no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from perfd.analytics import thresholds as th
from perfd.analytics.incidents.evidence import Evidence, EvidenceKind

TOLERANCE = th.HOST_PACE_TOLERANCE.value
PARTS = ("data_wait", "outside", "in_step")  # the names of HostParts' fields in the item's detail


class Timed(Protocol):
    """What the rule reads of an iteration (perfd.analytics.steps.iteration.IterationResult)."""

    @property
    def step_time_ms(self) -> float | None: ...

    @property
    def data_share(self) -> float | None: ...

    @property
    def outside_share(self) -> float | None: ...


@dataclass(frozen=True)
class HostParts:
    """The host-timed parts of a step (ms): its data wait, its time outside the step (neither a fetch nor
    an announced pause), and the rest of the step, which the host paces on a host-bound job."""

    data_wait: float
    outside: float
    in_step: float

    def values(self) -> tuple[float, float, float]:
        return self.data_wait, self.outside, self.in_step


def host_parts(its: Sequence[Timed]) -> HostParts | None:
    """Each part's median over the steps of ``its`` that time both shares; None where none does."""
    rows = [(s * d, s * o, s * (1.0 - d - o)) for it in its
            if (s := it.step_time_ms) is not None and (d := it.data_share) is not None
            and (o := it.outside_share) is not None]
    if not rows:
        return None
    return HostParts(*(statistics.median(r[k] for r in rows) for k in range(3)))


def host_slower(steady: HostParts | None, its: Sequence[Timed], rank: int | None,
                first_seen: float | None, last_seen: float | None) -> Evidence | None:
    """The item where the incident's steps ``its`` grew each host-timed part against ``steady`` (the
    steady steps' parts on a host-bound job; None: not host-bound, or untimed) by the step's own factor
    give or take th.HOST_PACE_TOLERANCE of its growth; None where one part kept its level (the GPU, or
    the data loader, alone) or grew well beyond the others."""
    during = host_parts(its)
    if steady is None or during is None or min(steady.values()) <= 0.0:
        return None
    step = sum(during.values()) / sum(steady.values())
    if step <= 1.0:
        return None
    factors = {name: d / s for name, d, s in zip(PARTS, during.values(), steady.values(), strict=True)}
    if any(abs(f - step) > TOLERANCE * (step - 1.0) for f in factors.values()):
        return None
    timed = sum(1 for it in its if it.data_share is not None and it.outside_share is not None)
    return Evidence(EvidenceKind.HOST_SLOWER, rank, "", step, first_seen, last_seen, timed,
                    {"factors": factors, "steady_ms": dict(zip(PARTS, steady.values(), strict=True)),
                     "during_ms": dict(zip(PARTS, during.values(), strict=True)), "tolerance": TOLERANCE})
