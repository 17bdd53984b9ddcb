"""Nsight Compute rows joined to a capture's timeline: each profiled kernel with its category and its
share of the captured GPU time, and per-category summaries (the step budget reads
them: "the GEMMs reach 80% of memory SOL and 45% of compute SOL").

The join is by kernel name, and the names differ between the tools for the same kernel:

- nsys lists its short name, the bare function: ``vectorized_elementwise_kernel``;
- Kineto the GNU-demangled name: ``void at::native::vectorized_elementwise_kernel<4,
  at::native::BinaryFunctor<...>, std::array<char*, 3ul> >(int, ...)``;
- ncu's details page its own demangling, with the template's parameter names in the signature and
  EDG spellings: ``void at::vectorized_elementwise_kernel<8, at::CUDAFunctor_add<c10::BFloat16>,
  std::array<char *, 3>>(int, T2, T3)``, ``at::<unnamed>::`` for ``at::(anonymous namespace)::``,
  ``[lambda() (instance 2)]`` for ``{lambda()#2}``.

So :func:`function_name` reduces a name to its function (no return type, namespace, template
arguments or parameters: what ncu's ``--kernel-name-base function`` filters on), and where several
timeline kernels share a function (one elementwise kernel per functor and dtype) the identifiers
in their template arguments decide (:func:`template_tokens`, Jaccard similarity); a tie is
reported as ambiguous, never guessed. Pure: plain data in, typed rows out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from perfd.analytics.breakdown import kernels as kernels_mod
from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
from perfd.analytics.breakdown.ncu_kernels import KernelBound, MatchKind, NcuKernel, effective_bound
from perfd.analytics.breakdown.ncu_rows import CategorySummary, JoinedKernel

_OPEN, _CLOSE = "<([{", ">)]}"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Words that every template argument list is full of, or that the demanglers spell differently.
_NOISE = frozenset({"lambda", "operator", "const", "instance", "std", "array", "anonymous", "namespace",
                    "unnamed", "at", "native", "c10", "detail", "void", "unsigned", "ul", "u"})


# Template arguments at least half alike (Jaccard of their identifiers) name the same instantiation:
# ncu's and Kineto's spellings of one GELU kernel share every identifier, while a MulFunctor and an
# add instantiation of vectorized_elementwise_kernel share 2 of 7 (the recorded H100 names in
# tests/data/ncu).
MIN_TEMPLATE_SIMILARITY = 0.5


# kept per name (kernels.NAMES_CACHED): ~110,000 calls over a few hundred names, character by character,
# were most of the CPU of matching an ncu range to the H100 Megatron-LM trace
@functools.lru_cache(maxsize=kernels_mod.NAMES_CACHED)
def _top_level(name: str) -> tuple[str, str]:
    """(the name with every bracketed part removed, the text inside its last top-level <...>: the
    function's own template arguments, after any ``<unnamed>`` namespace ncu prints before it)."""
    out: list[str] = []
    groups: list[list[str]] = []
    depth = 0
    top = ""  # the opening character of the top-level bracket we are in
    for ch in name:
        if ch in _OPEN:
            if depth == 0:
                top = ch
                if ch == "<":
                    groups.append([])
            elif top == "<":
                groups[-1].append(ch)
            depth += 1
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)  # a stray closer ("operator>") must not go negative
            if depth > 0 and top == "<":
                groups[-1].append(ch)
        elif depth == 0:
            out.append(ch)
        elif top == "<":
            groups[-1].append(ch)
    return "".join(out), "".join(groups[-1]) if groups else ""


def function_name(name: str) -> str:
    """The kernel's function without return type, namespaces, template arguments or parameters."""
    bare, _ = _top_level(name.strip())
    words = bare.split()
    last = words[-1] if words else bare
    return last.rsplit("::", 1)[-1] or name.strip()


def template_tokens(name: str) -> frozenset[str]:
    """The identifiers in the kernel's template arguments, without the demanglers' noise words."""
    _, inner = _top_level(name.strip())
    return frozenset(t for t in _IDENT.findall(inner) if t.lower() not in _NOISE and not t.isdigit())


# Identifiers in template arguments that name plumbing, not the work: ATen's launch helpers and types.
_PLUMBING = frozenset({"gpu_kernel_impl", "gpu_kernel_impl_nocast", "gpu_kernel", "launch_kernel",
                       "TensorIterator", "TensorIteratorBase", "Scalar", "PhiloxCudaState", "TensorInfo"})
_WORK = re.compile(r"(_kernel|Kernel|Functor|Impl|_op$|Op$)")


def short_name(name: str, width: int = 60) -> str:
    """A kernel's name as a person reads it: its function, and the first identifier of its template
    arguments that names the work (a functor, an inner kernel: ``elementwise_kernel<masked_fill_kernel>``,
    ``vectorized_elementwise_kernel<CUDAFunctor_add>``); at most ``width`` characters."""
    fn = function_name(name)
    _, inner = _top_level(name.strip())
    work = next((t for t in _IDENT.findall(inner)
                 if t not in _PLUMBING and t != fn and _WORK.search(t)), None)
    out = f"{fn}<{work}>" if work else fn
    return out if len(out) <= width else out[: width - 1] + "…"


@dataclass(frozen=True)
class TimelineKernel:
    """One of a captured device's top kernels (perfd.analytics.breakdown.device_breakdown.KernelStat)."""

    name: str
    total_ms: float
    share: float  # of the captured kernel time (union of kernels) on that device
    count: int = 0


