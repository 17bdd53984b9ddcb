"""The top Nsight Compute kernels of each step-budget part as people read them, in text
(the report, under the part) and as an HTML table (beside the budget's waterfall). The rows are typed
(perfd.analytics.breakdown.kernel_rows.KernelRow, each part's ``ncu_kernels`` in the typed budget,
perfd.analytics.breakdown.job_budget.with_ncu); the English is
written here, from their values. A figure the row does not have is left out (text) or shown as "–"
(HTML), never as 0. Pure: values in, text out.
"""

from __future__ import annotations

import textwrap
from html import escape

from perfd.analytics.advice.budget_findings import part_name
from perfd.analytics.breakdown.budget import StepBudget
from perfd.analytics.breakdown.kernel_rows import KernelRow, Reading, RowVerdict, TimeBasis
from perfd.analytics.breakdown.ncu_kernels import MatchKind
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.ncu.join import short_name
from perfd.analytics.thresholds import NCU_TENSOR_IDLE
from perfd.report.ncu_text import coverage_text

# What each verdict calls for, in a few words (the findings' recommendations say it at length).
VERDICT_TEXT: dict[RowVerdict, str] = {
    RowVerdict.FEWER_FLOPS: "only fewer FLOPs help: it runs near the compute ceiling",
    RowVerdict.SHAPE: "better shapes (sizes in multiples of the tile, a larger micro-batch): it runs far "
    "below the compute ceiling",
    RowVerdict.FUSION_ONLY: "fuse it into its neighbours: it moves DRAM near its peak, only fewer bytes help",
    RowVerdict.ISSUE_BOUND: "fuse it (fewer launches, index arithmetic done once)",
}

_READING_TEXT: dict[Reading, str] = {
    Reading.ISSUE_SLOTS: f"issue slots and integer index arithmetic, not math (tensor pipe under "
    f"{NCU_TENSOR_IDLE.value:.0%})",
    Reading.TENSOR_MATH: "matrix math on the tensor pipes",
    Reading.DRAM_BANDWIDTH: "DRAM bandwidth",
    Reading.CACHE_TRAFFIC: "L1/L2 traffic more than DRAM",
    Reading.STALLS: "its warps wait",
    Reading.OCCUPANCY: "latency-bound: its occupancy is capped",
}


def rows_of(budget: StepBudget | None) -> dict[Part, list[KernelRow]]:
    """Per part, its ncu kernel rows, as the budget's part details carry them (best first)."""
    out: dict[Part, list[KernelRow]] = {}
    for p in budget.parts if budget is not None else ():
        if p.ncu_kernels:
            out[p.part] = list(p.ncu_kernels)
    return out


def _pct(v: float) -> str:
    return f"{v:.0%}"


def time_text(r: KernelRow) -> str:
    """Its time and where the time comes from."""
    merged = f"; {r.rows} ncu rows (grid, block) of this one timeline kernel" if r.rows > 1 else ""
    if r.time_basis is TimeBasis.TIMELINE and r.step_ms is not None:
        share = (f", {r.part_share:.1%} of the part" if r.part_share is not None else
                 ", more than the part holds by op (its launches serve other parts too)" if r.spans_parts
                 else "")
        return f"{r.step_ms:.2f} ms a step{share} (timeline {r.timeline or '?'}{merged})"
    if r.time_basis is TimeBasis.TIMELINE_TOTAL:
        share = f"{r.captured_share:.1%} of the kernel time of" if r.captured_share is not None else "in"
        return f"{share} timeline {r.timeline or '?'} (its steps unknown: no time per step{merged})"
    replay = (f"{r.profiled_ms:.3f} ms" if r.profiled_ms is not None else "no duration") + \
        f" in ncu's replay of {r.invocations} launch{'es' if r.invocations != 1 else ''}"
    if r.timeline is None:
        why = "no timeline of the job to join"
    elif r.match is MatchKind.AMBIGUOUS:
        why = f"{r.candidates} kernels of timeline {r.timeline} alike, none closer"
    else:
        why = f"not among timeline {r.timeline}'s top kernels"
    return f"{replay} ({why}: ncu's own replayed duration, not a time per step)"


def op_text(r: KernelRow) -> str:
    """The op and pass its launches were, where matched launch by launch (" (aten::bmm, forward,
    layer 3)")."""
    if r.match is not MatchKind.LAUNCH:
        return ""
    bits = [b for b in (r.op, r.phase) if b]
    if r.layers:
        bits.append(f"layer{'s' if len(r.layers) > 1 else ''} {', '.join(str(x) for x in r.layers)}")
    return f" ({', '.join(bits)})" if bits else ""


def coverage_line(budget: StepBudget | None) -> str:
    """What the Nsight Compute capture on the budget profiled (its coverage, matched launch by launch):
    "" when it says nothing of it."""
    for p in budget.parts if budget is not None else ():
        for c in p.ncu or ():
            if c.coverage is not None:
                return f"Nsight Compute (capture {c.capture or '?'}): {coverage_text(c.coverage)}"
    return ""


