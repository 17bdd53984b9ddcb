"""What each launched activity of a capture computes, for the pointwise part's composition: the rules of
perfd.analytics.breakdown.pointwise_kinds applied to a trace's op tree (perfd.capture.ops builds the
tree and the autograd links; this module only reads them). Pure.

Forward ops are read in runs of siblings (the ops one parent, or the top level of a thread, ran in
order), views left out: a pattern of neighbours decides an op's kind (an RMS normalisation written out,
a rotary embedding, a SwiGLU's gate), else its own name. An op inside another takes the kind of the
nearest one around it that has one (``aten::to`` > ``aten::copy_``). Backward work takes the kind of the
forward op autograd linked its node to, else its own op's name. A kernel with no kind from its ops takes
its name's (inductor's fused kernels name what they fuse); a zero-fill the cross-entropy's backward runs
right after, on the same stream, is the logits' gradient. A cast that autograd links to a parameter's
gradient is a weight's (:func:`weight_cast_ranges`).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence

from perfd.analytics.breakdown.op_parts import ACCUMULATE_GRAD
from perfd.analytics.breakdown.pointwise_kinds import (
    VIEWS,
    PointwiseKind,
    kernel_kind,
    op_kind,
    sequence_kinds,
)
from perfd.capture.timeline_events import KernelEvent


def range_kinds(names: Sequence[str], tids: Sequence[int], starts: Sequence[float], is_op: Sequence[bool],
                op_parent: Sequence[int], order: Sequence[int], unit: Sequence[int],
                unit_fwd: Mapping[int, int]) -> list[PointwiseKind | None]:
    """The kind of the work launched while each range is the innermost one open. ``op_parent``: each
    range's nearest enclosing op (-1: none); ``order``: every range after its parent; ``unit``: the
    innermost backward unit around each range (-1: forward work); ``unit_fwd``: a unit -> the forward op
    autograd linked it to."""
    n = len(names)
    own: list[PointwiseKind | None] = [None] * n
    runs: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in range(n):
        if is_op[i] and unit[i] < 0 and names[i].lower() not in VIEWS:
            runs[(tids[i], op_parent[i])].append(i)
    for members in runs.values():
        members.sort(key=lambda i: starts[i])
        for i, k in zip(members, sequence_kinds([names[i] for i in members]), strict=True):
            own[i] = k
    for i in range(n):
        if own[i] is None and is_op[i]:
            own[i] = op_kind(names[i], unit[i] >= 0)
    # views take their run's kind where the ops just before and after them agree (a slice inside a rotary
    # embedding): SliceBackward0's fill and copy are the rotary's
    whole: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in range(n):
        if is_op[i] and unit[i] < 0:
            whole[(tids[i], op_parent[i])].append(i)
    for members in whole.values():
        members.sort(key=lambda i: starts[i])
        _fill_views(members, [names[i].lower() in VIEWS for i in members], own)
    # the nearest kind around each range, parents first
    near: list[PointwiseKind | None] = [None] * n
    for i in order:
        p = op_parent[i]
        near[i] = own[i] if own[i] is not None else near[p] if p >= 0 else None
    out: list[PointwiseKind | None] = list(near)
    for i in range(n):
        u = unit[i]
        if u < 0:
            continue
        fwd = unit_fwd.get(u)
        # the forward op's kind (a rotary slice's backward zero-fills too: it is the rotary's), else its own
        out[i] = (near[fwd] if fwd is not None else None) or near[i]
    return out


def weight_cast_ranges(names: Sequence[str], starts: Sequence[float], ends: Sequence[float],
                       parent: Sequence[int], order: Sequence[int], unit: Sequence[int],
                       units: Mapping[int, Sequence[int]], unit_fwd: Mapping[int, int]) -> list[bool]:
    """Whether each range is inside an eager model's cast of a parameter or of its gradient (autocast
    casts each fp32 weight a matmul takes in every forward; autograd casts its gradient back in the
    backward): a backward node autograd linked to a forward cast op (``ToCopyBackward0`` of
    ``aten::to``) that its thread runs right before an ``AccumulateGrad`` — the engine runs a leaf's
    accumulation as soon as its gradient is ready, so that node made a parameter's gradient, not an
    activation's — its ranges, and those of the forward op it is linked to. ``units``: each thread's
    backward units in the order they started; ``parent``: each range's enclosing range (-1: none); the
    other arguments as :func:`range_kinds` takes them."""
    nodes: set[int] = set()
    for us in units.values():
        top: list[int] = []  # the units the engine ran one after another (a nested one: its outer one's)
        for u in us:
            if not top or starts[u] >= ends[top[-1]]:
                top.append(u)
        for u, nxt in itertools.pairwise(top):
            fwd = unit_fwd.get(u)
            if fwd is not None and ACCUMULATE_GRAD in names[nxt].lower() \
                    and op_kind(names[fwd], False) is PointwiseKind.CAST:
                nodes.add(u)
    forward = {unit_fwd[u] for u in nodes}
    out = [False] * len(names)
    for i in order:
        p = parent[i]
        out[i] = unit[i] in nodes if unit[i] >= 0 else i in forward or (p >= 0 and out[p])
    return out


def _fill_views(members: Sequence[int], view: Sequence[bool], own: list[PointwiseKind | None]) -> None:
    """Each view of a run (in order) takes the kind of the ops around it where the nearest one before and
    the nearest one after have the same one (linear: one pass each way)."""
    before: list[PointwiseKind | None] = []
    last: PointwiseKind | None = None
    for i, v in zip(members, view, strict=True):
        before.append(last)
        if not v and own[i] is not None:
            last = own[i]
    nxt: PointwiseKind | None = None
    for k in range(len(members) - 1, -1, -1):
        i = members[k]
        if view[k]:
            if own[i] is None and nxt is not None and before[k] == nxt:
                own[i] = nxt
        elif own[i] is not None:
            nxt = own[i]


def kernel_kinds(kernels: Sequence[KernelEvent], by_op: Mapping[int, PointwiseKind]
                 ) -> dict[int, PointwiseKind]:
    """Each kernel's kind by its correlation id: its ops' (``by_op``), else its name's; a zero-fill in the
    backward that the cross-entropy's kernel follows on its stream is the logits' gradient's."""
    out: dict[int, PointwiseKind] = {}
    streams: dict[int | None, list[KernelEvent]] = defaultdict(list)
    for k in kernels:
        if k.corr is None:
            continue
        kind = by_op.get(k.corr) or kernel_kind(k.name)
        if kind is not None:
            out[k.corr] = kind
        streams[k.stream].append(k)
    for ks in streams.values():
        ks.sort(key=lambda k: k.start_ns)
        for a, b in itertools.pairwise(ks):
            if a.corr is not None and b.corr is not None and out.get(a.corr) is PointwiseKind.GRAD_FILL \
                    and out.get(b.corr) is PointwiseKind.CROSS_ENTROPY:
                out[a.corr] = PointwiseKind.LOGITS_GRAD_FILL
    return out
