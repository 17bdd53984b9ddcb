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
No library reads both Kineto's flows and nsys' NVTX into one op tree; hence by hand.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from perfd.analytics.breakdown import op_parts as rules
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.common import TextEnum


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
    # host: from the end of its last backward work to the first forward launch after its step mark
    launch_ns: dict[int, float] = field(default_factory=dict)
    tails: tuple[tuple[float, float], ...] = ()
    # index in the capture's synchronising calls -> the op that made it (the outermost op around the call:
    # "aten::item", "c10d::barrier"; "" for a bare torch.cuda.synchronize())
    sync_owner: dict[int, str] = field(default_factory=dict)
    # the activities launched by the autograd engine running a backward node (the backward pass)
    backward: frozenset[int] = frozenset()


class _Tree:
    """The ranges of every thread, sorted, with parent links (indices into ``ranges``)."""

    def __init__(self, ranges: Sequence[HostRange]) -> None:
        self.ranges = list(ranges)
        self.parent: list[int] = [-1] * len(self.ranges)
        self.by_tid: dict[int, list[int]] = defaultdict(list)
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

    def chain(self, i: int) -> list[int]:
        """``i`` and its ancestors, innermost first."""
        out = []
        while i >= 0:
            out.append(i)
            i = self.parent[i]
        return out


class _Attributor:
    def __init__(self, ranges: Sequence[HostRange], flows: Sequence[Flow], use_frames: bool) -> None:
        self.tree = _Tree(ranges)
        self.use_frames = use_frames
        self.r = self.tree.ranges
        self.unit_fwd: dict[int, int] = {}  # backward unit -> the forward op autograd linked it to
        self.region: set[int] = set()  # ops inside a batched matmul … softmax … batched matmul run
        self._memo: dict[int, tuple[Part | None, str]] = {}
        self._link_units(flows)
        self._find_regions()
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
        """The innermost backward unit (``evaluate_function``) around range ``i``, or -1."""
        for j in self.tree.chain(i):
            if self.r[j].kind is RangeKind.OP and self.r[j].name.startswith(rules.BACKWARD_UNIT):
                return j
        return -1

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
        while j >= 0 and self.r[j].kind is not RangeKind.OP:
            j = self.tree.parent[j]
        return j

    def _find_regions(self) -> None:
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        batched_inside: set[int] = set()
        softmax_inside: set[int] = set()
        for i, r in enumerate(self.r):
            if r.kind is not RangeKind.OP:
                continue
            groups[(r.tid, self._op_parent(i))].append(i)
            if rules.is_batched_matmul(r.name) or rules.is_softmax(r.name):
                j = self._op_parent(i)
                while j >= 0:  # a wrapper (aten::matmul > aten::bmm) is batched; so is its softmax
                    (batched_inside if rules.is_batched_matmul(r.name) else softmax_inside).add(j)
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
    def forward_part(self, i: int, stop: int = -1) -> tuple[Part | None, str]:
        """The part of forward work launched inside range ``i`` (looking no further out than
        ``stop``, a backward unit), and the op that decided it."""
        chain = self.tree.chain(i)
        if stop >= 0 and stop in chain:
            chain = chain[:chain.index(stop)]
        for j in chain:
            r = self.r[j]
            if r.kind is RangeKind.ANNOTATION and rules.is_optimizer_annotation(r.name):
                return Part.OPTIMIZER, r.name
        if self.use_frames:
            for j in chain:
                r = self.r[j]
                if r.kind is not RangeKind.FRAME:
                    continue
                part = _frame_part(r.name)
                if part is not None:
                    return part, r.name
        for j in chain:
            if j in self.region:
                return Part.ATTENTION, self.r[j].name
        for j in reversed(chain):  # outermost op first: _VocabParallelCrossEntropy > aten::to
            r = self.r[j]
            if r.kind is RangeKind.OP and not r.name.startswith(rules.BACKWARD_UNIT):
                part = rules.op_part(r.name)
                if part is not None:
                    return part, r.name
        ops = [j for j in chain if self.r[j].kind is RangeKind.OP]
        return None, self.r[ops[0]].name if ops else ""

    def op_name(self, i: int) -> str:
        """The innermost op open at ``i`` ("aten::bmm"), after its autograd node for backward work."""
        chain = self.tree.chain(i)
        op = next((self.r[j].name for j in chain if self.r[j].kind is RangeKind.OP), "")
        u = self.unit_of(i)
        if u < 0:
            return op
        node = self.r[u].name[len(rules.BACKWARD_UNIT):].strip()
        return node if op == self.r[u].name else f"{node} > {op}"

    def _neighbours(self, u: int, reach: int = 3) -> Part | None:
        """The part the linked backward units before and after ``u`` agree on (None if they do not)."""
        tid, k = self.unit_pos[u]
        us = self.units[tid]
        found: list[Part | None] = []
        for step in (-1, 1):
            got = None
            for j in range(k + step, k + step * (reach + 1), step):
                if not 0 <= j < len(us) or us[j] not in self.unit_fwd:
                    continue
                got = self.part_of(us[j])[0]
                break
            found.append(got)
        return found[0] if found[0] is not None and found[0] == found[1] else None

    def part_of(self, i: int) -> tuple[Part | None, str]:
        """The part of the GPU work launched while range ``i`` was the innermost one open."""
        if i in self._memo:
            return self._memo[i]
        u = self.unit_of(i)
        if u < 0:
            got = self.forward_part(i)
        else:
            name = self.r[u].name[len(rules.BACKWARD_UNIT):].strip()
            own = self.forward_part(i, stop=u)  # an op rule inside the node (aten::mm under MmBackward)
            if rules.ACCUMULATE_GRAD in name.lower():
                got = (Part.GRAD_REDUCE, name)
            elif own[0] is not None:
                got = own
            elif u in self.unit_fwd:
                part, label = self.part_of(self.unit_fwd[u])
                got = (part, f"{label} (backward)") if part is not None else (rules.op_part(name), name)
            else:
                part = rules.op_part(name) or self._neighbours(u)
                got = (part, f"{name} (between {part.value} nodes)" if part is not None
                       and rules.op_part(name) is None else name)
        self._memo[i] = got
        return got


