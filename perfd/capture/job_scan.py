"""The job's own facts from its trace (perfd.analytics.breakdown.job_facts: what each is and the rules that
read one name each): one pass over the host's ranges and calls, the kernels' names, and the attribution
perfd.capture.ops made of them. Pure.

Counts a step are taken between the trace's first and last step marks (perfd.capture.analysis.step_marks:
the complete steps), so that the steps the capture window cut count for nothing; with fewer than two
marks there is no step to count over and those facts are None. The host's synchronisations are the
device breakdown's idle rows (perfd.capture.sweep: each gap after a sync, its owner and phase), read per
complete step where the breakdown is made (:func:`with_syncs`).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

from perfd.analytics.breakdown import job_facts as jf
from perfd.analytics.breakdown.budget import IdleCause
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown, IdleRow
from perfd.analytics.breakdown.op_parts import BACKWARD_UNIT, is_batched_matmul, is_softmax
from perfd.analytics.breakdown.step_parts import Part
from perfd.capture.ops import HostRange, Launch, OpAttribution, RangeKind
from perfd.capture.step_marks import innermost, optimizer_marks
from perfd.capture.timeline_events import KernelEvent, MemEvent

Interval = tuple[float, float]
# The parts whose kernels are not the model's forward and backward (the compiled share is over the rest)
_NOT_LAYERS = (Part.OPTIMIZER, Part.GRAD_REDUCE, Part.COMM_EXPOSED, Part.PIPELINE, Part.MEMCPY, Part.DATA)


class _Within:
    """Whether an instant on a thread lies inside one of some ranges (unions per thread, bisected)."""

    def __init__(self, ranges: Iterable[HostRange]) -> None:
        by: dict[int, list[Interval]] = defaultdict(list)
        for r in ranges:
            by[r.tid].append((r.start_ns, r.end_ns))
        self.by: dict[int, tuple[list[float], list[float]]] = {}
        for tid, ivs in by.items():
            merged: list[Interval] = []
            for s, e in sorted(ivs):
                if merged and s <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], e))
                else:
                    merged.append((s, e))
            self.by[tid] = ([s for s, _ in merged], [e for _, e in merged])

    def has(self, tid: int, ns: float) -> bool:
        got = self.by.get(tid)
        if got is None:
            return False
        starts, ends = got
        j = bisect.bisect_right(starts, ns) - 1
        return j >= 0 and ends[j] >= ns


def _per_step(n: int, marks: Sequence[float]) -> float | None:
    return n / (len(marks) - 1) if len(marks) >= 2 else None


def _in_steps(ns: float, marks: Sequence[float]) -> bool:
    return len(marks) >= 2 and marks[0] <= ns < marks[-1]


def scan(ranges: Sequence[HostRange], launches: Sequence[Launch], kernels: Sequence[KernelEvent],
         memcpys: Sequence[MemEvent], ops: OpAttribution | None, marks: Sequence[float]) -> jf.JobFacts:
    """The job's facts from one trace (``marks``: where each step the trace marks begins on the host)."""
    host = bool(ranges)
    # a trace repeats a few hundred names over its ~100k ranges: each rule reads each name once
    by_name: dict[str, list[HostRange]] = defaultdict(list)
    for r in ranges:
        by_name[r.name].append(r)
    compiled_ranges = [r for n, rs in by_name.items() if jf.is_compiled_op(n) for r in rs]
    kernel_names = {k.name for k in kernels}
    triton = any(jf.is_compiled_kernel(n) for n in kernel_names)
    compiled = True if compiled_ranges or triton else (False if host else None)
    forward = [r for r in compiled_ranges if r.kind is RangeKind.OP and r.name.lower() == jf.COMPILED_FORWARD]
    regions = _per_step(sum(1 for r in forward if _in_steps(r.start_ns, marks)), marks) if compiled else None
    graphs = any(jf.is_graph_launch(n) for n in {ln.name for ln in launches}) if launches else None
    dp = _data_parallel(by_name, kernel_names, host)
    dp_n = _per_step(sum(1 for n, rs in by_name.items() if jf.is_dp_collective(n, dp) for r in rs
                         if r.kind is RangeKind.OP and _in_steps(r.start_ns, marks)), marks) \
        if dp in (jf.DataParallel.DDP, jf.DataParallel.FSDP) else None
    impl, cls = _optimizer(ranges, by_name)
    return jf.JobFacts(
        compiled=compiled, compiled_regions=regions,
        compiled_share=_compiled_share(kernels, launches, ops, compiled_ranges) if compiled else None,
        cuda_graphs=graphs, sdpa=_sdpa(by_name), optimizer=impl, optimizer_class=cls,
        checkpointing=_checkpointing(by_name) if host else None,
        data_parallel=dp, dp_collectives=dp_n, precision=_precision(kernels),
        micro_batches=_micro_batches(launches, ops, marks), syncs=None,
        loader=next((k for n in by_name if (k := jf.loader_kind(n)) is not None), None),
        pin_memory=_pinned(by_name, memcpys),
    )


