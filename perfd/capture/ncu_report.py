"""Nsight Compute (ncu) reports parsed into typed per-kernel rows
(perfd.analytics.breakdown.ncu_kernels.NcuKernel).

Input: what ``ncu --import R.ncu-rep --csv`` prints, either page:

- ``--page details`` (long): one row per (launch, section, metric) with the section's own labels
  ("GPU Speed Of Light Throughput" / "Compute (SM) Throughput", unit "%"), plus rule rows with no
  metric. Metrics asked for by name (``--metrics``) appear under "Command line profiler metrics"
  with their raw names.
- ``--page raw`` (wide): one row per launch, one column per collected metric by its raw name
  (``sm__throughput.avg.pct_of_peak_sustained_elapsed``), a row of units under the header. Only this
  page carries the warp-stall breakdown (``smsp__average_warps_issue_stalled_<reason>_per_issue_active
  .ratio``) and the pipe utilisations (``sm__pipe_tensor_cycles_active...``) the sections collect
  for their charts.

Each typed field is declared once in :data:`FIELDS` with every name it goes by (the details label,
the raw names) and its kind of unit; both pages of one report merge by launch ID
(:func:`parse_exports`). Launches group into kernels the way ``ncu --print-summary per-kernel`` does
(same name, grid and block): each field is the mean over the launches that have it. A field whose
inputs are missing is absent (None), never 0; a value in a unit this module does not know is absent
and said so in ``problems``. The class of a kernel is
perfd.analytics.breakdown.ncu_kernels.classify's (NVIDIA's SOLBottleneck rule).

Written by hand: NVIDIA's ``ncu_report`` Python module reads .ncu-rep files but ships only with
Nsight Compute (not on PyPI for the version used here) and would need the binary's libraries; the
CSV export is the stable, documented interface. Pure: text in, data out; no I/O.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict, TypeVar

from perfd.analytics.breakdown.ncu_kernels import NcuKernel, StallReason, classify
from perfd.analytics.ncu.launches import NcuLaunch, dim3

Kind = Literal["pct", "time", "freq", "count"]

SOL = "GPU Speed Of Light Throughput"
CLI_METRICS = "Command line profiler metrics"  # the details page's section for --metrics


class NcuParseError(ValueError):
    """The input is not an ncu CSV export (or holds no profiled kernel)."""


@dataclass(frozen=True)
class _Field:
    attr: str
    kind: Kind
    details: tuple[tuple[str, str], ...]  # (section, label) on --page details
    raw: tuple[str, ...]  # metric names on --page raw (and "Command line profiler metrics")


# Every typed field and the names it goes by. Raw names from NVIDIA's section files (SpeedOfLight,
# Occupancy, LaunchStats, WarpStateStats) as ncu 2025.3 collects them; older spellings after.
FIELDS: tuple[_Field, ...] = (
    _Field("duration_ms", "time", ((SOL, "Duration"),), ("gpu__time_duration.sum",)),
    _Field("sm_clock_hz", "freq", ((SOL, "SM Frequency"),),
           ("smsp__cycles_elapsed.avg.per_second", "sm__cycles_elapsed.avg.per_second")),
    _Field("dram_clock_hz", "freq", ((SOL, "DRAM Frequency"),), ("dram__cycles_elapsed.avg.per_second",)),
    _Field("compute_throughput", "pct", ((SOL, "Compute (SM) Throughput"),),
           ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)),
    _Field("memory_throughput", "pct", ((SOL, "Memory Throughput"),),
           ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",)),
    _Field("dram_throughput", "pct", ((SOL, "DRAM Throughput"),),
           ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",)),
    _Field("achieved_occupancy", "pct", (("Occupancy", "Achieved Occupancy"),),
           ("sm__warps_active.avg.pct_of_peak_sustained_active",)),
    _Field("theoretical_occupancy", "pct", (("Occupancy", "Theoretical Occupancy"),),
           ("sm__maximum_warps_per_active_cycle_pct",)),
    _Field("registers_per_thread", "count", (("Launch Statistics", "Registers Per Thread"),),
           ("launch__registers_per_thread",)),
    _Field("threads_per_block", "count", (("Launch Statistics", "Block Size"),), ("launch__block_size",)),
    _Field("grid_blocks", "count", (("Launch Statistics", "Grid Size"),), ("launch__grid_size",)),
    _Field("warp_cycles_per_issue", "count",
           (("Warp State Statistics", "Warp Cycles Per Issued Instruction"),),
           ("smsp__average_warp_latency_per_inst_issued.ratio",
            "smsp__average_warps_active_per_issue_active.ratio")),
    # The tensor pipes' busy share: "Tensor" in ComputeWorkloadAnalysis's pipe chart is "the logical
    # aggregation of individual tensor pipelines"; without it the busiest sub-pipe (below).
    _Field("tensor_pipe", "pct", (), ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",)),
)
# What caps a kernel's theoretical occupancy: the blocks an SM can hold by each resource (Occupancy
# section; launch__occupancy_limit_* on the raw page). The smallest names the limiter; warps and the
# SM's block slots are the hardware's own caps, registers and shared memory the kernel's choice.
OCCUPANCY_LIMITS: tuple[tuple[str, str, str], ...] = (
    ("registers", "Block Limit Registers", "launch__occupancy_limit_registers"),
    ("shared_mem", "Block Limit Shared Mem", "launch__occupancy_limit_shared_mem"),
    ("barriers", "Block Limit Barriers", "launch__occupancy_limit_barriers"),
    ("warps", "Block Limit Warps", "launch__occupancy_limit_warps"),
    ("blocks", "Block Limit SM", "launch__occupancy_limit_blocks"),
)
_HARDWARE_LIMITS = ("warps", "blocks")
_TENSOR_SUBPIPE = re.compile(r"^sm__pipe_tensor_op_\w+_cycles_active\.avg\.pct_of_peak_sustained_active$")
# Warp states per issued instruction (WarpStateStats' chart). "selected" is the warp issuing, not a
# stall; "..._not_issued" variants count the same stall again for instructions not issued.
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
NOT_A_STALL = frozenset({"selected"})
TOP_STALLS = 3

_TIME_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
            "s": 1e3, "second": 1e3}
_FREQ_HZ = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "cycle/second": 1.0, "cycle/msecond": 1e3,
            "cycle/usecond": 1e6, "cycle/nsecond": 1e9}
_PCT = {"%": 0.01}
_IDENTITY = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
             "Block Size", "Grid Size", "Device", "CC")


class NcuReportJson(TypedDict):
    """:meth:`NcuReport.to_json`."""

    kernels: list[Mapping[str, object]]  # each NcuKernel.to_json()
    launches: int
    pages: list[str]
    problems: list[str]
    truncated: bool
    sm_clock_hz: float | None


@dataclass(frozen=True)
class NcuReport:
    kernels: tuple[NcuKernel, ...]
    launches: int
    pages: tuple[str, ...]  # "details", "raw": what the input held
    problems: tuple[str, ...] = ()  # rows skipped, units not understood, a truncated end
    truncated: bool = False
    # every launch as parsed, in ID order: what matching launch by launch and regrouping read
    parsed: tuple[_Launch, ...] = field(default=(), compare=False, repr=False)

    def order(self) -> tuple[NcuLaunch, ...]:
        """The profiled launches in ID order (ncu numbers them as it profiles them)."""
        return tuple(NcuLaunch(lc.id, lc.name, dim3(lc.grid), dim3(lc.block)) for lc in self.parsed)

    def regroup(self, key: Callable[[int], K]) -> list[tuple[K, NcuKernel]]:
        """The kernels grouped by name, grid, block and ``key(launch ID)`` (the op each launch was, where
        the timeline says it), each with its key, in the order of their first launch."""
        groups: dict[tuple[str, str | None, str | None, K], list[_Launch]] = {}
        for lc in self.parsed:
            groups.setdefault((lc.name, lc.grid, lc.block, key(lc.id)), []).append(lc)
        problems: list[str] = []
        return [(k[3], _kernel(g, problems)) for k, g in groups.items()]

    @property
    def sm_clock_hz(self) -> float | None:
        """Median SM clock over the kernels that report one."""
        clocks = [k.sm_clock_hz for k in self.kernels if k.sm_clock_hz is not None]
        return statistics.median(clocks) if clocks else None

    def since(self, last_id: int) -> NcuReport:
        """The kernels of launches after ``last_id`` (a process's report holds every range so far)."""
        keep = [k for k in self.kernels if any(i > last_id for i in k.ids)]
        return NcuReport(tuple(keep), sum(k.invocations for k in keep), self.pages, self.problems,
                         self.truncated, tuple(lc for lc in self.parsed if lc.id > last_id))

    def to_json(self) -> NcuReportJson:
        return {"kernels": [k.to_json() for k in self.kernels], "launches": self.launches,
                "pages": list(self.pages), "problems": list(self.problems), "truncated": self.truncated,
                "sm_clock_hz": self.sm_clock_hz}


# --- parsing -----------------------------------------------------------------------------------
K = TypeVar("K", bound=Hashable)  # what regroup splits a kernel's launches by


@dataclass
class _Launch:
    id: int
    name: str
    grid: str | None
    block: str | None
    labelled: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # (section, label)
    raw: dict[str, tuple[str, str]] = field(default_factory=dict)  # raw name -> (unit, value)


@dataclass
class _Parsed:
    launches: dict[int, _Launch] = field(default_factory=dict)
    page_names: dict[int, str] = field(default_factory=dict)  # launch -> name, on the page being read
    pages: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    truncated: bool = False


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "")
    if not t or t.lower() in ("n/a", "na", "-"):
        return None
    try:
        v = float(t)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _header_at(lines: Sequence[str]) -> int:
    for i, line in enumerate(lines):
        s = line.lstrip("\ufeff").strip()
        if s.startswith('"ID",') or s.startswith("ID,"):
            return i
        if s and not s.startswith("=="):  # ncu's own console lines (==PROF==, ==WARNING==) may precede it
            break
    raise NcuParseError("no ncu CSV header (a first row starting with ID, Process ID, ...): not the output "
                        "of ncu --import REPORT --csv --page details|raw")


