"""The dtype casts of a captured step, and which of them are its weights': under autocast over fp32
weights every forward casts each weight a matmul takes to the compute dtype, and the backward casts its
gradient back to fp32 before AccumulateGrad, once a micro-batch whatever its rows. perfd.capture.analysis
counts the cast kernels of the complete steps (:class:`CastsSeen`); :func:`weight_casts` tells the
weights' from the activations' (whose size, and time, grow with the rows). Pure.

How a weight's cast is told from an activation's, best first:

- **autograd's link** (an eager model, whose ops the trace shows): the cast whose backward node hands its
  gradient straight to an ``AccumulateGrad`` made a parameter's gradient (perfd.capture.op_kinds
  .weight_cast_ranges marks that node's kernels and its forward op's: ``linked``);
- **a compiled graph's pure casts** (inductor's kernels that do nothing but cast and lay out,
  ``triton_poi_fused__to_copy_t_4``): in the forward, a cast no other work fused into reads one of the
  graph's inputs — a parameter; inductor fuses an activation's cast into the kernel that makes it or the
  one that takes it. In the backward, activations' gradients are cast on their own too (to feed a bf16
  GEMM), so a backward pure cast counts as a weight's gradient only where it pairs with a forward one:
  as many kernels a step, about as long each (:data:`PAIRED_TIME`: the same elements either way).

A cast the trace cannot place counts as no weight's. A group of casts counts only where its kernels a
step are a whole multiple of the micro-batches: one set a micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from perfd.analytics.breakdown.pointwise_kinds import PointwiseKind, is_fused_kernel, kernel_kind
from perfd.core.record_json import JsonRecord, absent, fitting, or_absent

# A weight's cast and its gradient's move the same elements at 6 bytes each (fp32 read and bf16 written
# in the forward, bf16 read and fp32 written in the backward): their times a kernel agree but for the
# launch and the caches. nanoGPT's compiled H200 recording (tests/data/loops/nanogpt_h200): its three
# pairs 1.1-1.4x apart (5.9 and 4.3 µs, 4.6 and 3.5, 2.3 and 2.1), while its backward casts of the
# activations' gradients, as many a step as the MLP weights' (96), take 17.2 µs each, 2.9x the forward
# weight cast's: the rows' size, not the weight's. The most a pair's times a kernel are apart, either way.
PAIRED_TIME = 2.0
# the ratio of two counts a step that are one count (each is a whole number over the complete steps)
_SAME_COUNT = 1e-6


# read back, a name or a flag that does not fit reads as none (counts and times must: the group is the
# numbers)
_LENIENT_STR, _LENIENT_FLAG = absent("") | or_absent(), absent(False) | or_absent()


@dataclass(frozen=True)
class CastGroup(JsonRecord):
    """One kind of cast kernel in the complete steps, per step."""

    name: str = field(metadata=_LENIENT_STR)  # the kernel's name
    backward: bool = field(metadata=_LENIENT_FLAG)  # launched by the autograd engine
    # autograd links it to a parameter's gradient (an eager model's weight cast)
    linked: bool = field(metadata=_LENIENT_FLAG)
    count: float  # kernels a step
    ms: float  # their summed time a step

    @property
    def each_ms(self) -> float:
        return self.ms / self.count if self.count > 0 else 0.0


@dataclass(frozen=True)
class CastsSeen(JsonRecord):
    """The cast kernels of a capture's complete steps, by kernel, per step (the largest groups). Read
    back (None: absent, a breakdown or budget from before they were counted, or not one), the groups
    that fit."""

    groups: tuple[CastGroup, ...] = field(metadata=absent(()) | fitting())


def _pure_compiled(g: CastGroup) -> bool:
    """An inductor kernel that does nothing but cast (and lay out) what it reads."""
    return not g.linked and is_fused_kernel(g.name) and kernel_kind(g.name) is PointwiseKind.CAST


def per_microbatch(count: float, microbatches: int) -> bool:
    """A count a step that is one set a micro-batch: a whole multiple of ``microbatches``."""
    k = count / microbatches
    return k >= 1 - _SAME_COUNT and abs(k - round(k)) <= _SAME_COUNT * max(k, 1.0)


def weight_casts(seen: CastsSeen | None, microbatches: int) -> tuple[CastGroup, ...]:
    """The groups of ``seen`` that are the weights' casts and their gradients' (module doc), each with
    a whole multiple of ``microbatches`` kernels a step; none where the trace says nothing of casts."""
    if seen is None or microbatches < 1:
        return ()
    fwd = [g for g in seen.groups if _pure_compiled(g) and not g.backward]
    bwd = [g for g in seen.groups if _pure_compiled(g) and g.backward]
    # each forward weight cast pairs with the backward cast nearest it in time a kernel, one each
    near = sorted((abs(math.log(f.each_ms / b.each_ms)), i, j) for i, f in enumerate(fwd)
                  for j, b in enumerate(bwd) if f.each_ms > 0 and b.each_ms > 0
                  and abs(f.count - b.count) <= _SAME_COUNT * f.count
                  and abs(math.log(f.each_ms / b.each_ms)) <= math.log(PAIRED_TIME))
    took_f: set[int] = set()
    took_b: set[int] = set()
    for _gap, i, j in near:
        if i not in took_f and j not in took_b:
            took_f.add(i)
            took_b.add(j)
    found = [g for g in seen.groups if g.linked] + fwd + [bwd[j] for j in sorted(took_b)]
    return tuple(g for g in found if per_microbatch(g.count, microbatches))
