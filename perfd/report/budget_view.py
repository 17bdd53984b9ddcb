"""The step budget (perfd.analytics.breakdown.budget.StepBudget) as people read it: where one step's
time goes, part by part (each kernel charged to the op that launched it where the capture recorded the
host side), read against the time the model's FLOPs take at the GPU's peak; in text (the report,
`perfd top`) and as an inline SVG (the HTML report). Pure: values in, text out; each part's name is
perfd.analytics.advice.budget_findings.part_name.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from html import escape

from perfd.analytics.advice.budget_findings import part_name
from perfd.analytics.breakdown.budget import StepBudget
from perfd.analytics.breakdown.step_parts import Part
from perfd.report import ncu_view
from perfd.report.budget_text import part_title
from perfd.report.svg import BLUE, GREEN, GREY, ORANGE, PURPLE, SKY, VERMILLION, YELLOW, _svg

# One colour per part (Okabe-Ito, repeated with intent: the math parts blue/green, memory-bound
# kernels orange/vermillion/yellow, waits grey/purple).
PART_COLOR: dict[Part, str] = {
    Part.LINEAR: BLUE, Part.GEMM: BLUE, Part.COMPUTE: BLUE, Part.ATTENTION: VERMILLION,
    Part.ACTIVATION: "#f4a259", Part.NORM: "#c9a227", Part.LOSS: GREEN, Part.EMBEDDING: "#7fc9b3",
    Part.OPTIMIZER: YELLOW, Part.GRAD_REDUCE: "#a6761d", Part.POINTWISE: ORANGE, Part.MEMCPY: "#b07aa1",
    Part.COMM_EXPOSED: PURPLE, Part.PIPELINE: "#8c6bb1", Part.DATA: SKY, Part.IDLE_SHORT: GREY,
    Part.IDLE_SWITCH: "#bbbbbb", Part.IDLE_LONG: "#666666",
}
BAR_CHARS = 30

def _parts(budget: StepBudget | None) -> list[tuple[Part, float, float, str]]:
    # float(): the values as the budget's JSON gave them (a part built with an int prints the same)
    return [(p.part, float(p.ms), float(p.share), p.source.value) for p in (budget.parts if budget else ())]


def _names(budget: StepBudget | None) -> dict[Part, str]:
    """Each part's name for what it is in this job (budget_findings.part_title)."""
    if budget is None:
        return {}
    return {p.part: part_title(p, budget.facts) for p in budget.parts}


_STEPS_FROM = {"trace": "marked in the trace", "request": "as the capture asked",
               "span": "span ÷ steady step"}


def heading(budget: StepBudget) -> str:
    """Where the budget comes from, in one line: the capture, its steps and how they were counted, the
    captured step against the steady one (the capture's own cost), how the time was divided."""
    step, steady, its = budget.step_ms, budget.steady_step_ms, budget.iterations
    bits = [budget.basis]
    w = budget.window
    if w is not None and w.complete:
        bits.append(f"{w.marked} steps marked in the trace, per step from the {w.complete} complete between "
                    "its first and last mark")
        if w.cut:
            bits.append(window_cut_text(budget))
    elif its:
        how = _STEPS_FROM.get(budget.steps_from, "")
        bits.append(f"{its:g} step{'s' if its != 1 else ''}" + (f" ({how})" if how else ""))
    over = budget.capture_overhead_ms
    if budget.unprofiled is not None:
        bits.append(unprofiled_text(budget))
    else:
        bits.append(f"{step:.0f} ms per step" + (
            f" (steady {steady:.0f} ms: the capture added {over:+.0f} ms)" if over is not None
            and steady is not None and abs(over) > 0.5 else ""))
    if budget.attribution and "timers" not in budget.basis:
        bits.append(f"divided by {budget.attribution}")
    return "; ".join(b for b in bits if b)