def _parse_one(text: str, into: _Parsed) -> None:
    lines = text.splitlines(keepends=True)
    start = _header_at(lines)
    truncated = bool(lines) and not lines[-1].endswith(("\n", "\r"))
    body = lines[start:-1] if truncated else lines[start:]
    try:
        rows = list(csv.reader(body))
    except csv.Error as exc:
        raise NcuParseError(f"unreadable CSV: {exc}") from None
    if not rows:
        raise NcuParseError("the input ends inside its header row")
    if truncated:
        into.truncated = True
        into.problems.append("the input ends inside a row (a truncated file?): its last row was dropped")
    into.page_names = {}
    header = [h.strip().lstrip("\ufeff") for h in rows[0]]
    col = {h: i for i, h in enumerate(header)}
    for need in ("ID", "Kernel Name"):
        if need not in col:
            raise NcuParseError(f"the CSV header has no {need!r} column: not an ncu export")
    if "Metric Name" in col and "Metric Value" in col:
        into.pages.append("details")
        _long_rows(rows[1:], col, into, start + 2)
    else:
        into.pages.append("raw")
        _wide_rows(rows[1:], header, col, into, start + 2)


def _launch(row: list[str], col: Mapping[str, int], into: _Parsed, line: int) -> _Launch | None:
    lid = _number(row[col["ID"]])
    if lid is None or lid != int(lid) or lid < 0:
        into.problems.append(f"line {line}: launch ID {row[col['ID']][:40]!r} is not a number; row skipped")
        return None
    name = row[col["Kernel Name"]].strip()

    def cell(key: str) -> str | None:
        i = col.get(key)
        if i is None or i >= len(row):
            return None
        return row[i].strip() or None

    seen = into.page_names.setdefault(int(lid), name)
    if seen != name:  # within one page a launch has one name
        into.problems.append(f"line {line}: launch {int(lid)} is named {name[:60]!r} here and "
                             f"{seen[:60]!r} before; row skipped")
        return None
    got = into.launches.get(int(lid))
    if got is None:
        got = into.launches[int(lid)] = _Launch(int(lid), name, cell("Grid Size"), cell("Block Size"))
    elif len(name) > len(got.name):  # another page's spelling of the same launch: keep the fuller one
        got.name = name
    return got