def _frame_part(name: str) -> Part | None:
    """A Python frame's part: a module class this table knows, or a function of the loss, the
    optimizer or the data-parallel gradient machinery."""
    cls = rules.module_class(name)
    if cls is not None:
        part = rules.module_part(cls)
        if part is None and rules.is_mlp_module(cls):
            return Part.ACTIVATION
        return part
    path, _, func = name.partition("): ")
    low_path, low_func = path.lower(), func.lower()
    if "loss" in low_func or "cross_entropy" in low_func:
        return Part.LOSS
    if "/optimizer/" in low_path or "torch/optim/" in low_path:
        return Part.OPTIMIZER
    # the data-parallel gradient machinery (Megatron's hooks, finalize_model_grads, zero_grad_buffer),
    # not the wrapper's forward, which holds the whole model
    if ("/distributed/" in low_path or "param_and_grad_buffer" in low_path) and (
            "grad" in low_func or "hook" in low_func):
        return Part.GRAD_REDUCE
    return None


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
    for corr, i in where.items():
        part, label = att.part_of(i)
        if part is not None:
            parts[corr] = part
        labels[corr] = label
        names[corr] = att.op_name(i)
        if att.unit_of(i) >= 0:
            backward.add(corr)
    tails = _step_tails(att, launches, parts, backward)
    _charge_tails(launches, parts, labels, names, tails)
    owners = att.tree.locate([(s.tid, s.ns - _EPS_NS, k) for k, s in enumerate(syncs)])
    frames = use_frames and any(r.kind is RangeKind.FRAME and rules.module_class(r.name)
                                for r in att.r)
    return OpAttribution(Method.MODULES if frames else Method.OPS, parts, labels, names,
                         {ln.corr: ln.ns for ln in launches}, tails,
                         {k: _owner(att, i) for k, i in owners.items()}, frozenset(backward))


# The parts of forward and backward work: the first launch of one after a step mark begins the next step.
_NOT_LAYERS = (Part.OPTIMIZER, Part.GRAD_REDUCE, Part.COMM_EXPOSED, Part.PIPELINE, Part.MEMCPY)


def _step_tails(att: _Attributor, launches: Sequence[Launch], parts: dict[int, Part],
                backward: set[int]) -> tuple[tuple[float, float], ...]:
    """The optimizer phase of each step marked by ``Optimizer.step#`` on the host: from the end of the
    backward work before the mark to the first forward launch after it (Megatron-LM's gradient norm,
    clipping and master-weight copies run there, outside torch's step annotation); the window's head
    before its first forward launch is one too (the rest of the step before the window)."""
    marks = sorted((r.start_ns, r.end_ns) for r in att.r
                   if r.kind is RangeKind.ANNOTATION and rules.is_step_mark(r.name))
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
    for start, end in marks:
        j = bisect.bisect_left(unit_ends, start) - 1
        begin = unit_ends[j] if j >= 0 and unit_ends[j] > prev_end else start
        k = bisect.bisect_right(fwd, end)
        stop = fwd[k] if k < len(fwd) else float("inf")
        tails.append((begin, stop))
        prev_end = stop
    return tuple(tails)


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


def _owner(att: _Attributor, i: int) -> str:
    """The op that made a synchronisation: the outermost op around the call (``aten::item`` around
    ``aten::_local_scalar_dense``), with the innermost Python function where the trace has frames."""
    chain = att.tree.chain(i)
    ops = [att.r[j].name for j in chain if att.r[j].kind is RangeKind.OP
           and not att.r[j].name.startswith(rules.BACKWARD_UNIT)]
    frame = next((att.r[j].name for j in chain if att.r[j].kind is RangeKind.FRAME
                  and rules.module_class(att.r[j].name) is None), "")
    return " in ".join(x for x in (ops[-1] if ops else "", frame) if x)