def figures(r: KernelRow) -> list[tuple[str, float]]:
    """(label, ratio) of the figures the row has."""
    return [(label, v) for label, v in (("compute SOL", r.compute), ("memory SOL", r.memory),
                                        ("DRAM", r.dram), ("tensor pipe", r.tensor),
                                        ("occupancy", r.occupancy)) if v is not None]


def bound_text(r: KernelRow) -> str:
    """ncu's class, then perfd's reading of the figures behind it."""
    ncu = f"ncu: {r.bound.value}" if r.bound is not None else "ncu: class unknown"
    if r.reading is None:
        return ncu
    why = _READING_TEXT[r.reading]
    if r.reading is Reading.OCCUPANCY:
        cap = f" at {r.theoretical_occupancy:.1%}" if r.theoretical_occupancy is not None else ""
        by = {"shared_mem": "shared memory"}.get(r.occupancy_limiter or "", r.occupancy_limiter or "")
        why += cap + (f" by its {by}" if by else "") + ": too few warps to hide its latencies"
    if r.reading in (Reading.STALLS, Reading.OCCUPANCY) and r.top_stall:
        why += f", most on {r.top_stall}" + (f" ({r.top_stall_share:.0%} of the cycles)"
                                             if r.top_stall_share is not None else "")
    return f"{ncu}; perfd: {why}"


def text_lines(budget: StepBudget | None, part: Part, indent: str, width: int = 100) -> list[str]:
    """Per kernel row of ``part``: the kernel and its time; then its figures, what bounds it and what
    it calls for (each wrapped at ``width``)."""
    out = []
    more = indent + "    "
    for i, r in enumerate(rows_of(budget).get(part, []), 1):
        out += _wrap(f"ncu kernel {i}: {short_name(r.name)}{op_text(r)}, {time_text(r)}", indent, more, width)
        figs = ", ".join(f"{label} {_pct(v)}" for label, v in figures(r)) or "no figures"
        lead = f"; → {VERDICT_TEXT[r.verdict]}" if r.verdict is not None else ""
        out += _wrap(f"{figs}; {bound_text(r)}{lead}", indent + "  ", more, width)
    return out


def _wrap(text: str, first: str, rest: str, width: int) -> list[str]:
    return textwrap.wrap(text, width=max(width, len(rest) + 40), initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False) or [first]


_COLUMNS = ("part", "kernel", "time", "share of part", "compute SOL", "memory SOL", "DRAM", "tensor pipe",
            "occupancy", "what bounds it", "leads to")


def _cell(v: float | None, spec: str = ".0%") -> str:
    return "<td>–</td>" if v is None else f"<td>{v:{spec}}</td>"


def _time_cell(r: KernelRow) -> str:
    """The time column: the time per step from the timeline; else what there is, and why."""
    if r.time_basis is TimeBasis.TIMELINE and r.step_ms is not None:
        return f"{r.step_ms:.2f} ms a step"
    if r.time_basis is TimeBasis.TIMELINE_TOTAL:
        share = "–" if r.captured_share is None else f"{r.captured_share:.1%} of the timeline's kernel time"
        return f"{share}<br><small>the timeline's steps unknown</small>"
    replayed = f"{r.profiled_ms:.3f} ms replayed by ncu" if r.profiled_ms is not None else "–"
    why = ("no timeline to join" if r.timeline is None else "ambiguous in the timeline"
           if r.match is MatchKind.AMBIGUOUS else "not in the timeline")
    return f"{replayed}<br><small>{why}: ncu's own duration, not per step</small>"


def html_table(budget: StepBudget | None) -> str:
    """The rows as a table, each beside its part (kernel names escaped: templates hold < > &)."""
    rows = rows_of(budget)
    if not rows:
        return ""
    body = []
    for part, rs in rows.items():
        for i, r in enumerate(rs):
            head = (f'<td rowspan="{len(rs)}">{escape(part_name(part))}</td>' if i == 0 else "")
            body.append(
                f"<tr>{head}<td title=\"{escape(r.name)}\"><code>{escape(short_name(r.name))}</code></td>"
                f'<td title="{escape(time_text(r))}">{_time_cell(r)}</td>{_cell(r.part_share, ".1%")}'
                + "".join(_cell(v) for v in (r.compute, r.memory, r.dram, r.tensor, r.occupancy))
                + f"<td>{escape(bound_text(r))}</td>"
                + f"<td>{escape(VERDICT_TEXT[r.verdict]) if r.verdict is not None else ''}</td></tr>")
    head = "".join(f"<th>{c}</th>" for c in _COLUMNS)
    return ('<table class="ncu ncu-kernels"><caption>Nsight Compute: the top profiled kernels of each part '
            "(time per step from the joined timeline; a kernel it does not list shows ncu's replayed "
            f"duration)</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")

