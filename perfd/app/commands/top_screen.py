"""`perfd top`'s screen (the command's parser is perfd.app.commands.top): a terminal view of a running
aggregator, over its HTTP API only (no /metrics parsing, so it shows the same whatever /metrics
exports).

Every job: iterations, age of the last step, MFU, step time after warm-up (p50/p90/max, coefficient
of variation), the bottleneck class and its open incidents. The job in focus also gets a per-rank
heat line (each rank's compute ÷ its stage median, from per-rank timers), a GPU table as dense as
nvitop's (utilisation, SM, tensor, DRAM, memory used/total, power/limit, clocks, temperature), the
processes on those GPUs (pid, user, rank, GPU memory, command), its nodes' CPU and memory, and its
open incidents (cause, kinds, ranks, iterations, time lost). A value the aggregator does not have is
"–", never 0.

The focus stays on the job it was given or first chose (the job with the newest step) until that
job is gone; in a terminal, n / Tab and p move it to the next / previous job, m / g / i sort the
jobs by MFU / goodput / open incidents, ? shows the keys, q quits (perfd.app.commands.top_jobs). `--once`
prints one screen and exits (scripts, tests), as wide as the content (never cut at 80 columns when
written to a file); otherwise the screen refreshes in place (rich.live) every --interval seconds.
Each table takes its full form where that fits the terminal whole, else its compact one (step
percentiles in one column, the GPU model in the title, short heads, no rules), so every value reads
whole at 80 columns and no row wraps at 120; a job's name too, unless it is too long for the screen:
then it gives way first, cut in its middle, and the line of the job in focus names it whole; who else
runs on a rank's CPUs is listed under its table, where a command may take the lines it needs. A job
without a GPU row says why (its agents' NVML unavailable, off, or no GPU of theirs runs the job), from
their Hellos. A stalled or ended job says so where its last step's age is, and an ended one is dim.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console, Group, RenderableType
from rich.text import Text

from perfd.analytics.breakdown.budget import StepBudget
from perfd.app.commands.top_jobs import (
    HELP_KEY,
    JobRows,
    View,
    goodput_of,
    help_panel,
    jobs_panel,
    open_incidents,
    ordered,
)
from perfd.app.commands.top_tables import NA, fit, gpu_table, host_table, num, pct, process_table
from perfd.core.model import HOOK_FRAMEWORKS
from perfd.core.typed import obj, objs
from perfd.report import budget_view, plan_view

# Heat levels for a rank's compute ratio: below 1.0 is a fast rank, 1.1 marks a straggler candidate
# (perfd.analytics.thresholds), each level ~0.05 wider.
_BLOCKS = "▁▂▃▄▅▆▇█"
# Each refresh reads every listed job's summary (one request each): beyond this many jobs only the
# newest ones are read, so a cluster-wide aggregator is not asked for hundreds of reports per refresh.
MAX_JOB_SUMMARIES = 16
# Width of `--once` output that is not a terminal (a file, a pipe): wide enough for every column and
# a whole command line (collectors/nvml keeps 200 characters of it), so nothing is cut or wrapped as
# rich does at its default 80 for a non-terminal. Tables take only the width their content needs.
FILE_WIDTH = 300
# Below this many columns the processes table takes its compact form (its command column shrinks to
# fit any width; the other tables choose their form by measuring, top_tables.fit).
NARROW_WIDTH = 120


@dataclass
class Snapshot:
    """What one refresh read from the aggregator."""

    base: str
    # The JSON objects of the aggregator's API, each read where it is shown (perfd.core.typed.obj, num)
    jobs: list[Mapping[str, object]] = field(default_factory=list)
    focus: str | None = None
    summaries: dict[str, Mapping[str, object]] = field(default_factory=dict)  # job -> its /summary
    job_errors: dict[str, str] = field(default_factory=dict)  # job -> why its summary is missing
    gpus: list[Mapping[str, object]] = field(default_factory=list)
    # The focus job's newest per-rank compute ratios and their iteration: Megatron prints an
    # iteration's line before its timers, so the latest iteration often has none yet.
    rank_ratios: tuple[int, Mapping[str, object]] | None = None
    hosts: list[Mapping[str, object]] = field(default_factory=list)
    rank_hosts: list[Mapping[str, object]] = field(default_factory=list)  # rank processes (collectors/ranks)
    # Who could report its GPUs and what their NVML said at start (None: an aggregator without it)
    gpu_sources: list[Mapping[str, object]] | None = None
    error: str | None = None
    taken_at: float = 0.0

    @property
    def summary(self) -> Mapping[str, object] | None:
        return self.summaries.get(self.focus) if self.focus else None


Getter = Callable[[str], object]  # an API path -> its JSON


def http_getter(base: str, token: str | None = None, timeout: float = 5.0) -> Getter:
    headers = {"Authorization": token} if token else {}

    def get(path: str) -> object:
        req = urllib.request.Request(base.rstrip("/") + path, headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode("utf-8"))
    return get


def _job_path(job: str, what: str) -> str:
    return f"/api/jobs/{urllib.parse.quote(job, safe='')}/{what}"


def _json_object(v: object) -> Mapping[str, object]:
    """An answer that must be a JSON object (ValueError, as for text that is not JSON)."""
    if not isinstance(v, Mapping):
        raise ValueError(f"a JSON {type(v).__name__}, not an object")
    return v


def _newest_first(jobs: Sequence[Mapping[str, object]]) -> list[str]:
    def age(j: Mapping[str, object]) -> float:
        a = j.get("last_step_age_s")
        return float(a) if isinstance(a, (int, float)) else float("inf")
    return [str(j.get("job")) for j in sorted(jobs, key=age)]


def choose_focus(names: list[str], newest: list[str], asked: str | None, previous: str | None) -> str | None:
    """The job in detail: the one asked for; else the one shown before while it still exists (the
    focus must not jump to whichever job stepped last); else the job with the newest step."""
    if asked is not None:
        return asked
    if previous in names:
        return previous
    return newest[0] if newest else None


def fetch(base: str, job: str | None, previous: str | None = None, get: Getter | None = None) -> Snapshot:
    """Read one screen's data; an unreachable aggregator gives a Snapshot with ``error`` set."""
    get = get or http_getter(base)
    snap = Snapshot(base=base, taken_at=time.time())
    try:
        snap.jobs = objs(_json_object(get("/api/jobs")).get("jobs"))
    except urllib.error.HTTPError as exc:
        snap.error = f"the aggregator at {base} answered HTTP {exc.code}" + (
            " (give --auth-token-file)" if exc.code == 401 else "")
        return snap
    except (OSError, ValueError) as exc:
        snap.error = f"cannot reach the aggregator at {base}: {exc}"
        return snap
    names = [str(j.get("job")) for j in snap.jobs]
    if job is not None and job not in names:
        snap.error = f"no job named {job!r} (jobs: {', '.join(names) or 'none'})"
        return snap
    newest = _newest_first(snap.jobs)
    snap.focus = choose_focus(names, newest, job, previous)
    wanted = newest[:MAX_JOB_SUMMARIES]
    if snap.focus is not None and snap.focus not in wanted:
        wanted.append(snap.focus)
    for name in wanted:
        try:
            snap.summaries[name] = dict(_json_object(get(_job_path(name, "summary"))))
        except urllib.error.HTTPError as exc:
            snap.job_errors[name] = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            snap.job_errors[name] = str(exc)
    for name in names:
        if name not in wanted:
            snap.job_errors[name] = f"not read: more than {MAX_JOB_SUMMARIES} jobs (--job {name})"
    if snap.focus is None:
        return snap
    if snap.focus in snap.job_errors:
        snap.error = f"{snap.focus}: {snap.job_errors[snap.focus]}"
    try:
        its = objs(_json_object(get(_job_path(snap.focus, "iterations") + "?sources=0")).get("iterations"))
        snap.rank_ratios = next(((_iteration(it.get("iteration", 0)), ratios) for it in reversed(its)
                                 if (ratios := obj(it.get("straggler_rank_compute_ratio")))), None)
    except (OSError, ValueError):
        pass  # the heat line says it has no per-rank values; the rest of the screen still shows
    try:
        got = _json_object(get(_job_path(snap.focus, "gpus")))
        snap.gpus = objs(got.get("gpus"))
        snap.hosts = objs(got.get("hosts"))
        snap.rank_hosts = objs(got.get("rank_hosts"))
        sources = got.get("gpu_sources")
        snap.gpu_sources = objs(sources) if isinstance(sources, list) else None
    except urllib.error.HTTPError as exc:
        snap.error = f"{snap.focus}: HTTP {exc.code} from the aggregator"
    except (OSError, ValueError) as exc:
        snap.error = f"{snap.focus}: {exc}"
    return snap


