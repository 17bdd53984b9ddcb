"""Each GPU activity of a capture charged to the op that launched it (issue "remedies an engineer
can apply without checking", item 1). Pure: the host side of a trace in, a part per activity out.

A kernel, copy or memset is launched by a runtime call (its correlation id); the call sits inside
the ranges open on its thread at that instant — the framework op that issued it (``aten::bmm``), the
ops around that, ``record_function`` annotations and, in a capture with Python stacks, module frames
(``nn.Module: DotProductAttention_3``). Backward work runs on the autograd thread inside an
``autograd::engine::evaluate_function: <Node>`` range; autograd links that node to the forward op
that made it (Kineto's ``fwdbwd`` flows, or the shared sequence number), and the backward is charged
where its forward op is: the 240 copies a step of the s×s score matrix that autograd makes for an
in-place masked fill on a view are attention's, not "memory copies".

The rules that turn names into parts are perfd.analytics.breakdown.op_parts; this module only follows links:
per thread, ranges sorted by start form a tree (a stack sweep), and each launch or flow end finds
the innermost range open at its instant in the same sweep — O(n log n) for the sort, linear after.
What a launch needs from the ranges around it (its backward unit, its innermost op, the range whose
rule decides its part) is one pointer per range, filled parent first in one pass over the tree
(_Tree.innermost / outermost), never by walking a launch's ancestors: a trace whose ops nest 30,000
deep (a job's process writes it; the root agent reads it) costs what a flat one of that size does.
No library reads both Kineto's flows and nsys' NVTX into one op tree; hence by hand.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from perfd.analytics.breakdown import op_parts as rules
from perfd.analytics.breakdown import optimizer_seen as optim
from perfd.analytics.breakdown.pointwise_kinds import PointwiseKind
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.common import TextEnum
from perfd.capture import step_marks as marks_of
from perfd.capture.op_kinds import range_kinds, weight_cast_ranges
from perfd.capture.trace_input import TraceRefused
from perfd.core import limits as L


class RangeKind(TextEnum):
    OP = "op"  # a framework op (Kineto cpu_op; an NVTX range of emit_nvtx)
    ANNOTATION = "annotation"  # record_function / NVTX pushed by the code
    FRAME = "frame"  # a Python frame (Kineto with stacks): nn.Module entries name the module


@dataclass(frozen=True, slots=True)
class HostRange:
    """A range on a host thread that launches GPU work or encloses what does (perfd.capture.ops)."""

    tid: int
    start_ns: float
    end_ns: float
    name: str
    kind: RangeKind = RangeKind.OP
    seq: int | None = None  # autograd's sequence number (forward op and its backward node share it)


@dataclass(frozen=True, slots=True)
class Launch:
    """The runtime call that launched a GPU activity: where on the host it happened."""

    corr: int
    tid: int
    ns: float
    name: str = ""
    end_ns: float | None = None  # when the call returned (None: not recorded)


@dataclass(frozen=True, slots=True)
class Flow:
    """Autograd's link from a forward op to the backward node it created (Kineto ``fwdbwd``)."""

    fwd_tid: int
    fwd_ns: float
    bwd_tid: int
    bwd_ns: float


_KIND_ORDER = {RangeKind.FRAME: 0, RangeKind.ANNOTATION: 1, RangeKind.OP: 2}
_EPS_NS = 1.0  # Kineto's µs floats: a child may end a fraction of a ns after its parent


class Method(TextEnum):
    """How a capture's time was divided among the parts (said with every budget)."""

    MODULES = "ops and module frames"  # launching ops, autograd links and nn.Module frames
    OPS = "ops"  # launching ops and autograd links, op names decide
    NAMES = "kernel names"  # no host activity in the capture: the fallback


