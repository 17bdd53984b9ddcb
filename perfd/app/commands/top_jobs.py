"""perfd top's jobs table, the order its rows are in and the keys that change what the screen shows
(pure: JSON of the aggregator's API and the view in, rich renderables out).

Every job's row: iterations, age of the last step, MFU, goodput, step time after warm-up, the
bottleneck class and its open incidents. The table takes its full form where that fits the screen
whole, else its compact one; where even the compact one is too wide, a job's name gives way first
(cut in its middle, ``train-llama…-run3``, its start and end kept), so that every other column reads
whole. The job in focus is named whole below the table.

The rows are in the aggregator's order until a sort key is pressed: ``m`` MFU, ``g`` goodput, ``i``
open incidents, each worst first (the lowest MFU or goodput, the most incidents); the same key again
best first, a third time the aggregator's order. A job without the value sorts last either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from rich.console import RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from perfd.analytics.breakdown.advice_registry import short_name
from perfd.app.commands.top_tables import COMPACT, NA, ms, natural_width, num, pct
from perfd.core.typed import obj, objs

# The fewest characters a job's name is cut to: below it the name would say too little to tell jobs
# apart, and the other columns give way as rich makes them (the screen is narrower than ~67 columns).
MIN_NAME = 12
ELLIPSIS = "…"
FOCUS_MARK = " *"


class SortBy(Enum):
    """What the jobs' rows are sorted by; ``worst_first``: its worst value is the lowest."""

    MFU = "MFU"
    GOODPUT = "goodput"
    INCIDENTS = "open incidents"

    @property
    def lowest_is_worst(self) -> bool:
        return self is not SortBy.INCIDENTS


SORT_KEYS: dict[str, SortBy] = {"m": SortBy.MFU, "g": SortBy.GOODPUT, "i": SortBy.INCIDENTS}
HELP_KEY = "?"
# (keys, what they do), as the help lists them
HELP: tuple[tuple[str, str], ...] = (
    ("n, Tab", "the next job in detail"),
    ("p", "the previous job in detail"),
    ("m", "sort by MFU, lowest first (again: highest, then unsorted)"),
    ("g", "sort by goodput, lowest first (again: highest, then unsorted)"),
    ("i", "sort by open incidents, most first (again: fewest, then unsorted)"),
    (HELP_KEY, "show or hide these keys"),
    ("q", "quit"),
)


@dataclass(frozen=True)
class View:
    """What the keys pressed so far chose: the rows' order and whether the help is shown."""

    sort: SortBy | None = None
    best_first: bool = False
    help: bool = False

    def press(self, key: str) -> View:
        """The view after ``key``; a key that is not the view's, the same view."""
        if key == HELP_KEY:
            return replace(self, help=not self.help)
        by = SORT_KEYS.get(key)
        if by is None:
            return self
        if by is not self.sort:
            return replace(self, sort=by, best_first=False)
        if not self.best_first:
            return replace(self, best_first=True)
        return replace(self, sort=None, best_first=False)

    def order_text(self) -> str:
        if self.sort is None:
            return ""
        worst = "lowest" if self.sort.lowest_is_worst else "most"
        best = "highest" if self.sort.lowest_is_worst else "fewest"
        return f"jobs sorted by {self.sort.value}, {best if self.best_first else worst} first"


def help_panel() -> Panel:
    t = Table.grid(padding=(0, 2))
    t.add_column(no_wrap=True, style="bold")
    t.add_column()
    for keys, what in HELP:
        t.add_row(keys, what)
    return Panel(t, title="keys", title_align="left", expand=False)


def open_incidents(incidents: object) -> list[Mapping[str, object]]:
    """The incidents still open (``open: true``); a closed one is history, not a current problem."""
    return [i for i in objs(incidents) if i.get("open") is True]


def goodput_of(summary: Mapping[str, object]) -> Mapping[str, object] | None:
    """The job's goodput: the aggregator's live one (a hung job's stall included), else its analysis'."""
    gp = summary.get("goodput") or obj(summary.get("summary")).get("goodput")
    return gp if isinstance(gp, dict) else None


def sort_value(by: SortBy, summary: Mapping[str, object] | None) -> float | None:
    """A job's value for ``by`` from its /summary; None where it has none."""
    if summary is None:
        return None
    if by is SortBy.INCIDENTS:
        return float(len(open_incidents(summary.get("incidents")))) \
            if isinstance(summary.get("incidents"), list) else None
    if by is SortBy.GOODPUT:
        gp = goodput_of(summary)
        return num(gp.get("ratio")) if gp else None
    return num(obj(obj(summary.get("summary")).get("medians")).get("mfu"))


def ordered(jobs: Sequence[Mapping[str, object]], summaries: Mapping[str, Mapping[str, object]],
            view: View) -> list[Mapping[str, object]]:
    """The jobs in the view's order (the aggregator's where it sorts by nothing): a job without the
    value last, ties in the aggregator's order."""
    by = view.sort
    if by is None:
        return list(jobs)
    worst_is_low = by.lowest_is_worst
    ascending = worst_is_low != view.best_first

    def key(j: Mapping[str, object]) -> tuple[bool, float]:
        v = sort_value(by, summaries.get(str(j.get("job"))))
        return (v is None, 0.0 if v is None else v if ascending else -v)
    return sorted(jobs, key=key)