# --- rendering (pure: a Snapshot in, rich renderables out) ---------------------------------------

def _iteration(v: object) -> int:
    """An iteration's number (ValueError: not one)."""
    if not isinstance(v, int | float | str):
        raise ValueError(f"iteration {v!r}")
    return int(v)


def _list(v: object) -> list[object]:
    """``v`` when it is a JSON list, else an empty one."""
    return v if isinstance(v, list) else []


def per_rank_missing(job: Mapping[str, object] | None) -> str:
    """Why a job has no per-rank compute, in its framework's terms: a Megatron-LM log needs its flag,
    a step-hook job a hook on every rank, a job of one rank nothing to compare."""
    job = job or {}
    world = num(obj(job.get("layout")).get("world_size"))
    if world is not None and world <= 1:
        return "one rank: nothing to compare"
    framework = job.get("framework")
    if framework == "megatron" or not framework:
        return "needs per-rank timers: --timing-log-option all"
    if framework in HOOK_FRAMEWORKS:  # the step hook's jobs (a plain loop's, a trainer's)
        return "needs the step hook on every rank"
    return f"{framework} logs no per-rank times: the step hook on every rank gives them"


def heat_line(ratios: Mapping[str, object], iteration: int | None = None,
              why_none: str | None = None) -> Text:
    """One block per rank, higher and redder the slower the rank computes against its stage
    median; then the slowest ranks by name. ``why_none``: what to say without any (per_rank_missing)."""
    items = sorted((int(r), x) for r, v in (ratios or {}).items() if (x := num(v)) is not None)
    if not items:
        return Text("per-rank compute: " + NA + f" ({why_none or per_rank_missing(None)})")
    line = Text("ranks " if iteration is None else f"ranks (iteration {iteration}) ")
    for _rank, v in items:
        level = max(0, min(len(_BLOCKS) - 1, int((v - 0.95) / 0.05) + 1)) if v >= 0.95 else 0
        style = "green" if v < 1.05 else "yellow" if v < 1.1 else "dark_orange" if v < 1.2 else "bold red"
        line.append(_BLOCKS[level], style=style)
    slow = sorted(items, key=lambda kv: -kv[1])[:3]
    line.append("  slowest: " + ", ".join(f"r{r} {v:.2f}×" for r, v in slow))
    return line