def _long_rows(rows: Iterable[list[str]], col: Mapping[str, int], into: _Parsed, first_line: int) -> None:
    need = max(col["Metric Value"], col["Kernel Name"], col["ID"]) + 1
    sec, name, unit, value = (col["Section Name"] if "Section Name" in col else None, col["Metric Name"],
                              col.get("Metric Unit"), col["Metric Value"])
    for n, row in enumerate(rows):
        line = first_line + n
        if not any(c.strip() for c in row):
            continue
        if len(row) < need:
            into.problems.append(f"line {line}: {len(row)} fields, a metric row needs {need}; row skipped")
            continue
        launch = _launch(row, col, into, line)
        label = row[name].strip()
        if launch is None or not label:  # a rule row (its text is NVIDIA's advice, not a value)
            continue
        section = row[sec].strip() if sec is not None else ""
        u = row[unit].strip() if unit is not None else ""
        launch.labelled[(section, label)] = (u, row[value])
        if section == CLI_METRICS or "__" in label:  # a metric asked for by its raw name
            launch.raw[label] = (u, row[value])


def _wide_rows(rows: list[list[str]], header: list[str], col: Mapping[str, int], into: _Parsed,
               first_line: int) -> None:
    metrics = [i for i, h in enumerate(header) if h and h not in _IDENTITY]
    units: dict[int, str] = {}
    for n, row in enumerate(rows):
        line = first_line + n
        if not any(c.strip() for c in row):
            continue
        if col["ID"] < len(row) and not row[col["ID"]].strip():  # the units row under the header
            units = {i: row[i].strip() for i in metrics if i < len(row)}
            continue
        if len(row) < len(header):
            into.problems.append(f"line {line}: {len(row)} fields where the header has {len(header)}; "
                                 "row skipped")
            continue
        launch = _launch(row, col, into, line)
        if launch is None:
            continue
        for i in metrics:
            launch.raw[header[i]] = (units.get(i, ""), row[i])