@dataclass(frozen=True)
class OpAttribution:
    """The part of every linked GPU activity, by correlation id; ``labels`` the op that decided it
    (``aten::masked_fill_``, ``aten::masked_fill_ (backward)``) for the budget's detail."""

    method: Method
    parts: dict[int, Part]
    labels: dict[int, str] = field(default_factory=dict)
    # the op that issued it: the innermost op open at the launch ("aten::native_dropout"), for backward
    # work after its autograd node ("NativeDropoutBackward0 > aten::mul"): what the remedies' models read
    op_names: dict[int, str] = field(default_factory=dict)
    # host time of each launch (correlation id -> ns), and the optimizer phase of each marked step on the
    # host: from the end of its last backward work to the first forward launch after its step mark (a
    # step mark around a closure: from the closure's last backward work to the mark's end)
    launch_ns: dict[int, float] = field(default_factory=dict)
    launch_tid: dict[int, int] = field(default_factory=dict)  # the thread of each launch
    tails: tuple[tuple[float, float], ...] = ()
    # index in the capture's synchronising calls -> the op that made it (the outermost op around the call:
    # "aten::item", "c10d::barrier"; "" for a bare torch.cuda.synchronize())
    sync_owner: dict[int, str] = field(default_factory=dict)
    # the activities launched by the autograd engine running a backward node (the backward pass)
    backward: frozenset[int] = frozenset()
    # what each activity computes, where its ops say (perfd.capture.op_kinds): the pointwise part's makeup
    kinds: dict[int, PointwiseKind] = field(default_factory=dict)
    # when each launch call returned on the host (correlation id -> ns): whether the host was ahead of
    # the GPU at a gap (perfd.capture.sweep)
    launch_end_ns: dict[int, float] = field(default_factory=dict)
    optimizer: optim.OptimizerSeen | None = None  # the class the step marks name, the ops its update ran
    # the activities of an eager model's casts of its parameters and of their gradients (op_kinds)
    weight_casts: frozenset[int] = frozenset()
    # the activities of the forward run again inside the backward (activation checkpointing): launched
    # under a backward node by an op that has an autograd sequence number of its own. The backward's own
    # ops run with grad mode off and make no autograd node (no number); a recomputed forward runs with it
    # on, so each of its ops records one (torchtitan's selective checkpointing on an H200: 1,288 launches,
    # 53 ms a step, the norms, the rotary and the SiLU of every layer).
    recomputed: frozenset[int] = frozenset()


