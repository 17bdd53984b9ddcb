"""The forward a captured step runs again inside its backward: activation checkpointing's recompute.
perfd.capture.ops finds its launches (an op with an autograd sequence number of its own under a backward
node: the backward's own ops make no autograd node, a recomputed forward's do); perfd.capture.analysis
sums their kernels over the complete steps. Without the checkpointing those kernels do not run, nor does
the host's dispatch of them (perfd.analytics.advice.remedy_recompute), for the memory of the activations
they spared. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfd.core.record_json import JsonWritten
from perfd.core.typed import obj


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


@dataclass(frozen=True)
class RecomputeSeen(JsonWritten):
    """The recomputed forward's kernels a complete step: how many, their summed time, and that time by
    the part each computes (norm, linear, pointwise...), largest first."""

    launches: float
    ms: float
    by_part: tuple[tuple[str, float], ...] = ()
    # The host's time a launch (µs, the trace's, median) in the layers' forward and in the backward's own
    # work. A checkpoint's forward runs under it: torch.utils.checkpoint's hooks, and selective
    # checkpointing's policy, a Python dispatch mode that every op of the forward passes through
    # (measured on a CPU, torch 2.13, 28 Llama-like layers of tiny tensors: the forward's host 5.5× a
    # plain forward's with torchtitan's op policy, 2.2× with full checkpointing). The backward's own ops
    # run outside it: what a forward launch costs without it is at least that far down.
    forward_us: float | None = None
    backward_us: float | None = None

    @property
    def forward_host(self) -> float:
        """What a forward launch's host time may come down to without the checkpoint (1: no sign)."""
        if not self.forward_us or self.backward_us is None:
            return 1.0
        return min(1.0, self.backward_us / self.forward_us)

    @staticmethod
    def from_json(v: object) -> RecomputeSeen | None:
        """None: absent (a breakdown or budget from before recompute was counted) or not one."""
        d = obj(v)
        n, ms = _number(d.get("launches")), _number(d.get("ms"))
        if n is None or ms is None:
            return None
        rows = d.get("by_part")
        parts: list[tuple[str, float]] = []
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, list) and len(row) == 2 and isinstance(row[0], str) \
                    and (x := _number(row[1])) is not None:
                parts.append((row[0], x))
        return RecomputeSeen(n, ms, tuple(parts), _number(d.get("forward_us")), _number(d.get("backward_us")))
