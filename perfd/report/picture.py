"""The HTML report's rank × step picture and its goodput bar. Pure: typed values in, HTML/SVG text out.

The heat map puts every rank on a row, grouped by pipeline stage (the group whose median a rank's
compute is measured against; one group, the data-parallel replicas, without pipeline parallelism),
and every iteration (or bin of iterations) in a column; incidents and perfd's own captures are
marked over the columns they cover, so a slow rank shows as a band and its cause sits above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any, TypeVar

from perfd.analytics.advice.remedies import Framework
from perfd.analytics.common import pp_stage_of_rank
from perfd.analytics.incidents.detect import CAPTURE, Incident
from perfd.analytics.run.run_summary import DisturbanceStretch, JobLayout
from perfd.analytics.steps.goodput import KIND_HELP, KINDS, Goodput
from perfd.report.incident_text import cause_line
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
                               "redone": ORANGE, "checkpoint": BLUE, "evaluation": SKY,
                               "cadence": "#a6cee3",  # between checkpoint's and evaluation's: either
                               "restart": "#000000", "stall": YELLOW, "startup": GREY, "other": "#dddddd"}


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _finite(v: object) -> float | None:
    """A number as the API's JSON carries it: a non-finite one is absent."""
    f = _num(v)
    return f if f is not None and math.isfinite(f) else None


@dataclass(frozen=True, slots=True)
class ChartIteration:
    """What the charts read of one iteration: the fields of the same names of its analysis' result
    (perfd.analytics.run.run_analysis.IterationResult), each value as the API's row carries it (a
    non-finite number absent)."""

    iteration: int
    step_time_ms: float | None = None
    mfu: float | None = None
    data_share: float | None = None
    comm_exposed_share: float | None = None
    comm_exposed_dp_share: float | None = None
    comm_exposed_pp_share: float | None = None
    pp_bubble_analytic: float | None = None
    pp_idle_max: float | None = None
    pp_idle_min: float | None = None
    steady_state: bool = False
    straggler_rank_compute_ratio: Mapping[int, float | None] = field(default_factory=dict)

    def value(self, name: str) -> float | None:
        """One of the numeric fields, by name."""
        v = getattr(self, name)
        return v if isinstance(v, float) else None

    @classmethod
    def of(cls, row: Any) -> ChartIteration:
        """From a row with these fields (an IterationResult, or a projection of a run's table on
        CHART_FIELDS)."""
        return cls._made(row.iteration, lambda n: _finite(getattr(row, n)), bool(row.steady_state),
                         {int(r): _finite(v) for r, v in row.straggler_rank_compute_ratio.items()})

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ChartIteration | None:
        """From a row of the aggregator's /api/jobs/<job>/iterations (perfd.report.row_json);
        None for a row with no iteration number."""
        it = d.get("iteration")
        if not isinstance(it, int) or isinstance(it, bool):
            return None
        ratios = d.get("straggler_rank_compute_ratio")
        return cls._made(it, lambda n: _num(d.get(n)), bool(d.get("steady_state")),
                         {int(r): _num(v) for r, v in ratios.items() if str(r).isdigit()}
                         if isinstance(ratios, Mapping) else {})

    @classmethod
    def _made(cls, iteration: int, num: Callable[[str], float | None], steady: bool,
              ratios: Mapping[int, float | None]) -> ChartIteration:
        return cls(iteration, num("step_time_ms"), num("mfu"), num("data_share"), num("comm_exposed_share"),
                   num("comm_exposed_dp_share"), num("comm_exposed_pp_share"), num("pp_bubble_analytic"),
                   num("pp_idle_max"), num("pp_idle_min"), steady, ratios)


_FLOATS = ("step_time_ms", "mfu", "data_share", "comm_exposed_share", "comm_exposed_dp_share",
           "comm_exposed_pp_share", "pp_bubble_analytic", "pp_idle_max", "pp_idle_min")
CHART_FIELDS: tuple[str, ...] = ("iteration", *_FLOATS, "steady_state", "straggler_rank_compute_ratio")


@dataclass(frozen=True, slots=True)
class IncidentMark:
    """What the charts mark of an incident (perfd.analytics.incidents.detect.Incident) over the
    iterations it covers."""

    id: str
    first_iteration: int | None
    last_iteration: int | None
    cost_s: float | None
    cause: str
    kinds: tuple[str, ...] = ()

    @classmethod
    def of(cls, inc: Incident) -> IncidentMark:
        return cls(inc.id, inc.first_iteration, inc.last_iteration, _finite(inc.cost_s), cause_line(inc),
                   tuple(inc.kinds))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> IncidentMark:
        """From an incident of the aggregator's job summary."""
        a, b = d.get("first_iteration"), d.get("last_iteration")
        return cls(str(d.get("id")), a if isinstance(a, int) else None, b if isinstance(b, int) else None,
                   _num(d.get("cost_s")), str(d.get("cause", "")),
                   tuple(str(k) for k in d.get("kinds") or []))


Row = TypeVar("Row")