def _convert(kind: Kind, unit: str, text: str, name: str = "") -> tuple[float | None, bool]:
    """(value in base units, unit understood). A raw metric named a percentage (``..pct..``) is one
    whatever its unit cell says: a raw page exported without its units row still reads."""
    v = _number(text)
    if v is None:
        return None, True
    u = unit.strip().lower()
    if kind == "pct" and not u and "pct" in name:
        u = "%"
    scale = {"time": _TIME_MS, "freq": _FREQ_HZ, "pct": _PCT}.get(kind)
    if scale is None:
        return v, True
    if u not in scale:
        return None, False
    return v * scale[u], True


def _field_value(f: _Field, launch: _Launch, problems: list[str]) -> float | None:
    sources = [(launch.labelled.get(k), "") for k in f.details] + [(launch.raw.get(k), k) for k in f.raw]
    if f.attr == "tensor_pipe" and not any(s for s, _ in sources):
        subs = [(v, k) for k, v in launch.raw.items() if _TENSOR_SUBPIPE.match(k)]
        best = [x for x in (_convert("pct", u, t, k)[0] for (u, t), k in subs) if x is not None]
        return max(best) if best else None
    for src, raw_name in sources:
        if src is None:
            continue
        v, known = _convert(f.kind, src[0], src[1], raw_name)
        if not known:
            problems.append(f"launch {launch.id}: {f.attr} in unit {src[0]!r}, which perfd does not "
                            "convert: left absent")
            return None
        if v is not None:
            return v
    return None