def goodput_text(gp: Mapping[str, object] | None) -> Text:
    """Where the job's wall time went, largest first."""
    wall = None if gp is None else num(gp.get("wall_s"))
    if gp is None or wall is None:
        return Text("goodput: " + NA + " (no timed step yet)")
    parts = sorted(((k, x) for k, v in obj(gp.get("parts_s")).items() if (x := num(v))),
                   key=lambda kv: -kv[1])
    line = Text(f"goodput {pct(gp.get('ratio'))} of {wall:.0f} s: ", style="bold")
    line.append(", ".join(f"{k} {v:.0f} s" for k, v in parts if v >= 0.5 or k == "training"))
    if gp.get("restarts"):
        line.append(f"; {gp['restarts']} restart(s)")
    return line


def budget_missing(summary: Mapping[str, object]) -> str:
    """Why a job has no step budget yet: no timed step, or the timed steps lack a part the budget
    from timers needs (perfd.analytics.breakdown.budget.from_timers: a data and a communication share)."""
    s = obj(summary.get("summary"))
    meds = obj(s.get("medians"))
    if not s or num(meds.get("step_time_ms")) is None:
        return "no timed step yet"
    lacking = [what for key, what in (("data_share", "no data wait timed (StepHook.data_ready())"),
                                      ("comm_exposed_share", "no communication timed (the Flight Recorder, "
                                                             "NCCL Inspector or a capture)"))
               if num(meds.get(key)) is None]
    if lacking:
        return "; ".join(lacking) + ": a capture of the job breaks its step down"
    return "its timers do not add up to a budget: a capture of the job breaks its step down"


def budget_text(summary: Mapping[str, object]) -> Text:
    """Where one step's time goes (perfd.analytics.breakdown.budget), its largest parts first."""
    budget = obj(summary.get("summary")).get("step_budget")
    if not isinstance(budget, dict):
        return Text("step budget: " + NA + f" ({budget_missing(summary)})")
    line = Text(f"step budget {num(budget.get('step_ms')) or 0:.0f} ms: ", style="bold")
    line.append(budget_view.compact(StepBudget.from_json(budget)))  # the aggregator's JSON, read here
    line.append(f" ({budget.get('basis') or NA})", style="dim")
    return line


def plan_text(summary: Mapping[str, object]) -> Text | None:
    """The remedies' plan in one line (perfd.analytics.advice.plan): each stage's effort and combined
    gain, overlaps counted once; None where the job has none (no capture divided its step)."""
    plan = obj(summary.get("report")).get("plan")
    line = plan_view.compact(plan if isinstance(plan, Mapping) else None)
    if not line:
        return None
    out = Text("plan: ", style="bold")
    out.append(line)
    out.append(" (ms a step, each stage on top of the ones before; perfd report for its items)", style="dim")
    return out


