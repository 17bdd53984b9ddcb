"""The forward a captured step runs again inside its backward: activation checkpointing's recompute.
perfd.capture.ops finds its launches (an op with an autograd sequence number of its own under a backward
node: the backward's own ops make no autograd node, a recomputed forward's do); perfd.capture.analysis
sums their kernels over the complete steps. Without the checkpointing those kernels do not run, nor does
the host's dispatch of them (perfd.analytics.advice.remedy_recompute), for the memory of the activations
they spared. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfd.core.typed import obj


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


@dataclass(frozen=True)
class RecomputeSeen:
    """The recomputed forward's kernels a complete step: how many, their summed time, and that time by
    the part each computes (norm, linear, pointwise...), largest first."""

    launches: float
    ms: float
    by_part: tuple[tuple[str, float], ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"launches": self.launches, "ms": self.ms, "by_part": [list(x) for x in self.by_part]}

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
        return RecomputeSeen(n, ms, tuple(parts))