def _bins(its: Sequence[Row], limit: int) -> list[list[Row]]:
    size = max(1, -(-len(its) // limit))
    return [list(its[i:i + size]) for i in range(0, len(its), size)]


def _mean(values: Sequence[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return sum(vs) / len(vs) if vs else None


def _label(group: Sequence[ChartIteration]) -> str:
    a, b = group[0].iteration, group[-1].iteration
    return f"{a}" if a == b else f"{a}–{b}"


def _note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def _marks(groups: Sequence[Sequence[ChartIteration]], incidents: Sequence[IncidentMark],
           stretches: Sequence[DisturbanceStretch]) -> list[ColumnMark]:
    """Incidents and perfd's captures as column ranges of the heat map's bins."""
    spans = [(g[0].iteration, g[-1].iteration) for g in groups]

    def cols(first: object, last: object) -> tuple[int, int] | None:
        if not isinstance(first, int) or not isinstance(last, int):
            return None
        hit = [i for i, (a, b) in enumerate(spans) if a <= last and b >= first]
        return (hit[0], hit[-1]) if hit else None

    out = []
    for inc in incidents:
        c = cols(inc.first_iteration, inc.last_iteration)
        if c is None:
            continue
        capture = inc.kinds == (CAPTURE,)  # perfd's own capture
        cost = inc.cost_s
        text = (f"{'perfd capture' if capture else 'incident ' + inc.id} "
                f"(iterations {inc.first_iteration}–{inc.last_iteration})"
                + (f": {cost:.1f} s lost" if cost is not None and not capture else "")
                + ("" if capture else f" — {inc.cause}"))
        out.append(ColumnMark(c[0], c[1], CAPTURE_COLOR if capture else INCIDENT_COLOR, text))
    for st in stretches:
        c = cols(st.first_iteration, st.last_iteration)
        if c is not None:
            out.append(ColumnMark(c[0], c[1], CAPTURE_COLOR,
                                  f"perfd capture (iterations {st.first_iteration}–"
                                  f"{st.last_iteration}): left out of the steady state"))
    return out


# Why a run has no per-rank compute times, by where its steps come from (a job of one rank has none to
# compare, whatever its framework).
_HOOK_NO_RANKS = ("the step hook reports each rank where it runs: hook every rank (a rank without it "
                  "reports nothing)")
NO_PER_RANK: Mapping[Framework, str] = {
    Framework.MEGATRON: "Megatron's default timer option (minmax) prints only the min and max across ranks; "
                        "run with --timing-log-option all (or capture the ranks) to see every rank",
    Framework.TORCHTITAN: "torchtitan logs no per-rank times; the step hook on every rank gives them",
    **{f: _HOOK_NO_RANKS for f in Framework if f.hooked},
}


def no_heatmap_note(framework: Framework, world_size: int | None) -> str:
    """Why there is no per-rank heat map, in the job's framework's terms."""
    if world_size == 1:
        return _note("No per-rank heat map: the job runs on one rank, with no other to compare it to.")
    return _note(f"No per-rank heat map: this run has no per-rank compute times. {NO_PER_RANK[framework]}.")


def rank_heatmap(its: Sequence[ChartIteration], ranks: Sequence[Mapping[str, Any]] = (),
                 lay: JobLayout | None = None, stretches: Sequence[DisturbanceStretch] = (),
                 incidents: Sequence[IncidentMark] = (), framework: Framework = Framework.MEGATRON) -> str:
    """Per-rank compute ÷ its group's median per iteration (from per-rank timers), or a note why not
    (:func:`no_heatmap_note`). ``ranks``: the aggregator's rank placements, as its job summary serves
    them."""
    have = [it for it in its if it.straggler_rank_compute_ratio]
    lay = lay if lay is not None else JobLayout()
    if not have:
        return no_heatmap_note(framework, lay.world_size)
    all_ranks = sorted({r for it in have for r in it.straggler_rank_compute_ratio})
    groups = _bins(have, MAX_BARS)
    matrix: dict[int, list[float | None]] = {r: [] for r in all_ranks}
    for g in groups:
        for r in all_ranks:
            matrix[r].append(_mean([it.straggler_rank_compute_ratio.get(r) for it in g]))
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


def goodput_bar(gp: Goodput | None, width: int = 920) -> str:
    """One stacked bar of the job's wall time by kind, with a legend, or a note why not."""
    if gp is None or not _finite(gp.wall_s):
        return _note("No goodput: no step record with a time stamp.")
    wall = float(gp.wall_s)
    parts = [(k, _finite(gp.parts.get(k)) or 0.0) for k in KINDS]
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
    ratio = _finite(gp.ratio)
    restarts = gp.runs - 1
    body.insert(0, f'<text x="{left}" y="20" class="axis">goodput {ratio:.1%} of {wall:.0f} s wall time'
                   f'{", " + str(restarts) + " restart(s)" if restarts else ""}</text>'
                if ratio is not None else "")
    return _figure(_svg(width, int(ly + 12), body, "Where the wall time went"),
                   "The job's wall time since it started, by where it went: steady training, incidents "
                   "(their excess over the steady step), perfd's own captures, iterations redone after a "
                   "restart, checkpoint saves and evaluation (the framework's own timers), restarts, "
                   "stalls, start-up. The parts add up to the wall time; goodput is training ÷ wall.")