def _span(a: object, b: object) -> str:
    return f"iteration {a}" if a == b else f"iterations {a}–{b}"


def incidents_text(incidents: object) -> Text:
    """Open incidents, each with what the aggregator says of it (cause, kinds, ranks, time lost);
    closed ones only counted."""
    if not isinstance(incidents, list):
        return Text("incidents: " + NA + " (not available from this aggregator)")
    opened = open_incidents(incidents)
    closed = len(incidents) - len(opened)
    tail = f" ({closed} closed)" if closed else ""
    if not opened:
        return Text(f"incidents: none open{tail}")
    out = Text(f"incidents: {len(opened)} open{tail}\n", style="bold")
    for inc in opened[:8]:
        cost = num(inc.get("cost_s"))
        ranks = _list(inc.get("ranks"))
        out.append(f"  • {_span(inc.get('first_iteration'), inc.get('last_iteration'))}"
                   f"{', ranks ' + ', '.join(map(str, ranks[:8])) if ranks else ''}"
                   f" [{', '.join(map(str, _list(inc.get('kinds')))) or NA}]"
                   f"{f', {cost:.1f} s lost so far' if cost is not None else ''}: "
                   f"{inc.get('cause') or NA}\n")
    if len(opened) > 8:
        out.append(f"  … and {len(opened) - 8} more\n")
    return out


def render(snap: Snapshot, keys: bool = False, width: int | None = None,
           view: View | None = None) -> RenderableType:
    """The screen; ``width`` (the terminal's columns): each table in its full form where that fits
    whole, else in its compact one (:func:`~perfd.app.commands.top_tables.fit`); None: the full forms.
    ``view``: the order of the jobs' rows and whether the keys' help is shown (top_jobs.View)."""
    view = view or View()
    when = time.strftime("%H:%M:%S", time.localtime(snap.taken_at))
    head = Text(f"perfd top — {snap.base} — {when}", style="bold")
    if keys:
        head.append(f"   {HELP_KEY}: keys, q: quit", style="dim")
    parts: list[RenderableType] = [head]
    if view.help:
        parts.append(help_panel())
    if view.sort is not None:
        parts.append(Text(view.order_text(), style="dim"))
    if snap.error:
        parts.append(Text(snap.error, style="bold red"))
    if not snap.jobs:
        if not snap.error:
            parts.append(Text("no jobs yet"))
        return Group(*parts)
    parts.append(jobs_panel(JobRows(ordered(snap.jobs, snap.summaries, view), snap.focus, snap.summaries,
                                    snap.job_errors), width))
    summary = snap.summary
    if snap.focus and summary is not None:
        latest = obj(summary.get("latest"))
        headline = obj(obj(summary.get("report")).get("summary")).get("headline")
        state = next((j.get("state") for j in snap.jobs if str(j.get("job")) == snap.focus), None)
        mark = f" [{state}]" if state in ("ended", "stalled") else ""
        parts.append(Text(f"{snap.focus} *{mark}: {headline or 'no report yet'}"))
        parts.append(goodput_text(goodput_of(summary)))
        parts.append(budget_text(summary))
        plan = plan_text(summary)
        if plan is not None:
            parts.append(plan)
        why = per_rank_missing(obj(summary.get("job")))
        if snap.rank_ratios is not None:
            parts.append(heat_line(snap.rank_ratios[1], snap.rank_ratios[0], why))
        else:
            parts.append(heat_line(obj(latest.get("straggler_rank_compute_ratio")), None, why))
        ranks = _list(summary.get("ranks"))
        parts.append(fit(width, lambda: gpu_table(snap.gpus, ranks, sources=snap.gpu_sources),
                         lambda: gpu_table(snap.gpus, ranks, narrow=True, sources=snap.gpu_sources)))
        # The command column gives way (cut with "…"), by design: the rest whole, compact when narrow.
        if snap.gpus:  # (none: the GPU panel said why)
            parts.append(process_table(snap.gpus, narrow=width is not None and width < NARROW_WIDTH))
        parts.append(host_table(snap.hosts, snap.rank_hosts, width))
        parts.append(incidents_text(summary.get("incidents")))
    return Group(*parts)


# --- the live loop ----------------------------------------------------------------------------------

