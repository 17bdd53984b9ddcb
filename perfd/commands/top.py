"""`perfd top`: a terminal view of a running aggregator, over its HTTP API only (no /metrics parsing,
so it shows the same whatever /metrics exports).

Per job: iterations, age of the last step, MFU, step time (steady median, p50/p90/max of the
latest steady iterations, coefficient of variation), the bottleneck class; for the job in focus a
per-rank heat line (each rank's compute ÷ its stage median, from per-rank timers), a GPU table
(util, SM, tensor, DRAM, power, clocks, temperature) and open incidents. A value the aggregator does
not have is shown as "–", never 0. `--once` prints one screen and exits (scripts, tests); otherwise
the screen refreshes in place (rich.live) every --interval seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

NA = "–"
# Heat levels for a rank's compute ratio: below 1.0 is a fast rank, 1.1 marks a straggler candidate
# (DESIGN.md §2 "Stragglers"), each level ~0.05 wider.
_BLOCKS = "▁▂▃▄▅▆▇█"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="watch a running aggregator in the terminal (jobs, ranks, GPUs)")
    p.add_argument("--aggregator", default="http://127.0.0.1:9401", metavar="URL",
                   help="the aggregator's HTTP address")
    p.add_argument("--job", help="the job to show in detail (default: the job with the latest step)")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one screen and exit (for scripts)")
    p.add_argument("--window", type=int, default=100, metavar="N",
                   help="latest steady iterations the step-time spread is taken over")
    p.set_defaults(handler=run)


@dataclass
class Snapshot:
    """What one refresh read from the aggregator."""

    base: str
    jobs: list[dict[str, Any]] = field(default_factory=list)
    focus: str | None = None
    summary: dict[str, Any] | None = None
    iterations: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    incidents: list[dict[str, Any]] | None = None  # None: the aggregator has no incidents API
    error: str | None = None
    taken_at: float = 0.0


def _get(base: str, path: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(base.rstrip("/") + path, timeout=timeout) as r:
        return json.loads(r.read().decode("utf-8"))


def _job_path(job: str, what: str) -> str:
    return f"/api/jobs/{urllib.parse.quote(job, safe='')}/{what}"


def fetch(base: str, job: str | None) -> Snapshot:
    """Read one screen's data; an unreachable aggregator gives a Snapshot with ``error`` set."""
    snap = Snapshot(base=base, taken_at=time.time())
    try:
        snap.jobs = list(_get(base, "/api/jobs").get("jobs", []))
    except (OSError, ValueError) as exc:
        snap.error = f"cannot reach the aggregator at {base}: {exc}"
        return snap
    names = [str(j.get("job")) for j in snap.jobs]
    if job is not None and job not in names:
        snap.error = f"no job named {job!r} (jobs: {', '.join(names) or 'none'})"
        return snap
    if job is None and snap.jobs:  # the job whose last step is newest
        ages = [(j.get("last_step_age_s") if j.get("last_step_age_s") is not None else float("inf"),
                 str(j.get("job"))) for j in snap.jobs]
        job = min(ages)[1]
    snap.focus = job
    if job is None:
        return snap
    try:
        snap.summary = _get(base, _job_path(job, "summary"))
        snap.iterations = list(_get(base, _job_path(job, "iterations") + "?sources=0").get("iterations", []))
        snap.gpus = list(_get(base, _job_path(job, "gpus")).get("gpus", []))
    except urllib.error.HTTPError as exc:
        snap.error = f"{job}: HTTP {exc.code} from the aggregator"
    except (OSError, ValueError) as exc:
        snap.error = f"{job}: {exc}"
    try:
        got = _get(base, _job_path(job, "incidents"))
        snap.incidents = list(got.get("incidents", []) if isinstance(got, dict) else got)
    except urllib.error.HTTPError as exc:
        snap.incidents = [] if exc.code == 404 else None
    except (OSError, ValueError):
        snap.incidents = None
    return snap


# --- rendering (pure: a Snapshot in, rich renderables out) ---------------------------------------

def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _pct(v: Any) -> str:
    x = _num(v)
    return NA if x is None else f"{100 * x:.1f}%"


def _ms(v: Any) -> str:
    x = _num(v)
    return NA if x is None else f"{x:.0f} ms"


def step_spread(iterations: list[dict[str, Any]], window: int) -> dict[str, float] | None:
    """p50 / p90 / max step time (ms) over the latest ``window`` steady iterations (all iterations
    when none is steady yet); None without step times."""
    steady = [it for it in iterations if it.get("steady_state")] or iterations
    times = [x for it in steady[-window:] if (x := _num(it.get("step_time_ms"))) is not None]
    if not times:
        return None
    times.sort()

    def q(p: float) -> float:
        return times[min(len(times) - 1, round(p * (len(times) - 1)))]

    return {"p50": q(0.5), "p90": q(0.9), "max": times[-1], "n": float(len(times))}


def heat_line(ratios: dict[str, Any]) -> Text:
    """One block per rank, higher and redder the slower the rank computes against its stage
    median; then the slowest ranks by name."""
    if not ratios:
        return Text("per-rank compute: " + NA + " (needs per-rank timers: --timing-log-option all)")
    items = sorted(((int(r), float(v)) for r, v in ratios.items() if _num(v) is not None))
    line = Text("ranks ")
    for _rank, v in items:
        level = max(0, min(len(_BLOCKS) - 1, int((v - 0.95) / 0.05) + 1)) if v >= 0.95 else 0
        style = "green" if v < 1.05 else "yellow" if v < 1.1 else "dark_orange" if v < 1.2 else "bold red"
        line.append(_BLOCKS[level], style=style)
    slow = sorted(items, key=lambda kv: -kv[1])[:3]
    line.append("  slowest: " + ", ".join(f"r{r} {v:.2f}×" for r, v in slow))
    return line