def _compiled_share(kernels: Sequence[KernelEvent], launches: Sequence[Launch], ops: OpAttribution | None,
                    compiled_ranges: Sequence[HostRange]) -> float | None:
    """Of the kernel time of the forward and backward passes, the share compiled code launched."""
    inside = _Within(compiled_ranges)
    where = {ln.corr: ln for ln in launches}
    total = mine = 0.0
    for k in kernels:
        part = ops.parts.get(k.corr) if ops is not None and k.corr is not None else None
        if part in _NOT_LAYERS or "nccl" in k.name.lower():
            continue
        dur = max(k.end_ns - k.start_ns, 0.0)
        total += dur
        ln = where.get(k.corr) if k.corr is not None else None
        if jf.is_compiled_kernel(k.name) or (ln is not None and inside.has(ln.tid, ln.ns)):
            mine += dur
    return mine / total if total > 0 else None


def _ops(by_name: Mapping[str, Sequence[HostRange]], name: str) -> list[HostRange]:
    return [r for r in by_name[name] if r.kind is RangeKind.OP]


def _sdpa(by_name: Mapping[str, Sequence[HostRange]]) -> jf.SdpaBackend | None:
    """The backend SDPA dispatched to most often; else unfused attention where a softmax op runs between
    batched matmuls' ops; else None (no attention the ops name: Transformer Engine's, or none)."""
    seen: Counter[jf.SdpaBackend] = Counter()
    for n in by_name:
        b = jf.sdpa_backend(n)
        if b is not None:
            seen[b] += len(_ops(by_name, n))
    if +seen:
        return seen.most_common(1)[0][0]
    softmax = any(is_softmax(n) and _ops(by_name, n) for n in by_name)
    batched = any(is_batched_matmul(n) and _ops(by_name, n) for n in by_name)
    return jf.SdpaBackend.UNFUSED if softmax and batched else None


def _optimizer(ranges: Sequence[HostRange], by_name: Mapping[str, Sequence[HostRange]]
               ) -> tuple[jf.OptimizerImpl | None, str | None]:
    """The implementation of the ops inside torch.optim's step annotations (the gradient clipping's
    foreach norm runs outside them and says nothing of the step): fused, else foreach, else a loop of
    per-tensor kernels; None without a step annotation."""
    steps = [r for n, rs in by_name.items() if jf.optimizer_class(n) is not None for r in rs
             if r.kind is RangeKind.ANNOTATION]
    if not steps:
        return None, None
    # the optimizer that updates the weights, not a container stepping it (torchtitan's OptimizersContainer)
    cls = jf.optimizer_class(optimizer_marks(steps, innermost)[0].name)
    inside = _Within(steps)
    kinds = {k for n in by_name if (k := jf.optimizer_kind(n)) is not None
             and any(inside.has(r.tid, r.start_ns) for r in _ops(by_name, n))}
    for impl in (jf.OptimizerImpl.FUSED, jf.OptimizerImpl.FOREACH):
        if impl in kinds:
            return impl, cls
    ran = any(r.kind is RangeKind.OP and inside.has(r.tid, r.start_ns) for r in ranges)
    return (jf.OptimizerImpl.PER_PARAMETER if ran else None), cls