class Keys:
    """Single key presses from a terminal (cbreak mode, restored on exit), read by a thread."""

    def __init__(self) -> None:
        self.pressed: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def take(self) -> list[str]:
        with self._lock:
            got, self.pressed = self.pressed, []
        return got

    @contextmanager
    def reading(self) -> Iterator[bool]:
        """Yields whether keys are read (only when stdin is a terminal)."""
        if not sys.stdin.isatty():
            yield False
            return
        import termios
        import tty

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
        thread = threading.Thread(target=self._loop, args=(fd,), daemon=True, name="perfd-top-keys")
        thread.start()
        try:
            yield True
        finally:
            self._stop.set()
            thread.join(timeout=1)
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)

    def _loop(self, fd: int) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                ch = os.read(fd, 1).decode("utf-8", "replace")
                with self._lock:
                    self.pressed.append(ch)


def step_focus(jobs: Sequence[Mapping[str, object]], focus: str | None, delta: int) -> str | None:
    names = [str(j.get("job")) for j in jobs]
    if not names:
        return focus
    i = names.index(focus) if focus in names else -delta
    return names[(i + delta) % len(names)]


WAIT_POLL_S = 0.25  # how often --wait-steps asks the aggregator


def wait_for_step(get: Getter, job: str, step: int, wait_s: float,
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                  ) -> str | None:
    """Ask ``/api/jobs`` until ``job`` has reported step ``step`` (its last iteration at or past it), for
    at most ``wait_s``: None once it has, else what was seen (for the error line)."""
    deadline = clock() + wait_s
    seen = "not listed"
    while True:
        try:
            jobs = objs(_json_object(get("/api/jobs")).get("jobs"))
            row = next((j for j in jobs if j.get("job") == job), None)
            last = row.get("last_iteration") if row is not None else None
            if isinstance(last, int) and last >= step:
                return None
            seen = f"its last step {last}" if row is not None else "not listed"
        except urllib.error.HTTPError as exc:
            seen = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            seen = f"the aggregator unreachable ({exc})"
        if clock() >= deadline:
            return f"job {job!r} did not reach step {step} within {wait_s:g} s: {seen}"
        sleep(WAIT_POLL_S)


def _console(once: bool) -> Console:
    if once and not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        return Console(width=FILE_WIDTH)
    return Console()


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print("perfd: --interval must be > 0", file=sys.stderr)
        return 2
    base = args.aggregator if "://" in args.aggregator else f"http://{args.aggregator}"
    token = None
    if getattr(args, "auth_token_file", None):  # a Namespace made by hand may lack it
        from perfd.transport.security import SecurityConfigError, TokenFile

        try:
            token = TokenFile(args.auth_token_file).header()
        except SecurityConfigError as exc:
            print(f"perfd top: {exc}", file=sys.stderr)
            return 2
    get = http_getter(base, token)
    console = _console(args.once)
    wait_steps = getattr(args, "wait_steps", None)
    if wait_steps is not None:
        if not args.once or not args.job or wait_steps < 1:
            print("perfd top: --wait-steps N (N >= 1) goes with --once and --job", file=sys.stderr)
            return 2
        late = wait_for_step(get, args.job, wait_steps, args.wait_s)
        if late is not None:
            print(f"perfd top: {late}", file=sys.stderr)
            return 1
    if args.once:
        snap = fetch(base, args.job, get=get)
        if snap.error and not snap.jobs:
            print(f"perfd: {snap.error}", file=sys.stderr)
            return 2
        console.print(render(snap, width=console.width))
        return 1 if snap.error else 0
    from rich.live import Live

    keys = Keys()
    asked = args.job
    view = View()
    try:
        with keys.reading() as reading:
            snap = fetch(base, asked, get=get)
            with Live(render(snap, reading, console.width, view), console=console, auto_refresh=False,
                      screen=False) as live:
                next_at = time.monotonic() + args.interval
                while True:
                    time.sleep(0.05)
                    pressed = keys.take()
                    if "q" in pressed:
                        return 0
                    before = view
                    for k in pressed:
                        view = view.press(k)
                    moves = sum(1 if k in ("n", "\t") else -1 if k == "p" else 0 for k in pressed)
                    if moves:  # a key moves the focus now, in the rows' order; it stays where the key put it
                        asked = step_focus(ordered(snap.jobs, snap.summaries, view), snap.focus, moves)
                    elif view != before:  # the order or the help: shown now, from what was read
                        live.update(render(snap, reading, console.width, view), refresh=True)
                        continue
                    elif time.monotonic() < next_at:
                        continue
                    snap = fetch(base, asked, snap.focus, get=get)
                    if snap.error and asked is not None and asked != args.job and snap.focus is None:
                        asked = args.job  # the job moved to went away: back to the default choice
                    live.update(render(snap, reading, console.width, view), refresh=True)
                    next_at = time.monotonic() + args.interval
    except KeyboardInterrupt:
        return 0