def unprofiled_text(budget: StepBudget) -> str:
    """How a budget read from steps the profiler slowed was brought back to the job's unprofiled step."""
    u = budget.unprofiled
    if u is None:
        return ""
    return (f"{budget.step_ms:.0f} ms per step: the captured {u.captured_ms:.0f} ms step (the profiler added "
            f"{u.captured_ms - u.steady_ms:+.0f} ms) brought back to the job's steady {u.steady_ms:.0f} ms, "
            f"its host-side idle (the gaps after syncs, the launch gaps, the host elsewhere: "
            f"{u.host_idle_ms:.0f} ms) × {u.factor:.2f}, the GPU's time as captured"
            + (f", the data wait ({u.data_ms:.0f} ms) not scaled" if u.data_ms is not None else ""))


def window_cut_text(budget: StepBudget) -> str:
    """The parts the capture window cut, as their edges held them against complete steps."""
    w = budget.window
    if w is None or not w.cut:
        return ""
    names = _names(budget)
    return "the window cut a step's " + ", ".join(
        f"{names.get(c.part, part_name(c.part))}: {c.edge_ms:.1f} ms at its edges against "
        f"{c.expected_ms:.1f} in a complete step" for c in w.cut)


def reference(budget: StepBudget) -> str:
    """The line the parts are read against: the model's FLOPs at the peak and at the matmul ceiling."""
    ideal, ceiling, step = budget.ideal_ms, budget.ceiling_ms, budget.step_ms
    if ideal is None or step <= 0:
        return ""
    at = (f", {ceiling:.0f} ms at the measured matmul ceiling ({budget.ceiling_tflops:g} TFLOP/s)"
          if ceiling is not None else "")
    return (f"the model's FLOPs take {ideal:.0f} ms at the peak ({budget.peak_tflops:g} TFLOP/s: "
            f"{ideal / step:.1%} of this step){at}")


def text_lines(budget: StepBudget | None, width: int = 100) -> list[str]:
    """The waterfall as text lines: a part a line, its ms, share and a bar; then the step."""
    if budget is None:
        return []
    parts = _parts(budget)
    names = _names(budget)
    name_w = max((len(names[p]) for p, *_ in parts), default=10)
    bar_w = max(10, min(BAR_CHARS, width - name_w - 28))
    out = [f"  {heading(budget)}"]
    ref = reference(budget)
    if ref:
        out.append(f"  {ref}")
    cov = ncu_view.coverage_line(budget)
    if cov:
        out += textwrap.wrap(cov, width=width, initial_indent="  ", subsequent_indent="    ")
    start = 0.0
    for p, ms, share, source in parts:
        lead = round(start * bar_w)
        cells = max(1, round(share * bar_w)) if share > 0 else 0
        bar = " " * lead + "█" * cells
        out.append(f"  {names[p]:<{name_w}} {ms:8.1f} ms {share:6.1%}  {bar:<{bar_w}}  {source}")
        out += [f"  {'':<{name_w}}   ncu: {line}" for line in ncu_rows(budget).get(p, [])]
        out += ncu_view.text_lines(budget, p, f"  {'':<{name_w}}   ", width)
        start += share
    out.append(f"  {'= step':<{name_w}} {budget.step_ms:8.1f} ms")
    return out


NCU_ROWS = 3  # the Nsight Compute categories shown beside a part, most profiled time first


def ncu_rows(budget: StepBudget) -> dict[Part, list[str]]:
    """Per part, the Nsight Compute category summaries on it (BudgetPart.ncu) as lines: the kernels,
    their time-weighted compute and memory speed of light, tensor pipe and the class NVIDIA's rule
    gives most of their time."""
    out: dict[Part, list[str]] = {}
    for p in budget.parts:
        part = p.part
        rows = sorted(p.ncu or (), key=lambda r: -float(r.summary.profiled_ms))
        for row in rows[:NCU_ROWS]:
            c = row.summary
            figs = ", ".join(f"{label} {float(v):.0%}" for label, v in (
                ("compute SOL", c.compute_throughput), ("memory SOL", c.memory_throughput),
                ("tensor", c.tensor_pipe)) if v is not None)
            chosen = row.kernel_choice.text if row.kernel_choice is not None else None
            out.setdefault(part, []).append(
                f"{c.category} ({c.kernels} kernel(s)): {figs or 'no figures'}"
                + (f", mostly {c.bound.value}" if c.bound else "")
                + (f" (capture {row.capture})" if row.capture else "")
                + (f"; kernels chosen {chosen}" if chosen else ""))
    return out


