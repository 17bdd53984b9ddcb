"""The GEMM library's split-K reductions of a captured step. cuBLAS runs a GEMM whose output is small
beside its inner dimension (a weight's gradient: the output a weight's size, the inner dimension the
micro-batch's rows) as a split-K GEMM, each split writing a partial output, then a reduction kernel that
sums them (``cublasLt::splitKreduce_kernel``). That reduction reads and writes a weight's size whatever
the rows: where the micro-batch grows and cuBLAS keeps its split count, the reductions of the absorbed
micro-batches go; where it splits twice as far, as many remain (perfd.analytics.advice.remedy_steps
.loop_micro_batch takes both ends). perfd.capture.analysis counts them over the complete steps. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from perfd.analytics.breakdown.casts_seen import per_microbatch
from perfd.core.record_json import JsonWritten
from perfd.core.typed import obj

# cuBLAS / cuBLASLt's reduction of a split-K GEMM's partial outputs (the name the trace keeps)
SPLITK_REDUCE = re.compile(r"splitKreduce")


def is_splitk_reduce(kernel: str) -> bool:
    return SPLITK_REDUCE.search(kernel) is not None


@dataclass(frozen=True)
class SplitKSeen(JsonWritten):
    """The split-K reduction kernels of a capture's complete steps, per step."""

    count: float  # kernels a step
    ms: float  # their summed time a step

    @staticmethod
    def from_json(v: object) -> SplitKSeen | None:
        """None: absent (a breakdown or budget from before they were counted) or not one."""
        d = obj(v)
        count, ms = d.get("count"), d.get("ms")
        if not isinstance(count, (int, float)) or not isinstance(ms, (int, float)) \
                or isinstance(count, bool) or isinstance(ms, bool) or count < 0 or ms < 0:
            return None
        return SplitKSeen(float(count), float(ms))

    def per_microbatch(self, microbatches: int) -> float | None:
        """Reductions a micro-batch where the step's count is a whole multiple of ``microbatches``
        (one set a micro-batch); None otherwise (some other GEMM's, not the weights' gradients)."""
        if microbatches < 1 or self.count <= 0 or not per_microbatch(self.count, microbatches):
            return None
        return float(round(self.count / microbatches))
