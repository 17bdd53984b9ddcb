"""Each launch ncu profiled, matched to the timeline launch it was.

By kernel name alone a row cannot say which op launched it: on the H100 the same
``nvjet_sm90_tst_256x128`` kernel ran Megatron-LM's linear GEMMs *and* attention's Q·Kᵀ, and attention's
batched matmuls (tensor pipe ~17%, DRAM 76-83%) were weighed as "linear gemm". A timeline of the job
(a Kineto trace, each kernel charged to its op by perfd.capture.ops) knows each launch's op; ncu knows
its launches' order. So:

- the timeline's launches of a step, in launch order (correlation id), each with its budget part, its
  phase (forward, backward, other), and its layer (:func:`assign_layers`: the transformer's layers
  repeat the same launches, so a stretch of the step's forward that repeats with period P is P
  launches a layer, anchored at the norm before attention);
- the same name filter ncu ran with, applied to them (ncu's ``--kernel-name`` matches the function);
- ncu's launches of the range in ID order (``--launch-skip`` S: the range's first profiled launch is the
  step's filtered launch S) matched position by position where function, grid, block and template
  arguments agree (:func:`align`): every offset where the whole window agrees is a candidate, those at
  a step's start plus S first; where the candidates agree on a launch's part and phase, the launch is
  that op's (their layers too, or the layer is left unknown), else it is ambiguous.

What the matched launches cover (:class:`Coverage`) is said with the rows: the ops, forward or
backward, the layers; and :func:`layer_window` chooses the skip and count that cover the forward and
backward of one layer (the last: its forward and backward run back to back around the loss). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics.breakdown import kernels as kernels_mod
from perfd.analytics.breakdown.ncu_kernels import MatchKind, NcuKernel
from perfd.analytics.breakdown.ncu_rows import Coverage, JoinedKernel, MatchHow, Phase
from perfd.analytics.common import TextEnum
from perfd.analytics.ncu.join import MIN_TEMPLATE_SIMILARITY, function_name, join, template_tokens

MIN_PERIOD = 4  # launches a layer at least (norm, GEMM, attention, GEMM)
# A window with no exact match anywhere is matched where at least this share of its launches agree.
MIN_AGREEMENT = 0.8
PART_NORM, PART_ATTENTION = "norm", "attention"  # perfd.analytics.breakdown.budget.Part values


Dim3 = tuple[int, int, int]


@dataclass(frozen=True)
class TimelineLaunch:
    """One kernel launch of a timeline, in launch order (``index``)."""

    index: int
    name: str
    grid: Dim3 | None
    block: Dim3 | None
    duration_ms: float
    part: str | None  # perfd.analytics.breakdown.budget.Part value (None: no op claims it)
    phase: Phase
    op: str = ""  # the op that decided its part ("aten::bmm", "aten::masked_fill_ (backward)")
    step: int | None = None  # the trace's step it ran in (0 = before the first step the trace marks)
    microbatch: int | None = None  # the forward/backward pass of the step (1 = the first)
    layer: int | None = None  # the transformer layer (1 = the first of the stage), where it repeats


@dataclass(frozen=True)
class StepMarks(TextEnum):
    """How a timeline's steps are known: where a step starts is where the step hook opens ncu's range."""

    PROFILER = "profiler_step"  # ProfilerStep#N around each step (torch.profiler, the step hook's trace)
    OPTIMIZER = "optimizer_step"  # Optimizer.step# at each step's end: a step starts at its zeroing
    NONE = "none"


@dataclass(frozen=True)
class LaunchTimeline:
    """A timeline's launches in launch order, the stage's layers, and how its steps are known."""

    launches: tuple[TimelineLaunch, ...]
    layers_total: int | None
    steps: StepMarks


@dataclass(frozen=True)
class NcuLaunch:
    """One launch ncu profiled: its ID (ncu numbers the profiled launches in order) and identity."""

    id: int
    name: str
    grid: Dim3 | None
    block: Dim3 | None


@dataclass(frozen=True)
class Assigned:
    """What a profiled launch was, by the timeline: its part and phase (None: the candidate offsets
    disagree), its layer and micro-batch (None: they disagree or are unknown)."""

    timeline_index: int
    part: str | None
    phase: Phase | None
    layer: int | None
    microbatch: int | None
    op: str = ""


@dataclass(frozen=True)
class LaunchMatch:
    how: MatchHow
    assigned: Mapping[int, Assigned]  # ncu launch ID -> what it was
    candidates: int  # offsets the window matched at
    anchored: bool  # the offsets chosen are a step's start plus the skip
    filtered_per_step: float | None  # the timeline's launches a step that the filter lets through
    layers_total: int | None  # the stage's layers (the forward's repeats)


def dim3(text: str | None) -> Dim3 | None:
    """ncu's "(82194, 1, 1)" or a list [x, y, z] as a tuple; None when it is neither."""
    if text is None:
        return None
    nums = re.findall(r"\d+", str(text))
    return (int(nums[0]), int(nums[1]), int(nums[2])) if len(nums) == 3 else None


