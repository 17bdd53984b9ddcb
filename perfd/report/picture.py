"""The HTML report's rank × step picture and its goodput bar. Pure: JSON in, HTML/SVG text out.

The heat map puts every rank on a row, grouped by pipeline stage (the group whose median a rank's
compute is measured against; one group, the data-parallel replicas, without pipeline parallelism),
and every iteration (or bin of iterations) in a column; incidents and perfd's own captures are
marked over the columns they cover, so a slow rank shows as a band and its cause sits above it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from perfd.analytics.common import pp_stage_of_rank
from perfd.analytics.incidents.detect import CAPTURE
from perfd.analytics.run.run_summary import DisturbanceStretch, JobLayout
from perfd.analytics.steps.goodput import KIND_HELP, KINDS
from perfd.report.svg import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    SKY,
    VERMILLION,
    YELLOW,
    ColumnMark,
    _svg,
    heatmap,
)

MAX_BARS = 240  # more iterations than this are averaged into bins (breakdown and heat map)
MAX_HEATMAP_ROWS = 512  # beyond this many ranks, the heat map shows the slowest ones
INCIDENT_COLOR, CAPTURE_COLOR = VERMILLION, PURPLE
KIND_COLORS: dict[str, str] = {"training": GREEN, "incident": VERMILLION, "profiling": PURPLE,
                               "redone": ORANGE, "checkpoint": BLUE, "evaluation": SKY, "restart": "#000000",
                               "stall": YELLOW, "startup": GREY, "other": "#dddddd"}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _bins(its: Sequence[Mapping[str, Any]], limit: int) -> list[list[Mapping[str, Any]]]:
    size = max(1, -(-len(its) // limit))
    return [list(its[i:i + size]) for i in range(0, len(its), size)]


def _mean(values: Sequence[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return sum(vs) / len(vs) if vs else None


def _label(group: Sequence[Mapping[str, Any]]) -> str:
    a, b = group[0].get("iteration"), group[-1].get("iteration")
    return f"{a}" if a == b else f"{a}–{b}"


def _note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def _marks(groups: Sequence[Sequence[Mapping[str, Any]]], incidents: Sequence[Mapping[str, Any]],
           stretches: Sequence[DisturbanceStretch]) -> list[ColumnMark]:
    """Incidents and perfd's captures as column ranges of the heat map's bins."""
    spans = [(int(g[0]["iteration"]), int(g[-1]["iteration"])) for g in groups]

    def cols(first: Any, last: Any) -> tuple[int, int] | None:
        if not isinstance(first, int) or not isinstance(last, int):
            return None
        hit = [i for i, (a, b) in enumerate(spans) if a <= last and b >= first]
        return (hit[0], hit[-1]) if hit else None

    out = []
    for inc in incidents:
        c = cols(inc.get("first_iteration"), inc.get("last_iteration"))
        if c is None:
            continue
        capture = list(inc.get("kinds") or []) == [CAPTURE]  # the page's JSON: perfd's own capture
        cost = _num(inc.get("cost_s"))
        text = (f"{'perfd capture' if capture else 'incident ' + str(inc.get('id'))} "
                f"(iterations {inc.get('first_iteration')}–{inc.get('last_iteration')})"
                + (f": {cost:.1f} s lost" if cost is not None and not capture else "")
                + ("" if capture else f" — {inc.get('cause', '')}"))
        out.append(ColumnMark(c[0], c[1], CAPTURE_COLOR if capture else INCIDENT_COLOR, text))
    for st in stretches:
        c = cols(st.first_iteration, st.last_iteration)
        if c is not None:
            out.append(ColumnMark(c[0], c[1], CAPTURE_COLOR,
                                  f"perfd capture (iterations {st.first_iteration}–"
                                  f"{st.last_iteration}): left out of the steady state"))
    return out


def rank_heatmap(its: Sequence[Mapping[str, Any]], ranks: Sequence[Mapping[str, Any]] = (),
                 lay: JobLayout | None = None, stretches: Sequence[DisturbanceStretch] = (),
                 incidents: Sequence[Mapping[str, Any]] = ()) -> str:
    """Per-rank compute ÷ its group's median per iteration (from per-rank timers), or a note why not."""
    have = [it for it in its if it.get("straggler_rank_compute_ratio")]
    if not have:
        return _note("No per-rank heat map: this run has no per-rank compute times. Megatron's default "
                     "timer option (minmax) prints only the min and max across ranks; run with "
                     "--timing-log-option all (or capture the ranks) to see every rank.")
    lay = lay if lay is not None else JobLayout()
    all_ranks = sorted({int(r) for it in have for r in it["straggler_rank_compute_ratio"]})
    groups = _bins(have, MAX_BARS)
    matrix: dict[int, list[float | None]] = {r: [] for r in all_ranks}
    for g in groups:
        by_rank = [{str(k): v for k, v in it["straggler_rank_compute_ratio"].items()} for it in g]
        for r in all_ranks:
            matrix[r].append(_mean([_num(d.get(str(r))) for d in by_rank]))
    shown = all_ranks
    note = ""
    if len(all_ranks) > MAX_HEATMAP_ROWS:
        worst = sorted(all_ranks, key=lambda r: -max((v for v in matrix[r] if v is not None), default=0))
        shown = sorted(worst[:MAX_HEATMAP_ROWS])
        note = f" Showing the {MAX_HEATMAP_ROWS} slowest of {len(all_ranks)} ranks."

    def stage(r: int) -> int:
        s = pp_stage_of_rank(r, lay.world_size, lay.tp, lay.pp, lay.dp, lay.cp)
        return -1 if s is None else s

    shown = sorted(shown, key=lambda r: (stage(r), r))
    bounds: list[tuple[int, str]] = []
    pp = lay.pp or 1
    for i, r in enumerate(shown):
        if i == 0 or stage(r) != stage(shown[i - 1]):
            s = stage(r)
            bounds.append((i, f"stage {s}" if pp > 1 and s >= 0 else ("DP group" if s >= 0 else "")))
    where = {int(p["rank"]): f"{p.get('node')}/gpu{p.get('gpu')}" for p in ranks if "rank" in p}
    rows = [f"rank {r}" + (f" {where[r]}" if r in where and len(shown) <= 32 else "") for r in shown]
    dev = max((abs(v - 1) for r in shown for v in matrix[r] if v is not None), default=0.1)
    marks = _marks(groups, incidents, stretches)
    chart = heatmap(rows, [_label(g) for g in groups], [matrix[r] for r in shown],
                    title="Per-rank compute ÷ stage median", xlabel="iteration", ylabel="rank",
                    spread=min(0.5, max(0.1, dev)), vfmt=lambda v: f"{v:.2f}×", groups=bounds, marks=marks)
    return _figure(chart, "Each rank's forward+backward compute ÷ the median of its group (its pipeline "
                   "stage; the data-parallel replicas without pipeline parallelism), per iteration, ranks "
                   "grouped by stage. Red: slower than its peers (> 1.1× persistently marks a straggler); "
                   "blue: faster; grey: absent. Bars above: incidents (vermilion) and perfd's own captures "
                   "(purple), hover for what and why." + note)