def _checkpointing(by_name: Mapping[str, Sequence[HostRange]]) -> bool | None:
    """Activation checkpointing: a checkpoint function named, or forward-only ops run under a backward
    node (the forward recomputed); False where backward nodes ran without either; None without any."""
    if any(jf.is_checkpoint(n) for n in by_name):
        return True
    units = [r for n in by_name if n.startswith(BACKWARD_UNIT) for r in _ops(by_name, n)]
    if not units:
        return None
    inside = _Within(units)
    return any(inside.has(r.tid, r.start_ns) for n in by_name if n.lower() in jf.FORWARD_ONLY
               for r in _ops(by_name, n))


def _data_parallel(by_name: Mapping[str, Sequence[HostRange]], kernel_names: Iterable[str], host: bool
                   ) -> jf.DataParallel | None:
    """The wrapper the ranges name; none where no collective ran at all (no c10d op, no NCCL kernel);
    None where collectives ran and no wrapper is named (Megatron-LM's own data parallelism, tensor
    parallelism), or without a host side."""
    wrappers = {w for n in by_name if (w := jf.wrapper(n)) is not None}
    for w in (jf.DataParallel.FSDP, jf.DataParallel.DDP):
        if w in wrappers:
            return w
    collectives = any("nccl" in n.lower() for n in kernel_names) or any(map(jf.is_collective_op, by_name))
    return jf.DataParallel.NONE if host and not collectives else None


def _precision(kernels: Sequence[KernelEvent]) -> jf.Precision | None:
    """The reduced precision most kernels that name one run in (None: none names one)."""
    seen = Counter(p for k in kernels if (p := jf.precision_of(k.name)) is not None)
    return seen.most_common(1)[0][0] if seen else None


def _micro_batches(launches: Sequence[Launch], ops: OpAttribution | None, marks: Sequence[float]
                   ) -> float | None:
    """Forward-backward passes a step: the runs of backward launches (the autograd engine's) between the
    first and last step marks, each run ended by other work (the next micro-batch's forward, the
    optimizer), over the steps. None without step marks or without a backward."""
    if ops is None or len(marks) < 2 or not ops.backward:
        return None
    seq = sorted((ln.ns, ln.corr in ops.backward) for ln in launches
                 if ln.corr in ops.labels and marks[0] <= ln.ns < marks[-1])
    runs, prev = 0, False
    for _ns, bwd in seq:
        runs += bwd and not prev
        prev = bwd
    return _per_step(runs, marks) if runs else None


def _pinned(by_name: Mapping[str, Sequence[HostRange]], memcpys: Sequence[MemEvent]) -> bool | None:
    """Batches copied from pinned memory: the loader's pin_memory ops, else the copies' own kind
    (Kineto names a host-to-device copy ``Memcpy HtoD (Pinned -> Device)``)."""
    if any(jf.is_pin_op(n) for n in by_name):
        return True
    htod = {m.name.lower() for m in memcpys if "htod" in m.name.lower()}
    if any("pageable" in n for n in htod):
        return False
    return True if any("pinned" in n for n in htod) else None


def host_syncs(rows: Sequence[IdleRow], steps: float) -> tuple[jf.HostSync, ...]:
    """The synchronisations that left the GPU idle, by owner and phase, a step (largest count first)."""
    got = [jf.HostSync(r.owner, r.phase, r.gaps / steps) for r in rows
           if r.cause is IdleCause.SYNC and r.gaps]
    return tuple(sorted(got, key=lambda s: (-s.per_step, s.owner)))


def with_syncs(d: DeviceBreakdown, facts: jf.JobFacts) -> DeviceBreakdown:
    """The device with the job's facts, its host synchronisations per complete step where the trace marks
    two steps or more (else over the span's marked steps, else None), and attention counted fused where
    SDPA ran a fused backend, whatever softmax kernels the loss ran."""
    if d.complete is not None:
        syncs: tuple[jf.HostSync, ...] | None = host_syncs(d.complete.idle, d.complete.steps)
    elif d.trace_steps:
        syncs = host_syncs(d.idle, d.trace_steps)
    else:
        syncs = None
    fused = d.attention_fused or (facts.sdpa is not None and facts.sdpa.fused
                                  and Part.ATTENTION.value in d.parts_ms)
    return dataclasses.replace(d, facts=dataclasses.replace(facts, syncs=syncs), attention_fused=fused)