# --- the filter -----------------------------------------------------------------------------------
def filter_regex(kernel_filter: str | None) -> re.Pattern[str] | None:
    """ncu's --kernel-name as a Python regex over function names (None: every kernel passes; a plain
    name matches only itself). The filters perfd writes are alternations and character classes."""
    if not kernel_filter:
        return None
    if kernel_filter.startswith("regex:"):
        try:
            return re.compile(kernel_filter[len("regex:"):])
        except re.error:
            return None
    return re.compile(f"^{re.escape(kernel_filter)}$")


def passes(name: str, rx: re.Pattern[str] | None) -> bool:
    """The launch passes the filter as ncu applies it (--kernel-name-base function: the function name;
    a regex matches anywhere in it unless anchored). NCCL kernels never run under perfd's filters."""
    fn = function_name(name)
    if "nccl" in fn.lower():
        return False
    return rx is None or rx.search(fn) is not None


# --- layers ---------------------------------------------------------------------------------------
def repeating(tokens: Sequence[Hashable], min_period: int = MIN_PERIOD) -> tuple[int, int, int] | None:
    """(start, period, length) of the longest stretch of ``tokens`` that repeats with one period: for
    every i in [start, start + length - period), tokens[i] == tokens[i + period]. The smallest period
    of the longest stretch; None when nothing repeats twice."""
    n = len(tokens)
    best: tuple[int, int, int] | None = None
    for p in range(min_period, n // 2 + 1):
        run = 0
        for i in range(n - p):
            if tokens[i] == tokens[i + p]:
                run += 1
                length = run + p
                if length >= 2 * p and (best is None or length > best[2]):
                    best = (i - run + 1, p, length)
            else:
                run = 0
    return best


def _anchor(parts: Sequence[str | None], start: int, period: int, backward: bool) -> int:
    """Where a layer begins in a repeating stretch. A norm runs as one launch forward, several backward
    (input gradient, weight gradient, ...): a run of norm launches is one norm. Forward, a layer begins
    at the norm whose launches up to the next norm hold attention's (its input norm, not the one
    before its MLP); backward, right after the norm whose launches since the previous norm hold
    attention's (the input norm's backward ends the layer's backward)."""
    end = min(start + 2 * period, len(parts))
    runs: list[tuple[int, int]] = []  # [a, b) of consecutive norm launches
    for i in range(start, end):
        if parts[i] == PART_NORM:
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
    for k, (a, b) in enumerate(runs):
        if backward:
            between = parts[(runs[k - 1][1] if k else start):a]
        else:
            between = parts[b:(runs[k + 1][0] if k + 1 < len(runs) else end)]
        if PART_ATTENTION in between:
            pos = b if backward else a
            return start + (pos - start) % period
    return start


def assign_layers(launches: Sequence[TimelineLaunch]) -> tuple[list[int | None], int | None]:
    """Each launch's layer (None outside the repeating stretch of its pass), and the stage's layers:
    per micro-batch, the forward's repeating stretch counts them; the backward runs them in reverse."""
    out: list[int | None] = [None] * len(launches)
    total: int | None = None
    segments: list[tuple[Phase, list[int]]] = []
    for i, ln in enumerate(launches):
        if ln.phase is Phase.OTHER:
            continue
        key = (ln.step, ln.microbatch, ln.phase)
        if segments and (launches[segments[-1][1][-1]].step, launches[segments[-1][1][-1]].microbatch,
                         segments[-1][0]) == key:
            segments[-1][1].append(i)
        else:
            segments.append((ln.phase, [i]))
    fwd_layers: dict[tuple[int | None, int | None], int] = {}
    seen: dict[tuple[Hashable, ...], tuple[int, int, int] | None] = {}  # every micro-batch repeats the first
    for phase, idx in segments:
        tokens = tuple((function_name(launches[i].name), launches[i].grid, launches[i].part) for i in idx)
        if tokens not in seen:
            seen[tokens] = repeating(tokens)
        got = seen[tokens]
        if got is None:
            continue
        start, period, length = got
        parts = [launches[i].part for i in idx]
        back = phase is Phase.BACKWARD
        first = _anchor(parts, start, period, back)
        n = (start + length - first) // period
        if n < 2:
            continue
        mb = (launches[idx[0]].step, launches[idx[0]].microbatch)
        if not back:
            fwd_layers[mb] = n
            total = max(total or 0, n)
        layers = fwd_layers.get(mb, n) if back else n
        for k in range(n):
            for j in range(first + k * period, first + (k + 1) * period):
                out[idx[j]] = (layers - k) if back else (k + 1)
    return out, total


# --- matching ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchKey:
    fn: str
    grid: Dim3 | None
    block: Dim3 | None
    tokens: frozenset[str] = field(default_factory=frozenset)


def launch_key(name: str, grid: Dim3 | None, block: Dim3 | None) -> LaunchKey:
    return LaunchKey(function_name(name), grid, block, template_tokens(name))


def same(a: LaunchKey, b: LaunchKey) -> bool:
    """One launch seen by two tools: the same function, grid and block where both give them, and
    template arguments alike where both spell them (a FillFunctor<float> is not a FillFunctor<int>)."""
    if a.fn != b.fn:
        return False
    if a.grid is not None and b.grid is not None and a.grid != b.grid:
        return False
    if a.block is not None and b.block is not None and a.block != b.block:
        return False
    if a.tokens and b.tokens:
        return len(a.tokens & b.tokens) / len(a.tokens | b.tokens) >= MIN_TEMPLATE_SIMILARITY
    return True


def hook_starts(timeline: LaunchTimeline, rx: re.Pattern[str] | None) -> set[int]:
    """Positions, among the timeline's launches that pass the filter, where a step hook's step begins
    (hook_start in each step the trace marks): a range opened there sees them first."""
    out: set[int] = set()
    by_step: dict[int, list[int]] = {}
    for i, ln in enumerate(timeline.launches):
        if ln.step is not None:
            by_step.setdefault(ln.step, []).append(i)
    passing = [i for i, ln in enumerate(timeline.launches) if passes(ln.name, rx)]
    pos = {i: k for k, i in enumerate(passing)}
    for idx in by_step.values():
        launches = [timeline.launches[i] for i in idx]
        start = idx[hook_start(launches, timeline.steps)]
        first = next((pos[i] for i in idx if i >= start and i in pos), None)
        if first is not None:
            out.add(first)
    return out


def align(ncu: Sequence[NcuLaunch], timeline: LaunchTimeline, kernel_filter: str | None,
          skip: int = 0) -> LaunchMatch:
    """Match ncu's launches of one range (in ID order) to the timeline's launches that pass the same
    filter: see the module doc."""
    rx = filter_regex(kernel_filter)
    flt = [ln for ln in timeline.launches if passes(ln.name, rx)]
    window = sorted(ncu, key=lambda x: x.id)
    steps = {ln.step for ln in flt if ln.step is not None}
    per_step = len(flt) / len(steps) if steps else None
    total = timeline.layers_total
    if not window or len(window) > len(flt):
        return LaunchMatch(MatchHow.NONE, {}, 0, False, per_step, total)
    wk = [launch_key(x.name, x.grid, x.block) for x in window]
    tk = [launch_key(x.name, x.grid, x.block) for x in flt]
    n = len(window)
    exact: list[int] = []
    best, best_score = -1, 0
    for o in range(len(flt) - n + 1):
        score = 0
        for i in range(n):
            if same(wk[i], tk[o + i]):
                score += 1
            elif exact or (best_score and n - (i + 1 - score) < best_score):
                break  # not whole, with a whole match found; or no better than the best partial
        if score == n:
            exact.append(o)
        elif not exact and score > best_score:
            best, best_score = o, score
    how = MatchHow.EXACT if exact else (
        MatchHow.PARTIAL if best_score >= MIN_AGREEMENT * n else MatchHow.NONE)
    if how is MatchHow.NONE:
        return LaunchMatch(how, {}, 0, False, per_step, total)
    offsets = exact or [best]
    starts = hook_starts(timeline, rx)
    anchored = [o for o in offsets if o - skip in starts]
    chosen = anchored or offsets
    assigned: dict[int, Assigned] = {}
    for i, launch in enumerate(window):
        if how is MatchHow.PARTIAL and not same(wk[i], tk[chosen[0] + i]):
            continue
        got = [flt[o + i] for o in chosen]
        part = got[0].part if all(g.part == got[0].part for g in got) else None
        phase = got[0].phase if all(g.phase is got[0].phase for g in got) else None
        layer = got[0].layer if all(g.layer == got[0].layer for g in got) else None
        mb = got[0].microbatch if all(g.microbatch == got[0].microbatch for g in got) else None
        op = got[0].op if all(g.op == got[0].op for g in got) else ""
        assigned[launch.id] = Assigned(got[0].index, part, phase, layer, mb, op)
    return LaunchMatch(how, assigned, len(offsets), bool(anchored), per_step, total)


# --- rows by op ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpGroup:
    """The op a group of profiled launches of one kernel were: its part (None: an op no part claims, a
    compiled fused kernel, a cat) and phase, the layers they ran in, the op that launched most of them."""

    part: str | None
    phase: Phase | None
    layers: tuple[int, ...] = ()
    op: str = ""


OpKey = tuple[str | None, Phase | None]  # a launch's (part, phase) where the timeline decided either


def group_key(match: LaunchMatch) -> Callable[[int], OpKey | None]:
    """A launch ID's group: (part, phase) where the timeline decided either, else None."""
    def key(launch_id: int) -> OpKey | None:
        a = match.assigned.get(launch_id)
        return (a.part, a.phase) if a is not None and (a.part is not None or a.phase is not None) else None
    return key


def op_group(key: OpKey | None, ids: Sequence[int], match: LaunchMatch) -> OpGroup | None:
    """The OpGroup of a regrouped kernel (its ``key`` from group_key, its launch IDs)."""
    if key is None:
        return None
    part, phase = key
    got = [match.assigned[i] for i in ids if i in match.assigned]
    ops: dict[str, int] = {}
    for a in got:
        ops[a.op] = ops.get(a.op, 0) + 1
    layers = sorted({a.layer for a in got if a.layer is not None})
    return OpGroup(part, phase, tuple(layers), max(ops, key=lambda o: ops[o]) if ops else "")


# --- coverage ---------------------------------------------------------------------------------------
def coverage(match: LaunchMatch, launches: int) -> Coverage:
    phases: dict[str, int] = {}
    layers: dict[str, set[int]] = {}
    parts: dict[str, int] = {}
    mbs: set[int] = set()
    matched = 0
    for a in match.assigned.values():
        if a.part is None and a.phase is None:
            continue
        matched += 1
        if a.phase is not None:
            phases[a.phase.value] = phases.get(a.phase.value, 0) + 1
            if a.layer is not None:
                layers.setdefault(a.phase.value, set()).add(a.layer)
        if a.part is not None:
            parts[a.part] = parts.get(a.part, 0) + 1
        if a.microbatch is not None:
            mbs.add(a.microbatch)
    by_part = dict(sorted(parts.items(), key=lambda kv: -kv[1]))
    return Coverage(launches, matched, match.how, phases, {k: tuple(sorted(v)) for k, v in layers.items()},
                    match.layers_total, by_part, tuple(sorted(mbs)), match.filtered_per_step)


# --- choosing the window ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerWindow:
    """ncu's --launch-skip and --launch-count over a step's filtered launches that profile the forward
    and backward of one layer (the stage's last, micro-batch 1: they run back to back around the loss)."""

    skip: int
    count: int
    layer: int
    layers_total: int
    per_step: int  # the step's launches that pass the filter


# Launches of slack on each side of the window where the trace marks steps by the optimizer's step: the
# step hook opens the range at its step's start, which such a trace places only to within the zeroing's
# few launches (the coverage then names the neighbouring layer's launches too).
WINDOW_MARGIN = 2
_ZEROING = ("aten::fill_", "aten::zero_")


def hook_start(launches: Sequence[TimelineLaunch], marks: StepMarks) -> int:
    """Where the step hook's step begins among one trace step's launches: the trace's step start when
    torch.profiler marks it, else the zeroing of the gradients just before the first forward launch
    (Megatron-LM's train_step zeroes its gradient buffers first; the launches before it in the trace's
    step are the previous step's end: parameter copies, logging)."""
    if marks is StepMarks.PROFILER:
        return 0
    f = next((i for i, ln in enumerate(launches) if ln.phase is Phase.FORWARD), None)
    if f is None:
        return 0
    s = f
    while s > 0 and launches[s - 1].op.startswith(_ZEROING):
        s -= 1
    return s


def layer_window(timeline: LaunchTimeline, kernel_filter: str | None) -> LayerWindow | None:
    """The window, from the first full step the timeline holds (None: no step with a forward and a
    backward of a layer the filter lets through)."""
    rx = filter_regex(kernel_filter)
    by_step: dict[int, list[TimelineLaunch]] = {}
    for ln in timeline.launches:
        if ln.step is not None:
            by_step.setdefault(ln.step, []).append(ln)
    # a step that starts where the trace starts may be cut: the first whole one has one before it
    for step in sorted(by_step)[1:] or sorted(by_step):
        launches = by_step[step]
        launches = launches[hook_start(launches, timeline.steps):]
        flt = [ln for ln in launches if passes(ln.name, rx)]
        total = max((ln.layer for ln in flt if ln.phase is Phase.FORWARD and ln.microbatch == 1
                     and ln.layer is not None), default=None)
        if total is None:
            continue
        mine = [i for i, ln in enumerate(flt) if ln.layer == total and ln.microbatch == 1
                and ln.phase in (Phase.FORWARD, Phase.BACKWARD)]
        fwd = [i for i in mine if flt[i].phase is Phase.FORWARD]
        bwd = [i for i in mine if flt[i].phase is Phase.BACKWARD]
        if not fwd or not bwd:
            continue
        margin = WINDOW_MARGIN if timeline.steps is not StepMarks.PROFILER else 0
        skip = max(0, fwd[0] - margin)
        end = min(len(flt), bwd[-1] + 1 + margin)
        return LayerWindow(skip, end - skip, total, timeline.layers_total or total, len(flt))
    return None


def join_launches(groups: Sequence[tuple[OpGroup | None, NcuKernel]], timeline: Sequence[TimelineLaunch],
                  steps: float | None = None) -> list[JoinedKernel]:
    """Rows of kernels regrouped by the op their launches were (perfd.capture.ncu_report.NcuReport
    .regroup, each with its perfd.analytics.ncu.launches.OpGroup or None): each row with
    its part, phase, layers and op, and the time the timeline's launches of that kernel by that part
    and phase take (over ``steps``); rows of launches the timeline could not decide keep their
    category's name join (perfd.analytics.ncu.join.join). ``timeline``: its launches (TimelineLaunch)."""
    total_ms = sum(ln.duration_ms for ln in timeline) or None
    keys: dict[OpKey, list[tuple[LaunchKey, TimelineLaunch]]] = {}  # (part, phase) -> [(key, launch)]
    for ln in timeline:
        keys.setdefault((ln.part, ln.phase), []).append((launch_key(ln.name, ln.grid, ln.block), ln))
    out: list[JoinedKernel] = []
    for assigned, k in groups:
        if assigned is None:
            out.extend(join([k], [], steps))
            continue
        mine = launch_key(k.name, _dim(k.grid), _dim(k.block))
        same_op = [ln for key, ln in keys.get((assigned.part, assigned.phase), []) if same(mine, key)]
        ms = sum(ln.duration_ms for ln in same_op) if same_op else None
        name = same_op[0].name if same_op else None
        out.append(JoinedKernel(
            k, kernels_mod.category(name or k.name), MatchKind.LAUNCH, name, ms,
            ms / total_ms if ms is not None and total_ms else None, 1, steps if ms is not None else None,
            assigned.part, assigned.phase.value if assigned.phase is not None else None,
            tuple(assigned.layers), assigned.op))
    return sorted(out, key=lambda j: (-(j.captured_share or 0.0), -(j.kernel.profiled_ms or 0.0)))


def _dim(text: str | None) -> tuple[int, int, int] | None:
    return dim3(text)