def timeline_kernels(device: DeviceBreakdown) -> list[TimelineKernel]:
    """The top kernels of one device of a capture analysis, as the join reads them."""
    return [TimelineKernel(k.name, k.total_ms, k.share, k.count) for k in device.top_kernels]


def match_kernel(name: str, timeline: Sequence[TimelineKernel]
                 ) -> tuple[MatchKind, TimelineKernel | None, int]:
    """(how, the timeline kernel, candidates with the same function) for one ncu kernel name."""
    for t in timeline:
        if t.name == name:
            return MatchKind.EXACT, t, 1
    fn = function_name(name)
    same = [t for t in timeline if function_name(t.name) == fn]
    if not same:
        return MatchKind.NONE, None, 0
    mine = template_tokens(name)
    theirs = [template_tokens(t.name) for t in same]
    if not mine or not any(theirs):  # a bare function on one side (nsys short names): nothing to compare
        return (MatchKind.FUNCTION, same[0], 1) if len(same) == 1 else (MatchKind.AMBIGUOUS, None, len(same))
    scored = sorted(((_jaccard(mine, tt), i) for i, tt in enumerate(theirs)), reverse=True)
    best, i = scored[0]
    if best < MIN_TEMPLATE_SIMILARITY:  # another instantiation of the function: not in the top list
        return MatchKind.NONE, None, len(same)
    if len(scored) > 1 and scored[1][0] == best:
        return MatchKind.AMBIGUOUS, None, len(same)
    return MatchKind.TEMPLATE, same[i], len(same)


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def join(kernels: Iterable[NcuKernel], timeline: Sequence[TimelineKernel] = (),
         steps: float | None = None) -> list[JoinedKernel]:
    """Each ncu kernel with its category and, where the timeline lists it, its captured share (and,
    with the ``steps`` the timeline holds, its time per step). Ordered by captured share, then
    profiled time (the kernels that cost the job most first)."""
    out = []
    for k in kernels:
        how, t, n = match_kernel(k.name, timeline)
        cat = kernels_mod.category(t.name if t is not None else k.name)
        out.append(JoinedKernel(k, cat, how, t.name if t else None, t.total_ms if t else None,
                                t.share if t else None, n, steps if t is not None else None))
    return sorted(out, key=lambda j: (-(j.captured_share or 0.0), -(j.kernel.profiled_ms or 0.0)))


def _weighted(rows: Sequence[JoinedKernel], attr: str) -> float | None:
    num = den = 0.0
    for j in rows:
        v, w = getattr(j.kernel, attr), j.kernel.profiled_ms
        if v is not None and w:
            num, den = num + v * w, den + w
    return num / den if den else None


def summarize(joined: Sequence[JoinedKernel], categories: Mapping[str, float] | None = None
              ) -> list[CategorySummary]:
    """Per category of the profiled kernels, largest captured (else profiled) time first.
    ``categories``: the capture's category → share of its kernel time (DeviceBreakdown.categories())."""
    by: dict[tuple[str | None, str], list[JoinedKernel]] = {}
    for j in joined:
        by.setdefault((j.part, j.category), []).append(j)
    out = []
    for (part, cat), rows in by.items():
        bound_ms: dict[str, float] = {}
        stall_cycles: dict[str, float] = {}
        for j in rows:
            w = j.kernel.profiled_ms or 0.0
            b = effective_bound(j.kernel, j.category)
            if b is not None:
                bound_ms[b.value] = bound_ms.get(b.value, 0.0) + w
            for s in j.kernel.stalls:
                stall_cycles[s.reason] = stall_cycles.get(s.reason, 0.0) + s.cycles * w
        matched = {j.timeline_name: j.captured_share for j in rows
                   if j.timeline_name is not None and j.captured_share is not None}
        bound = max(bound_ms, key=lambda b: bound_ms[b]) if bound_ms else None
        out.append(CategorySummary(
            category=cat, kernels=len(rows), profiled_ms=sum(j.kernel.profiled_ms or 0.0 for j in rows),
            captured_share=(categories or {}).get(cat),
            covered_share=sum(matched.values()) if matched else None,
            compute_throughput=_weighted(rows, "compute_throughput"),
            memory_throughput=_weighted(rows, "memory_throughput"),
            dram_throughput=_weighted(rows, "dram_throughput"), tensor_pipe=_weighted(rows, "tensor_pipe"),
            achieved_occupancy=_weighted(rows, "achieved_occupancy"),
            bound=KernelBound(bound) if bound is not None else None, bound_ms=bound_ms,
            top_stall=max(stall_cycles, key=lambda s: stall_cycles[s]) if stall_cycles else None,
            part=part))
    return sorted(out, key=lambda c: (-(c.captured_share or 0.0), -c.profiled_ms))


def kernel_filter(timeline: Iterable[TimelineKernel | str], limit: int = 10) -> str | None:
    """An ncu ``--kernel-name`` value for the timeline's top kernels (their functions; NCCL kernels
    never: ncu replays a kernel alone, and a collective's peers never join the replay, so it hangs).
    None when no name qualifies. Only identifiers go in: the value is one shell word, no escaping."""
    names: list[str] = []
    for t in timeline:
        fn = function_name(t.name if isinstance(t, TimelineKernel) else t)
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", fn) and "nccl" not in fn.lower() and fn not in names:
            names.append(fn)
        if len(names) >= limit:
            break
    return f"regex:^({'|'.join(names)})$" if names else None


# Every function whose name does not begin with "nccl" (no look-ahead: the regex dialect of ncu's
# filter is not documented, character classes and alternation are in every dialect).
NO_NCCL_FILTER = "regex:^([^n]|n[^c]|nc[^c]|ncc[^l])"