class _Tree:
    """The ranges of every thread, sorted, with parent links (indices into ``ranges``)."""

    def __init__(self, ranges: Sequence[HostRange]) -> None:
        self.ranges = list(ranges)
        self.parent: list[int] = [-1] * len(self.ranges)
        self.by_tid: dict[int, list[int]] = defaultdict(list)
        self.order: list[int] = []  # every range after its parent: each thread's, sorted as swept
        for i, r in enumerate(self.ranges):
            self.by_tid[r.tid].append(i)
        for idx in self.by_tid.values():
            idx.sort(key=lambda i: (self.ranges[i].start_ns, -self.ranges[i].end_ns,
                                    _KIND_ORDER[self.ranges[i].kind]))
            stack: list[int] = []
            for i in idx:
                r = self.ranges[i]
                while stack and self.ranges[stack[-1]].end_ns <= r.start_ns + _EPS_NS \
                        and not self._same_instant(stack[-1], i):
                    stack.pop()
                if stack and self.ranges[stack[-1]].end_ns + _EPS_NS < r.end_ns:
                    # not nested (overlapping ranges of one thread): leave the open ones that end first
                    while stack and self.ranges[stack[-1]].end_ns + _EPS_NS < r.end_ns:
                        stack.pop()
                self.parent[i] = stack[-1] if stack else -1
                stack.append(i)
            self.order.extend(idx)

    def _same_instant(self, outer: int, inner: int) -> bool:
        """A zero-length range at the start of an equally zero-length one nests in it."""
        a, b = self.ranges[outer], self.ranges[inner]
        return a.start_ns == b.start_ns and a.end_ns >= b.end_ns

    def locate(self, points: Iterable[tuple[int, float, int]]) -> dict[int, int]:
        """For (tid, ns, key) points: key -> the innermost range open at ns on tid (absent if none)."""
        out: dict[int, int] = {}
        by_tid: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for tid, ns, key in points:
            by_tid[tid].append((ns, key))
        for tid, pts in by_tid.items():
            idx = self.by_tid.get(tid)
            if not idx:
                continue
            pts.sort()
            stack: list[int] = []
            j = 0
            for ns, key in pts:
                while j < len(idx) and self.ranges[idx[j]].start_ns <= ns + _EPS_NS:
                    i = idx[j]
                    r = self.ranges[i]
                    while stack and self.ranges[stack[-1]].end_ns <= r.start_ns + _EPS_NS \
                            and not self._same_instant(stack[-1], i):
                        stack.pop()
                    while stack and self.ranges[stack[-1]].end_ns + _EPS_NS < r.end_ns:
                        stack.pop()
                    stack.append(i)
                    j += 1
                while stack and self.ranges[stack[-1]].end_ns + _EPS_NS < ns:
                    stack.pop()
                if stack:
                    out[key] = stack[-1]
        return out

    def innermost(self, hit: Sequence[bool], cut: Sequence[bool] = ()) -> list[int]:
        """For each range: the innermost of it and its ancestors that ``hit`` marks, or -1. A range
        ``cut`` marks ends the chains through it: its own answer is -1, and its descendants look no
        further out than the ranges inside it. One pass, parents first: linear whatever the nesting."""
        out = [-1] * len(self.ranges)
        parent = self.parent
        for i in self.order:
            if cut and cut[i]:
                continue
            p = parent[i]
            out[i] = i if hit[i] else out[p] if p >= 0 else -1
        return out

    def outermost(self, hit: Sequence[bool], cut: Sequence[bool] = ()) -> list[int]:
        """As ``innermost``, the outermost of the marked ranges instead."""
        out = [-1] * len(self.ranges)
        parent = self.parent
        for i in self.order:
            if cut and cut[i]:
                continue
            p = parent[i]
            o = out[p] if p >= 0 else -1
            out[i] = o if o >= 0 else i if hit[i] else -1
        return out