def goodput_bar(gp: Mapping[str, Any] | None, width: int = 920) -> str:
    """One stacked bar of the job's wall time by kind, with a legend, or a note why not."""
    if not gp or not _num(gp.get("wall_s")):
        return _note("No goodput: no step record with a time stamp.")
    wall = float(gp["wall_s"])
    parts = [(k, float(gp["parts_s"].get(k) or 0.0)) for k in KINDS]
    left, top, pw, bh = 16, 34, width - 32, 28
    body = []
    x = float(left)
    for kind, secs in parts:
        if secs <= 0:
            continue
        w = secs / wall * pw
        body.append(f'<rect x="{x:.1f}" y="{top}" width="{max(w, 0.5):.1f}" height="{bh}" '
                    f'fill="{KIND_COLORS[kind]}"><title>{escape(kind)}: {secs:.1f} s ({secs / wall:.1%}) — '
                    f'{escape(KIND_HELP[kind])}</title></rect>')
        x += w
    lx, ly = float(left), top + bh + 22
    for kind, secs in parts:
        if secs <= 0:
            continue
        text = f"{kind} {secs:.0f} s ({secs / wall:.0%})"
        step = 16 + 6.6 * len(text)
        if lx + step > width:
            lx, ly = float(left), ly + 18
        body.append(f'<rect x="{lx:.1f}" y="{ly - 10}" width="10" height="10" fill="{KIND_COLORS[kind]}"/>'
                    f'<text x="{lx + 14:.1f}" y="{ly}" class="tick">{escape(text)}</text>')
        lx += step
    ratio = _num(gp.get("ratio"))
    body.insert(0, f'<text x="{left}" y="20" class="axis">goodput {ratio:.1%} of {wall:.0f} s wall time'
                   f'{", " + str(gp.get("restarts")) + " restart(s)" if gp.get("restarts") else ""}</text>'
                if ratio is not None else "")
    return _figure(_svg(width, int(ly + 12), body, "Where the wall time went"),
                   "The job's wall time since it started, by where it went: steady training, incidents "
                   "(their excess over the steady step), perfd's own captures, iterations redone after a "
                   "restart, checkpoint saves and evaluation (the framework's own timers), restarts, "
                   "stalls, start-up. The parts add up to the wall time; goodput is training ÷ wall.")