def _jobs_table(snap: Snapshot, window: int) -> Table:
    t = Table(title="jobs", title_justify="left", expand=False)
    for col in ("job", "iter", "last step", "MFU", "step p50", "p90", "max", "cv", "bottleneck"):
        t.add_column(col, justify="left" if col in ("job", "bottleneck") else "right")
    for j in snap.jobs:
        name = str(j.get("job"))
        age = _num(j.get("last_step_age_s"))
        row = [name + (" *" if name == snap.focus else ""), str(j.get("last_iteration") or NA),
               NA if age is None else f"{age:.0f} s ago"]
        if name == snap.focus and snap.summary is not None:
            med = (snap.summary.get("summary") or {}).get("medians") or {}
            spread = step_spread(snap.iterations, window)
            cv = _num((snap.summary.get("summary") or {}).get("step_time_cv"))
            row += [_pct(med.get("mfu")),
                    _ms(spread["p50"]) if spread else NA, _ms(spread["p90"]) if spread else NA,
                    _ms(spread["max"]) if spread else NA, NA if cv is None else f"{cv:.3f}",
                    str((snap.summary.get("summary") or {}).get("bottleneck") or NA)]
        else:
            row += [NA] * 6
        t.add_row(*row)
    return t


_GPU_COLS: tuple[tuple[str, str, str], ...] = (
    # header, catalog name, format
    ("util", "perfd_gpu_utilization_ratio", "pct"),
    ("SM", "perfd_gpu_sm_util_ratio", "pct"),
    ("tensor", "perfd_gpu_tensor_util_ratio", "pct"),
    ("DRAM", "perfd_gpu_dram_bw_util_ratio", "pct"),
    ("power", "perfd_gpu_power_watts", "W"),
    ("SM clk", "perfd_gpu_sm_clock_hertz", "MHz"),
    ("mem clk", "perfd_gpu_mem_clock_hertz", "MHz"),
    ("temp", "perfd_gpu_temperature_celsius", "C"),
)


def _gpu_table(gpus: list[dict[str, Any]], ranks: list[dict[str, Any]]) -> Table:
    t = Table(title="GPUs", title_justify="left")
    for col in ("node", "gpu", "rank", "model"):
        t.add_column(col)
    for head, _, _ in _GPU_COLS:
        t.add_column(head, justify="right")
    rank_of = {(str(r.get("node")), str(r.get("gpu"))): str(r.get("rank")) for r in ranks
               if isinstance(r, dict)}
    for g in gpus:
        vals = g.get("values") or {}
        where = (str(g.get("node")), str(g.get("gpu")))
        cells = [*where, rank_of.get(where, NA),
                 str(g.get("model") or NA) + (" (replay)" if g.get("replay") else "")]
        for _, name, fmt in _GPU_COLS:
            v = _num(vals.get(name))
            if v is None:
                cells.append(NA)
            elif fmt == "pct":
                cells.append(f"{100 * v:.0f}%")
            elif fmt == "W":
                cells.append(f"{v:.0f} W")
            elif fmt == "MHz":
                cells.append(f"{v / 1e6:.0f}")
            else:
                cells.append(f"{v:.0f}°C")
        t.add_row(*cells)
    return t


def _incidents(incidents: list[dict[str, Any]] | None) -> Text:
    if incidents is None:
        return Text("incidents: " + NA + " (not available from this aggregator)")
    if not incidents:
        return Text("incidents: none open")
    out = Text(f"incidents: {len(incidents)} open\n", style="bold")
    for inc in incidents[:8]:
        desc = inc.get("summary") or inc.get("text") or inc.get("kind") or json.dumps(inc)[:100]
        out.append(f"  • {desc}\n")
    return out


def render(snap: Snapshot, window: int = 100) -> RenderableType:
    when = time.strftime("%H:%M:%S", time.localtime(snap.taken_at))
    head = Text(f"perfd top — {snap.base} — {when}", style="bold")
    parts: list[RenderableType] = [head]
    if snap.error:
        parts.append(Text(snap.error, style="bold red"))
    if not snap.jobs:
        if not snap.error:
            parts.append(Text("no jobs yet"))
        return Group(*parts)
    parts.append(_jobs_table(snap, window))
    if snap.focus and snap.summary is not None:
        latest = snap.summary.get("latest") or {}
        headline = ((snap.summary.get("report") or {}).get("summary") or {}).get("headline")
        parts.append(Text(str(headline or snap.focus)))
        parts.append(heat_line(latest.get("straggler_rank_compute_ratio") or {}))
        parts.append(_gpu_table(snap.gpus, list(snap.summary.get("ranks") or [])))
        parts.append(_incidents(snap.incidents))
    return Group(*parts)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.window <= 0:
        print("perfd: --interval and --window must be > 0", file=sys.stderr)
        return 2
    base = args.aggregator if "://" in args.aggregator else f"http://{args.aggregator}"
    console = Console()
    if args.once:
        snap = fetch(base, args.job)
        if snap.error and not snap.jobs:
            print(f"perfd: {snap.error}", file=sys.stderr)
            return 2
        console.print(render(snap, args.window))
        return 1 if snap.error else 0
    from rich.live import Live

    try:
        with Live(render(fetch(base, args.job), args.window), console=console, auto_refresh=False,
                  screen=False) as live:
            while True:
                time.sleep(args.interval)
                live.update(render(fetch(base, args.job), args.window), refresh=True)
    except KeyboardInterrupt:
        return 0