class _Attributor:
    def __init__(self, ranges: Sequence[HostRange], flows: Sequence[Flow], use_frames: bool) -> None:
        self.tree = _Tree(ranges)
        self.use_frames = use_frames
        self.r = self.tree.ranges
        self.unit_fwd: dict[int, int] = {}  # backward unit -> the forward op autograd linked it to
        self.region: set[int] = set()  # ops inside a batched matmul … softmax … batched matmul run
        self._memo: dict[int, tuple[Part | None, str]] = {}
        self._links_deep: dict[int, int] = {}  # range -> the autograd links its part was found through
        rs, tree = self.r, self.tree
        is_op = [x.kind is RangeKind.OP for x in rs]
        self.is_unit = [op and x.name.startswith(rules.BACKWARD_UNIT)
                        for op, x in zip(is_op, rs, strict=True)]
        self.unit = tree.innermost(self.is_unit)  # the innermost backward unit around each range
        self.op = tree.innermost(is_op)  # the innermost op around each range (itself if an op)
        self._link_units(flows)
        self._find_regions()
        # What forward_part reads, each range's answer inside its innermost backward unit (the unit cuts)
        self.op_part, self.frame_part = _cached(rules.op_part), _cached(rules.frame_part)
        cut = self.is_unit
        self.seg_op = tree.innermost(is_op, cut)
        # A step mark around a closure holds the step's forward and backward: only the ops its thread
        # runs after the closure's backward are the optimizer's (clipping, the update), not the mark.
        anns = [i for i, x in enumerate(rs) if x.kind is RangeKind.ANNOTATION and rules.is_step_mark(x.name)]
        marks = [i for i, out in zip(anns, marks_of.outermost([(rs[i].tid, rs[i].start_ns, rs[i].end_ns)
                                                                 for i in anns]), strict=True) if out]
        ends = marks_of.closure_ends([(rs[i].start_ns, rs[i].end_ns) for i in marks],
                                     ((x.start_ns, x.end_ns) for op, x in zip(is_op, rs, strict=True)
                                      if op and rules.is_backward_range(x.name)))
        self.marks = marks  # torch.optim's step marks, and where the closure each wraps ends (if one)
        self.closures = {i: end for i, end in zip(marks, ends, strict=True) if end is not None}
        in_tail = marks_of.starts_inside([(x.tid, x.start_ns) for x in rs],
                                         [(rs[i].tid, end, rs[i].end_ns) for i, end in self.closures.items()])
        self.seg_optimizer = tree.innermost(
            [(x.kind is RangeKind.ANNOTATION and rules.is_optimizer_annotation(x.name)
              and i not in self.closures) or (op and in_tail[i])
             for i, (op, x) in enumerate(zip(is_op, rs, strict=True))], cut)
        self.seg_frame = tree.innermost([use_frames and x.kind is RangeKind.FRAME
                                         and self.frame_part(x.name) is not None for x in rs], cut)
        self.seg_region = tree.innermost([i in self.region for i in range(len(rs))], cut)
        # the outermost op a rule places: _VocabParallelCrossEntropy > aten::to
        self.seg_rule = tree.outermost([op and not u and self.op_part(x.name) is not None
                                        for op, u, x in zip(is_op, cut, rs, strict=True)], cut)
        self._owners: tuple[list[int], list[int]] | None = None
        # The forward run again inside a backward node (OpAttribution.recomputed): its ops, and the
        # outermost of them a rule places, looking no further out than the node (whose own name, the
        # unit's link to the forward, would charge a recomputed norm to the GEMM whose backward ran it)
        node = [u or (op and (rules.is_backward_range(x.name)
                              or (self.unit[i] >= 0 and x.name == _node_of(rs[self.unit[i]].name))))
                for i, (op, u, x) in enumerate(zip(is_op, self.is_unit, rs, strict=True))]
        self.recomputing = tree.innermost([op and x.seq is not None and not n
                                           for op, n, x in zip(is_op, node, rs, strict=True)], node)
        self.seg_recomputed = tree.outermost([op and not n and self.op_part(x.name) is not None
                                              for op, n, x in zip(is_op, node, rs, strict=True)], node)
        # Backward units in the order the autograd engine ran them, per thread: a node autograd made
        # with no forward op of its own (AsStridedBackward0 beside an in-place op's CopySlices) runs
        # between its graph neighbours and is charged where they agree.
        self.units: dict[int, list[int]] = defaultdict(list)
        for i, r in enumerate(self.r):
            if r.kind is RangeKind.OP and r.name.startswith(rules.BACKWARD_UNIT):
                self.units[r.tid].append(i)
        self.unit_pos: dict[int, tuple[int, int]] = {}
        for tid, us in self.units.items():
            us.sort(key=lambda i: self.r[i].start_ns)
            self.unit_pos.update((u, (tid, k)) for k, u in enumerate(us))

    # -- autograd links -------------------------------------------------------------------------
    def unit_of(self, i: int) -> int:
        """The innermost backward unit (``evaluate_function``) around range ``i`` (itself included), or -1."""
        return self.unit[i]

    def _link_units(self, flows: Sequence[Flow]) -> None:
        ends = self.tree.locate([(f.bwd_tid, f.bwd_ns, k) for k, f in enumerate(flows)])
        starts = self.tree.locate([(f.fwd_tid, f.fwd_ns, k) for k, f in enumerate(flows)])
        first: dict[int, float] = {}
        for k, f in enumerate(flows):
            if k not in ends or k not in starts:
                continue
            u = self.unit_of(ends[k])
            if u >= 0 and self.unit_of(starts[k]) != u and (u not in first or f.bwd_ns < first[u]):
                first[u] = f.bwd_ns
                self.unit_fwd[u] = starts[k]
        # Without flows, autograd's sequence number: the node's ops carry the forward op's number.
        fwd_by_seq: dict[int, int] = {}
        pending: list[tuple[int, int]] = []
        for i, r in enumerate(self.r):
            if r.seq is None or r.kind is not RangeKind.OP:
                continue
            u = self.unit_of(i)
            if u < 0:
                fwd_by_seq.setdefault(r.seq, i)
            elif u not in self.unit_fwd and u != i:
                pending.append((u, r.seq))
        for u, seq in pending:
            if u not in self.unit_fwd and seq in fwd_by_seq:
                self.unit_fwd[u] = fwd_by_seq[seq]

    # -- core attention as a run of sibling ops ---------------------------------------------------
    def _op_parent(self, i: int) -> int:
        j = self.tree.parent[i]
        return self.op[j] if j >= 0 else -1

    def _find_regions(self) -> None:
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        batched_inside: set[int] = set()
        softmax_inside: set[int] = set()
        for i, r in enumerate(self.r):
            if r.kind is not RangeKind.OP:
                continue
            groups[(r.tid, self._op_parent(i))].append(i)
            if rules.is_batched_matmul(r.name) or rules.is_softmax(r.name):
                inside = batched_inside if rules.is_batched_matmul(r.name) else softmax_inside
                j = self._op_parent(i)
                # a wrapper (aten::matmul > aten::bmm) is batched; so is its softmax. An op in the set
                # has its ops around it there too: stop at it (each op is added once, whatever the depth)
                while j >= 0 and j not in inside:
                    inside.add(j)
                    j = self._op_parent(j)
        for members in groups.values():
            members.sort(key=lambda i: self.r[i].start_ns)
            batched = [k for k, i in enumerate(members)
                       if rules.is_batched_matmul(self.r[i].name)
                       or (rules.is_matmul_wrapper(self.r[i].name) and i in batched_inside)]
            for a, b in itertools.pairwise(batched):
                between = members[a + 1:b]
                if any(rules.is_softmax(self.r[i].name) or i in softmax_inside for i in between) and not any(
                        rules.op_part(self.r[i].name) is Part.LINEAR for i in between):
                    self.region.update(members[a:b + 1])

    # -- parts ------------------------------------------------------------------------------------
    def forward_part(self, i: int) -> tuple[Part | None, str]:
        """The part of forward work launched inside range ``i`` (looking no further out than its
        innermost backward unit, which is not looked at), and the op that decided it: an optimizer
        annotation, else a module frame, else a core-attention region, else the outermost op a rule
        places, else (no part) the innermost op."""
        j = self.seg_optimizer[i]
        if j >= 0:
            return Part.OPTIMIZER, self.r[j].name
        j = self.seg_frame[i]
        if j >= 0:
            return self.frame_part(self.r[j].name), self.r[j].name
        j = self.seg_region[i]
        if j >= 0:
            return Part.ATTENTION, self.r[j].name
        j = self.seg_rule[i]
        if j >= 0:
            return self.op_part(self.r[j].name), self.r[j].name
        j = self.seg_op[i]
        return None, self.r[j].name if j >= 0 else ""

    def op_name(self, i: int) -> str:
        """The innermost op open at ``i`` ("aten::bmm"), after its autograd node for backward work."""
        j = self.op[i]
        op = self.r[j].name if j >= 0 else ""
        u = self.unit_of(i)
        if u < 0:
            return op
        node = self.r[u].name[len(rules.BACKWARD_UNIT):].strip()
        return node if op == self.r[u].name else f"{node} > {op}"

    def owner(self, i: int) -> str:
        """The op that made a synchronisation: the outermost op around the call (``aten::item`` around
        ``aten::_local_scalar_dense``), with the innermost Python function where the trace has frames."""
        if self._owners is None:
            self._owners = (
                self.tree.outermost([x.kind is RangeKind.OP and not u for x, u in zip(self.r, self.is_unit,
                                                                                       strict=True)]),
                self.tree.innermost([x.kind is RangeKind.FRAME and rules.module_class(x.name) is None
                                     for x in self.r]))
        op, frame = self._owners[0][i], self._owners[1][i]
        return " in ".join(self.r[j].name for j in (op, frame) if j >= 0)

    def _neighbours(self, u: int, reach: int = 3) -> tuple[int, int]:
        """The linked backward units nearest ``u`` before and after it, within ``reach`` (-1: none)."""
        tid, k = self.unit_pos[u]
        us = self.units[tid]
        found: list[int] = []
        for step in (-1, 1):
            got = -1
            for j in range(k + step, k + step * (reach + 1), step):
                if not 0 <= j < len(us) or us[j] not in self.unit_fwd:
                    continue
                got = us[j]
                break
            found.append(got)
        return found[0], found[1]

    def _links(self, i: int) -> list[int]:
        """The ranges whose parts decide range ``i``'s (autograd's links); none where its own does."""
        u = self.unit[i]
        if u < 0:
            return []
        name = self.r[u].name[len(rules.BACKWARD_UNIT):].strip()
        if rules.ACCUMULATE_GRAD in name.lower() or self.forward_part(i)[0] is not None:
            return []
        if u in self.unit_fwd:
            return [self.unit_fwd[u]]
        return [] if self.op_part(name) else [j for j in self._neighbours(u) if j >= 0]

    def part_of(self, i: int) -> tuple[Part | None, str]:
        """The part of the GPU work launched while range ``i`` was the innermost one open. Links are
        followed on a stack of this method's own, not Python's: a chain of backward units each linked
        to the next is as long as the trace makes it. A link back to a range being decided (a cycle
        no autograd graph has) reads as unplaced. A part found through more than
        perfd.core.limits.MAX_TRACE_AUTOGRAD_LINKS links refuses the trace (TraceRefused, trace_nesting)."""
        if i in self._memo:
            return self._memo[i]
        path, open_ = [i], {i}
        while path:
            j = path[-1]
            nxt = next((d for d in self._links(j) if d not in self._memo and d not in open_), -1)
            if nxt >= 0:
                path.append(nxt)
                open_.add(nxt)
                continue
            deep = 1 + max((self._links_deep.get(d, 0) for d in self._links(j)), default=-1)
            if deep > L.MAX_TRACE_AUTOGRAD_LINKS:
                raise TraceRefused(L.TRACE_REFUSED_NESTING, f"backward work whose part is found through more "
                                   f"than {L.MAX_TRACE_AUTOGRAD_LINKS} autograd links (backward units nested "
                                   "and linked each to the next)")
            self._links_deep[j] = deep
            self._memo[j] = self._decide(j)
            open_.discard(path.pop())
        return self._memo[i]

    def _decide(self, i: int) -> tuple[Part | None, str]:
        """Range ``i``'s part, its links (``_links``) decided already."""
        def known(j: int) -> tuple[Part | None, str]:
            return self._memo.get(j, (None, ""))
        u = self.unit_of(i)
        if u < 0:
            return self.forward_part(i)
        name = self.r[u].name[len(rules.BACKWARD_UNIT):].strip()
        own = self.forward_part(i)  # an op rule inside the node (aten::mm under MmBackward)
        if rules.ACCUMULATE_GRAD in name.lower():
            return Part.GRAD_REDUCE, name
        if self.recomputing[i] >= 0:  # the forward run again: the part its own ops compute
            j = self.seg_recomputed[i]
            j, part = (j, self.op_part(self.r[j].name)) if j >= 0 else (self.op[i], None)
            return part, f"{self.r[j].name} (recomputed)"
        if own[0] is not None:
            return own
        if u in self.unit_fwd:
            part, label = known(self.unit_fwd[u])
            return (part, f"{label} (backward)") if part is not None else (self.op_part(name), name)
        before, after = (known(j)[0] if j >= 0 else None for j in self._neighbours(u))
        part = self.op_part(name) or (before if before is not None and before == after else None)
        return (part, f"{name} (between {part.value} nodes)" if part is not None
                and self.op_part(name) is None else name)