def waterfall_svg(budget: StepBudget | None, width: int = 920) -> str:
    """A horizontal waterfall: each part a bar starting where the one before ended."""
    parts = _parts(budget)
    if budget is None or not parts:
        return ""
    names = _names(budget)
    row, left, right = 22, 240, 110
    height = row * (len(parts) + 1) + 30
    step = float(budget.step_ms or sum(ms for _, ms, _, _ in parts)) or 1.0
    scale = (width - left - right) / step
    body: list[str] = []
    x0 = 0.0
    for i, (p, ms, share, source) in enumerate(parts):
        y = 10 + i * row
        body.append(f'<text x="{left - 8}" y="{y + 14}" text-anchor="end">{escape(names[p])}</text>')
        body.append(f'<rect x="{left + x0 * scale:.1f}" y="{y + 3}" width="{max(ms * scale, 0.5):.1f}" '
                    f'height="{row - 6}" fill="{PART_COLOR.get(p, GREY)}"><title>{escape(names[p])}: '
                    f'{ms:.1f} ms per step ({share:.1%}; {escape(source)})</title></rect>')
        body.append(f'<text x="{left + (x0 + ms) * scale + 6:.1f}" y="{y + 14}">{ms:.0f} ms '
                    f'({share:.0%})</text>')
        x0 += ms
    y = 10 + len(parts) * row
    body.append(f'<rect x="{left}" y="{y + 3}" width="{step * scale:.1f}" height="{row - 6}" fill="#333">'
                f'<title>the step: {step:.1f} ms</title></rect>')
    body.append(f'<text x="{left - 8}" y="{y + 14}" text-anchor="end"><tspan font-weight="600">= step'
                f'</tspan></text><text x="{left + step * scale + 6:.1f}" y="{y + 14}">{step:.0f} ms</text>')
    return _svg(width, height, body, "Step budget: where one step's time goes")


def html_section(budget: StepBudget | None) -> str:
    if budget is None:
        return ""
    ref = reference(budget)
    return (f'<h2 id="budget">Step budget</h2><p class="meta">{escape(heading(budget))}</p>'
            + (f'<p class="meta">{escape(ref)}</p>' if ref else "")
            + f"<figure>{waterfall_svg(budget)}<figcaption>Where one step's time goes, each part in ms per "
            "step and share of the step, with its source. With a capture every instant of the captured span "
            "is given to one part, by the op that launched the kernel running then (attention with its "
            "matmuls, copies and dropout; the linear layers; the activation; normalisation; the loss; ...), "
            "else to communication, a pipeline wait or idle; from the timers alone the compute is not "
            "divided.</figcaption></figure>" + _ncu_html(budget) + ncu_view.html_table(budget))


def _ncu_html(budget: StepBudget) -> str:
    """The Nsight Compute rows beside the part they explain."""
    rows = ncu_rows(budget)
    if not rows:
        return ""
    body = "".join(f"<tr><td>{escape(part_name(p))}</td><td>{escape(line)}</td></tr>"
                   for p, lines in rows.items() for line in lines)
    return ('<table class="ncu"><thead><tr><th>part</th>'
            "<th>Nsight Compute (time-weighted speed of light)</th>"
            f"</tr></thead><tbody>{body}</tbody></table>")


def compact(budget: StepBudget | None, n: int = 5) -> str:
    """The largest parts in one line (`perfd top`)."""
    names = _names(budget)
    parts = sorted(_parts(budget), key=lambda x: -x[1])[:n]
    return ", ".join(f"{names[p]} {share:.0%}" for p, _ms, share, _s in parts)


def parts_of(budget: StepBudget | None) -> Sequence[tuple[Part, float, float, str]]:
    return _parts(budget)