def _stalls(launch: _Launch) -> dict[str, float]:
    out = {}
    for k, (_u, text) in launch.raw.items():
        m = _STALL.match(k)
        if m and not m.group(1).endswith("_not_issued"):
            v = _number(text)
            if v is not None:
                out[m.group(1)] = v
    return out


def _limiter(launch: _Launch) -> str | None:
    """The resource that caps the launch's occupancy below the hardware's own caps (registers, shared
    memory, barriers), else None (the warps or block slots of an SM cap it, or the report says nothing)."""
    limits: dict[str, float] = {}
    for name, label, raw in OCCUPANCY_LIMITS:
        src = launch.labelled.get(("Occupancy", label)) or launch.raw.get(raw)
        v = _number(src[1]) if src is not None else None
        if v is not None:
            limits[name] = v
    hw = min((limits[k] for k in _HARDWARE_LIMITS if k in limits), default=None)
    if hw is None:
        return None
    own = {k: v for k, v in limits.items() if k not in _HARDWARE_LIMITS and v < hw}
    return min(own, key=lambda k: own[k]) if own else None


def _mean(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def _kernel(launches: Sequence[_Launch], problems: list[str]) -> NcuKernel:
    values = {f.attr: _mean(_field_value(f, lc, problems) for lc in launches) for f in FIELDS}
    per_launch = [_stalls(lc) for lc in launches]
    reasons = sorted({r for s in per_launch for r in s} - NOT_A_STALL)
    cycles = {r: _mean(s.get(r) for s in per_launch) or 0.0 for r in reasons}
    total = values["warp_cycles_per_issue"]
    if total is None and per_launch and any(per_launch):
        total = _mean(sum(s.values()) for s in per_launch)
    top = sorted(cycles.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_STALLS]
    stalls = tuple(StallReason(r, c, c / total if total else None) for r, c in top if c > 0)
    first = launches[0]
    return NcuKernel(name=first.name, grid=first.grid, block=first.block, invocations=len(launches),
                     ids=tuple(lc.id for lc in launches), stalls=stalls,
                     bound=classify(values["compute_throughput"], values["memory_throughput"]),
                     occupancy_limiter=_limiter(first), **values)


def parse_exports(texts: Iterable[str]) -> NcuReport:
    """One report from its CSV exports (a details page, a raw page, or both: merged by launch ID)."""
    parsed = _Parsed()
    for text in texts:
        if not text.strip():
            raise NcuParseError("empty input")
        _parse_one(text, parsed)
    if parsed.truncated and parsed.launches:  # the last launch lost rows with the end: not a whole one
        last = max(parsed.launches)
        del parsed.launches[last]
        parsed.problems.append(f"launch {last} dropped: the input ends inside its rows")
    if not parsed.launches:
        raise NcuParseError("no profiled kernel in the input (ncu profiled nothing in the range, or the "
                            "export holds only its header)")
    groups: dict[tuple[str, str | None, str | None], list[_Launch]] = {}
    for lid in sorted(parsed.launches):
        lc = parsed.launches[lid]
        groups.setdefault((lc.name, lc.grid, lc.block), []).append(lc)
    problems = parsed.problems
    kernels = tuple(_kernel(g, problems) for g in groups.values())
    return NcuReport(kernels, len(parsed.launches), tuple(parsed.pages), tuple(dict.fromkeys(problems)),
                     parsed.truncated, tuple(parsed.launches[i] for i in sorted(parsed.launches)))


def parse_csv(text: str) -> NcuReport:
    """One CSV export (details or raw page)."""
    return parse_exports([text])