def _node_of(unit: str) -> str:
    """The node a backward unit runs: ``MulBackward0``, ``torch::autograd::CopySlices``."""
    return unit[len(rules.BACKWARD_UNIT):].strip()


def _cached(fn: Callable[[str], Part | None]) -> Callable[[str], Part | None]:
    """``fn`` remembered by name for one attribution (a trace repeats a few thousand names)."""
    seen: dict[str, Part | None] = {}

    def get(name: str) -> Part | None:
        if name not in seen:
            seen[name] = fn(name)
        return seen[name]
    return get


def attribute(ranges: Sequence[HostRange], launches: Sequence[Launch], flows: Sequence[Flow],
              use_frames: bool = True, syncs: Sequence[Launch] = ()) -> OpAttribution | None:
    """Each launched activity's part by its correlation id, or None for a capture with no host side
    (the caller falls back to kernel names). ``use_frames=False`` ignores Python frames (the op rules
    alone decide). ``syncs``: the capture's synchronising calls, whose owners are found too."""
    if not ranges or not launches:
        return None
    att = _Attributor(ranges, flows, use_frames)
    where = att.tree.locate([(ln.tid, ln.ns, ln.corr) for ln in launches])
    parts: dict[int, Part] = {}
    labels: dict[int, str] = {}
    names: dict[int, str] = {}
    backward: set[int] = set()
    rs = att.r
    recomputed: set[int] = set()
    for corr, i in where.items():
        part, label = att.part_of(i)
        if part is not None:
            parts[corr] = part
        labels[corr] = label
        names[corr] = att.op_name(i)
        if att.unit_of(i) >= 0:
            backward.add(corr)
            if att.recomputing[i] >= 0:
                recomputed.add(corr)
    tails = _step_tails(att, launches, parts, backward)
    _charge_tails(launches, parts, labels, names, tails)
    owners = att.tree.locate([(s.tid, s.ns - _EPS_NS, k) for k, s in enumerate(syncs)])
    frames = use_frames and any(r.kind is RangeKind.FRAME and rules.module_class(r.name)
                                for r in att.r)
    op_parent = [att.op[p] if p >= 0 else -1 for p in att.tree.parent]
    kinds = range_kinds([x.name for x in rs], [x.tid for x in rs], [x.start_ns for x in rs],
                        [x.kind is RangeKind.OP for x in rs], op_parent, att.tree.order, att.unit,
                        att.unit_fwd)
    weights = weight_cast_ranges([x.name for x in rs], [x.start_ns for x in rs], [x.end_ns for x in rs],
                                 att.tree.parent, att.tree.order, att.unit, att.units, att.unit_fwd)
    return OpAttribution(Method.MODULES if frames else Method.OPS, parts, labels, names,
                         {ln.corr: ln.ns for ln in launches}, {ln.corr: ln.tid for ln in launches}, tails,
                         {k: att.owner(i) for k, i in owners.items()}, frozenset(backward),
                         {corr: k for corr, i in where.items() if (k := kinds[i]) is not None},
                         {ln.corr: ln.end_ns for ln in launches if ln.end_ns is not None},
                         _optimizer(att, launches, names),
                         frozenset(corr for corr, i in where.items() if weights[i]), frozenset(recomputed))