def short_job(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters: cut in its middle with "…", its start and its end
    kept (the end from a separator where one is near: ``train-llama…-run3``)."""
    if len(name) <= width:
        return name
    if width <= 1:
        return ELLIPSIS[:width]
    tail = max(1, (width - 1) // 3)
    end = name[-tail:]
    cut = next((i for i, ch in enumerate(end) if ch in "-_./:"), None)
    if cut is not None and tail - cut >= 2:  # the separator and at least one character after it
        end = end[cut:]
    return name[:width - 1 - len(end)] + ELLIPSIS + end


def _job_cells(summary: Mapping[str, object] | None, why_missing: str | None,
               narrow: bool = False) -> list[str]:
    """MFU, goodput, step p50/p90/max (after warm-up), cv, bottleneck, open incidents of one job;
    ``narrow``: the step percentiles in one cell ("p50/p90/max", ms), no cv, the class without its
    "-bound" or "-overhead" (the header, "bound by", says it)."""
    blanks = 3 if narrow else 6
    if summary is None:
        return [NA] * blanks + [why_missing or NA, NA]
    s = obj(summary.get("summary"))
    if not s:  # a serving job, or a training job before its first iteration
        kind = "serving" if summary.get("serving") else "no iteration analysed yet"
        return [NA] * blanks + [kind, str(len(open_incidents(summary.get("incidents"))))]
    dist = obj(s.get("step_time_distribution_ms"))
    cv = num(s.get("step_time_cv"))
    gp = goodput_of(summary)
    head = [pct(obj(s.get("medians")).get("mfu")), pct(gp.get("ratio") if gp else None)]
    n_open = str(len(open_incidents(summary.get("incidents"))))
    if narrow:
        steps = [num(dist.get(k)) for k in ("p50", "p90", "max")]
        cell = NA if all(v is None for v in steps) else \
            "/".join(NA if v is None else f"{v:.0f}" for v in steps)
        # "bound by" heads the column: each class's short name (compute, communication, launch, ...)
        return [*head, cell, short_name(str(s.get("bottleneck") or NA)), n_open]
    return [*head, ms(dist.get("p50")), ms(dist.get("p90")),
            ms(dist.get("max")), NA if cv is None else f"{cv:.3f}", str(s.get("bottleneck") or NA), n_open]


def _age(seconds: float) -> str:
    """A short age: 45s, 12m, 3h, 2d."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def last_step_cell(job: Mapping[str, object]) -> Text:
    """How long ago the job's last step was ("12s"), and its state when it is not running: a stalled
    job (its processes alive, no step) in bold red, an ended one dim (the aggregator's liveness)."""
    age = num(job.get("last_step_age_s"))
    state = job.get("state")
    when = NA if age is None else _age(age)
    if state == "ended":
        return Text("ended" if age is None else f"ended {when}", style="dim")
    if state == "stalled":
        return Text(f"stalled {when}", style="bold red")
    return Text(when)


@dataclass(frozen=True)
class JobRows:
    """What the jobs table shows: the jobs in their order, each one's /summary or why it is missing."""

    jobs: Sequence[Mapping[str, object]]
    focus: str | None
    summaries: Mapping[str, Mapping[str, object]]
    errors: Mapping[str, str]


def jobs_table(rows: JobRows, narrow: bool = False, name_width: int | None = None) -> Table:
    """``name_width``: the most characters a name and its focus mark take (:func:`short_job`)."""
    # what the compact form leaves out, and the mark, said where they are missing
    title = ("jobs (step ms: p50/p90/max after warm-up; iter, cv when wider; * in focus)" if narrow
             else "jobs (step times after warm-up; * the job in focus)")
    t = Table(title=title, title_justify="left", expand=False, **COMPACT if narrow else {})
    heads = (("job", "last step", "MFU", "goodput", "step ms", "bound by", "inc") if narrow else
             ("job", "iter", "last step", "MFU", "goodput", "step p50", "p90", "max", "cv", "bottleneck",
              "open inc."))
    for col in heads:
        # The cells' values are never cut: the job's name gives way first (jobs_panel), then the bottleneck.
        left = col in ("job", "bottleneck", "bound by", "last step")
        t.add_column(col, justify="left" if left else "right", no_wrap=col not in ("bottleneck", "bound by"))
    for j in rows.jobs:
        name = str(j.get("job"))
        mark = FOCUS_MARK if name == rows.focus else ""
        shown = name if name_width is None else short_job(name, max(1, name_width - len(mark)))
        it = j.get("last_iteration")
        row: list[str | Text] = [shown + mark]
        if not narrow:
            row.append(NA if it is None else str(it))
        row.append(last_step_cell(j))
        t.add_row(*row, *_job_cells(rows.summaries.get(name), rows.errors.get(name), narrow),
                  style="dim" if j.get("state") == "ended" else None)
    return t


def jobs_panel(rows: JobRows, width: int | None) -> RenderableType:
    """The full table where it fits ``width`` whole (None: no limit), else the compact one; where that
    is too wide too, its names cut (to MIN_NAME at least) by as much as it is too wide."""
    wide = jobs_table(rows)
    if width is None or natural_width(wide) <= width:
        return wide
    compact = jobs_table(rows, narrow=True)
    over = natural_width(compact) - width
    if over <= 0:
        return compact
    longest = max((len(str(j.get("job"))) + (len(FOCUS_MARK) if str(j.get("job")) == rows.focus else 0)
                   for j in rows.jobs), default=0)
    return jobs_table(rows, narrow=True, name_width=max(MIN_NAME, longest - over))