# The parts of forward and backward work: the first launch of one after a step mark begins the next step.
_NOT_LAYERS = (Part.OPTIMIZER, Part.GRAD_REDUCE, Part.COMM_EXPOSED, Part.PIPELINE, Part.MEMCPY)


def _step_tails(att: _Attributor, launches: Sequence[Launch], parts: dict[int, Part],
                backward: set[int]) -> tuple[tuple[float, float], ...]:
    """The optimizer phase of each step marked by ``Optimizer.step#`` on the host: from the end of the
    backward work before the mark to the first forward launch after it (Megatron-LM's gradient norm,
    clipping and master-weight copies run there, outside torch's step annotation); the window's head
    before its first forward launch is one too (the rest of the step before the window). A mark around a
    closure (perfd.capture.step_marks) holds the step's forward and backward: its phase begins where the
    closure's backward ends."""
    marks = sorted((att.r[i].start_ns, att.r[i].end_ns, att.closures.get(i)) for i in att.marks)
    if not marks:
        return ()
    unit_ends = sorted(r.end_ns for r in att.r
                       if r.kind is RangeKind.OP and r.name.startswith(rules.BACKWARD_UNIT))
    fwd = sorted(ln.ns for ln in launches if ln.corr not in backward and ln.corr in parts
                 and parts[ln.corr] not in _NOT_LAYERS)
    tails: list[tuple[float, float]] = []
    if fwd and fwd[0] < marks[0][0]:
        tails.append((min(ln.ns for ln in launches) - 1.0, fwd[0]))
    prev_end = tails[0][1] if tails else float("-inf")
    for start, end, closure_end in marks:
        if closure_end is not None:
            # the optimizer returns at the mark's end; what the loop does before the next step's closure
            # (its hooks, the next batch fetched and copied) is not this step's optimizer
            begin, stop = closure_end, end
        else:
            j = bisect.bisect_left(unit_ends, start) - 1
            begin = unit_ends[j] if j >= 0 and unit_ends[j] > prev_end else start
            k = bisect.bisect_right(fwd, end)
            stop = fwd[k] if k < len(fwd) else float("inf")
        tails.append((begin, stop))
        prev_end = stop
    return tuple(tails)


def _optimizer(att: _Attributor, launches: Sequence[Launch],
               names: dict[int, str]) -> optim.OptimizerSeen | None:
    """The optimizer the step marks name, and the op each one launched last on its thread: the update,
    which torch.optim runs at the end of its step (perfd.analytics.breakdown.optimizer_seen)."""
    marks = [att.r[i] for i in att.marks]
    last = marks_of.last_inside(((ln.tid, ln.ns, ln.corr) for ln in launches
                                 if ln.corr in names and "launch" in ln.name.lower()),
                                [(r.tid, r.start_ns, r.end_ns) for r in marks])
    return optim.seen([c for r in marks if (c := optim.step_class(r.name))],
                      [names[c] for c in last.values()])


def _charge_tails(launches: Sequence[Launch], parts: dict[int, Part], labels: dict[int, str],
                  names: dict[int, str], tails: Sequence[tuple[float, float]]) -> None:
    """Kernels launched in an optimizer phase by ops no rule places (the gradient norm's
    ``linalg_vector_norm``, the clipping's ``mul``, the master weights' ``copy_``) are the optimizer's.
    Copies stay copies (a batch to the device)."""
    if not tails:
        return
    starts = [t[0] for t in tails]
    for ln in launches:
        if ln.corr in parts or ln.corr not in labels or "launch" not in ln.name.lower():
            continue
        j = bisect.bisect_right(starts, ln.ns) - 1
        if j >= 0 and tails[j][1] >= ln.ns:
            parts[ln.corr] = Part.OPTIMIZER
            labels[ln.corr] = f"{labels[ln.corr] or names.get(ln.corr, '')} (optimizer phase)"

