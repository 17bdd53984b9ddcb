"""Nsight Compute (ncu) for a running job: the chosen ranks start under ncu with
profiling off, and a capture opens one step's range through the step hook.

Facts this rests on (measured on the H100, ncu 2025.3.1: docs/design.md §3 "Nsight Compute"):

- A process under ``ncu --profile-from-start off`` pays for every kernel launch, profiled or not:
  ~80 µs a launch on the H100 (a loop of 2,000 one-element adds: 21 ms without ncu, 167-207 ms under
  it with or without a name filter, mangled names, application-only or a launch count:
  tests/gpu/ncu_launch_cost.sh, docs/evidence/ncu_h100). A step of few long kernels hardly notices
  (4 MLP blocks, 60 kernels: 47-50 ms under ncu, 49 ms without); a launch-heavy one does: the small
  Megatron-LM job of tests/gpu/ncu_megatron_rule.py stepped at 384 ms under ncu against 128 ms
  without, for the life of the process. Arm ncu on one rank, for a diagnosis, knowingly:
  ``perfd ncu-prefix`` estimates the cost from the job's latest capture (:func:`armed_cost_ms`).
  ``cudaProfilerStart``/``Stop`` (what the step hook calls) open and close the range.
- Inside it every kernel is replayed once per pass (13 passes for five sections: 60 kernels took
  36.4 s of one step). So a range needs a kernel budget and a time budget. ncu's filters are its
  command line: ``--launch-count`` (the kernel budget) and ``--kernel-name`` count over the whole
  process, so they are chosen when the rank starts (:class:`NcuOptions`), and the time budget with
  them. Once the budget is spent ncu profiles nothing more: a further range records nothing, and the
  capture says so.
- ncu locks the SM clock to base by default (1.43 GHz where the job ran at 1.98): perfd passes
  ``--clock-control none`` unless asked for ``base``; each kernel's "SM Frequency" shows which.
- ncu writes the report while it profiles (3.6 MB within the profiled step of a probe, the process
  ran on for 15 s): the agent imports a copy once its size settles.
- A profiled NCCL kernel never finishes its replays (its peers do not replay with it:
  https://github.com/NVIDIA/nccl/issues/466, https://github.com/NVIDIA/nccl/issues/536): the kernel
  filter never names one, and without a list of names it excludes them.

How a rank comes under ncu: ``perfd ncu-exec`` (what ``perfd ncu-prefix`` prints for ``torchrun
--no-python``, and what ``perfd launch --ncu`` wraps a one-process command in) reads RANK; a chosen
rank becomes ``ncu ... CMD`` (exec: same pid), any other rank the command itself (no cost at all).
Before the exec it writes ``<capture dir>/ncu/<job>/rank<R>.json`` (the options, its pid), the
report goes to ``rank<R>.ncu-rep`` beside it; the agent reads both there (:class:`NcuExecutor`).
Every ncu call is an argument list with a timeout, never a shell string.
"""

from __future__ import annotations

import enum
import glob
import json
import math
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from perfd.capture.binaries import find_binary
from perfd.capture.nsys_exec import session_name, shell_arg
from perfd.core import limits as L

if TYPE_CHECKING:  # the analytics load where a timeline is read, not where the agent or the parser starts
    from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown

# Host time a kernel launch costs a process under ncu with profiling off (measured; module doc): ~80 µs
# for one-element adds, and up to ~210 µs on a 12-layer Megatron-LM job (H100, 2026-11-25: ~6,080
# launches a step, its armed steps 1,782 ms against 528 ms unarmed, 206 µs a launch; 201 µs by the
# live analysis; docs/evidence/ncu_workflow_h100/). What a launch costs depends on its arguments.
NCU_ARMED_US_PER_LAUNCH = 80.0
NCU_ARMED_US_PER_LAUNCH_HIGH = 210.0


def armed_cost_ms(device: DeviceBreakdown, steps: float | None) -> tuple[float, float, float] | None:
    """(launches per step, extra host ms per step at the low and the high measured cost a launch) that
    arming ncu would cost a rank whose capture ``device`` held ``steps`` steps; None without the counts."""
    n = device.kernel_count
    if not n or not steps or steps <= 0:
        return None
    per_step = n / steps
    return per_step, per_step * NCU_ARMED_US_PER_LAUNCH / 1e3, per_step * NCU_ARMED_US_PER_LAUNCH_HIGH / 1e3


NCU_SUBDIR = "ncu"  # under the agent's capture directory
NCU_GLOB = "/opt/nvidia/nsight-compute/*/ncu"  # where the GPU machines here have it (not on PATH)
REPORT_SUFFIX = ".ncu-rep"
TARGET_VERSION = 1
# What perfd asks ncu for, and what perfd.capture.ncu_report reads from it: speed of light (SM, memory,
# DRAM %, duration, clocks), occupancy, registers and block size, the warp-stall breakdown (its
# chart's metrics, --page raw), the pipe utilisations with the tensor pipes (same).
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "ComputeWorkloadAnalysis")
PAGES = ("details", "raw")
ClockControl = Literal["none", "base"]
CLOCK_CONTROLS: tuple[ClockControl, ...] = ("none", "base")

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class NcuNotFoundError(RuntimeError):
    pass


class NcuError(RuntimeError):
    pass


def find_ncu() -> str:
    """The ncu binary: $PERFD_NCU, else ``ncu`` on PATH, else the newest under
    /opt/nvidia/nsight-compute/<version>/ncu."""
    newest_first = sorted(glob.glob(NCU_GLOB), key=_version_key, reverse=True)
    return find_binary("ncu", "PERFD_NCU", newest_first, "Nsight Compute", NCU_GLOB, NcuNotFoundError)


def _version_key(path: str) -> tuple[int, ...]:
    ver = Path(path).parent.name
    return tuple(int(x) for x in ver.split(".") if x.isdigit())


def range_estimate_s(launches: int) -> float:
    """Seconds a range profiling ``launches`` kernels takes: ncu's set-up of its first profile and
    each kernel's replay (perfd.core.limits, measured on the H100)."""
    return L.NCU_RANGE_SETUP_S + launches * L.NCU_REPLAY_S_PER_KERNEL


def default_time_budget_s(launches: int) -> float:
    """The time budget a range of ``launches`` kernels gets when none is given: its estimate and a
    margin, at least NCU_TIME_BUDGET_S (a window ncu-prefix chose on the timeline fits its budget)."""
    return float(max(L.NCU_TIME_BUDGET_S, math.ceil(range_estimate_s(launches) * L.NCU_BUDGET_MARGIN)))


class KernelChoice(str, enum.Enum):
    """How the kernels a rank under ncu profiles were chosen (said with every capture)."""

    TIMELINE = "timeline"  # by their time in a capture of the job (a Kineto/nsys timeline's top kernels)
    GIVEN = "given"  # a name filter the user gave
    FIRST = "first"  # no timeline: every non-NCCL kernel in launch order, the first of the step, not by time


# NcuOptions.choice_json ("from" is a keyword: the functional form)
KernelChoiceJson = TypedDict("KernelChoiceJson", {
    "how": str, "from": str | None, "text": str, "launch_skip": int, "window_layer": int | None,
    "window_layers": int | None})


@dataclass(frozen=True)
class NcuOptions:
    """What a rank under ncu may cost, fixed when it starts (ncu's filters are its command line)."""

    launch_count: int = L.NCU_LAUNCH_COUNT  # the kernel budget: kernels profiled in the process
    kernel_filter: str | None = None  # ncu --kernel-name (regex:...); None: every non-NCCL kernel
    clock_control: ClockControl = "none"
    time_budget_s: float = L.NCU_TIME_BUDGET_S  # one range: longer and the capture closes it
    kernels_from: str | None = None  # the capture whose timeline chose the filter's kernels by time
    # ncu --launch-skip: the range's filtered launches it lets pass before profiling (a window chosen on
    # the timeline to cover one layer's forward and backward: perfd.analytics.ncu.launches.layer_window)
    launch_skip: int = 0
    window_layer: int | None = None  # the layer that window covers (said with the capture), of ...
    window_layers: int | None = None  # ... the stage's layers

    @property
    def kernel_choice(self) -> KernelChoice:
        if self.kernel_filter and self.kernels_from:
            return KernelChoice.TIMELINE
        return KernelChoice.GIVEN if self.kernel_filter else KernelChoice.FIRST

    def choice_json(self) -> KernelChoiceJson:
        """How the kernels were chosen, for the capture's analysis and the report."""
        c = self.kernel_choice
        text = {KernelChoice.TIMELINE: f"by time: the top kernels of capture {self.kernels_from}'s timeline",
                KernelChoice.GIVEN: "by the name filter given to ncu-prefix",
                KernelChoice.FIRST: "not by time: no timeline of the job when the rank started, so the "
                                    f"first {self.launch_count} non-NCCL kernels launched"}[c]
        if self.window_layer is not None:
            last = self.launch_skip + self.launch_count - 1
            text += (f"; launches {self.launch_skip}-{last} of the step's filtered launches: the forward "
                     f"and backward of layer {self.window_layer}"
                     + (f" of {self.window_layers}" if self.window_layers else ""))
        return {"how": c.value, "from": self.kernels_from, "text": text, "launch_skip": self.launch_skip,
                "window_layer": self.window_layer, "window_layers": self.window_layers}

    def check(self) -> NcuOptions:
        """Itself, or ValueError saying which option is out of bounds and why."""
        if not 1 <= self.launch_count <= L.MAX_NCU_LAUNCH_COUNT:
            raise ValueError(f"launch count {self.launch_count}: between 1 and {L.MAX_NCU_LAUNCH_COUNT}")
        if not 0 <= self.launch_skip <= L.MAX_NCU_LAUNCH_SKIP:
            raise ValueError(f"launch skip {self.launch_skip}: between 0 and {L.MAX_NCU_LAUNCH_SKIP}")
        for w in (self.window_layer, self.window_layers):
            if w is not None and not 1 <= w <= L.MAX_NCU_LAUNCH_SKIP:
                raise ValueError(f"window layer {w}: between 1 and {L.MAX_NCU_LAUNCH_SKIP}")
        if not 1.0 <= self.time_budget_s <= L.MAX_NCU_TIME_BUDGET_S:
            raise ValueError(f"time budget {self.time_budget_s:g} s: between 1 and "
                             f"{L.MAX_NCU_TIME_BUDGET_S:g}")
        k = self.kernels_from
        if k is not None and (not k or len(k) > 200 or not all(ch.isalnum() or ch in "-_." for ch in k)):
            raise ValueError("kernels-from: a capture id (letters, digits, - _ .), at most 200 characters")
        if self.clock_control not in CLOCK_CONTROLS:
            raise ValueError(f"clock control {self.clock_control!r}: one of {', '.join(CLOCK_CONTROLS)}")
        f = self.kernel_filter
        if f is not None and (not f or any(c.isspace() for c in f) or len(f) > 4000):
            raise ValueError("kernel filter: one word (no white space), at most 4000 characters")
        # Their replay alone (a range also waits for ncu's first set-up: default_time_budget_s allows it)
        expected = self.launch_count * L.NCU_REPLAY_S_PER_KERNEL
        if expected > self.time_budget_s:
            raise ValueError(f"{self.launch_count} kernels take about {expected:.0f} s to profile "
                             f"(~{L.NCU_REPLAY_S_PER_KERNEL:g} s each, measured on the H100), beyond the "
                             f"time budget of {self.time_budget_s:g} s: fewer kernels or a longer budget")
        return self

    def ncu_args(self) -> list[str]:
        # Here, not at the top: the join loads the budget's kernel tables, which `perfd ncu-exec` (every
        # rank's wrapper) and the CLI's parser (CLOCK_CONTROLS) need not.
        from perfd.analytics.ncu.join import NO_NCCL_FILTER

        skip = ["--launch-skip", str(self.launch_skip)] if self.launch_skip else []
        return ["--launch-count", str(self.launch_count), *skip, "--kernel-name",
                self.kernel_filter or NO_NCCL_FILTER, "--clock-control", self.clock_control]


def ncu_argv(ncu: str, report_base: str | Path, cmd: Sequence[str], opts: NcuOptions) -> list[str]:
    """ncu with profiling off until the process calls cudaProfilerStart, writing ``<base>.ncu-rep``."""
    if not cmd:
        raise ValueError("no command to run under ncu")
    sections = [a for s in SECTIONS for a in ("--section", s)]
    return [ncu, "--profile-from-start", "off", "--target-processes", "all", *opts.check().ncu_args(),
            *sections, "--force-overwrite", "-o", str(report_base), *cmd]


def ncu_root(capture_root: str | Path) -> Path:
    return Path(capture_root) / NCU_SUBDIR


def rank_paths(capture_root: str | Path, job: str, rank: int) -> tuple[Path, Path]:
    """(report base without suffix, target file) of one rank: ``<root>/ncu/perfd-<job>/rank<R>``."""
    d = ncu_root(capture_root) / session_name(job)
    return d / f"rank{int(rank)}", d / f"rank{int(rank)}.json"


def report_file(base: Path) -> Path:
    return base.with_name(base.name + REPORT_SUFFIX)


@dataclass(frozen=True)
class NcuTarget:
    """A rank running under ncu, as ``perfd ncu-exec`` recorded it before becoming ncu."""

    job: str
    rank: int
    pid: int  # ncu's (ncu-exec's, before the exec); the rank's process is its child
    options: NcuOptions
    report: Path
    started_at: float
    ncu: str = ""

    def to_json(self) -> dict[str, object]:
        return {"job": self.job, "rank": self.rank, "pid": self.pid, "options": asdict(self.options),
                "report": str(self.report), "started_at": self.started_at, "ncu": self.ncu}


def write_target(capture_root: str | Path, job: str, rank: int, opts: NcuOptions, ncu: str,
                 pid: int | None = None, now: float | None = None) -> NcuTarget:
    base, path = rank_paths(capture_root, job, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    t = NcuTarget(job, int(rank), os.getpid() if pid is None else pid, opts, report_file(base),
                  time.time() if now is None else now, ncu)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = {"version": TARGET_VERSION, **t.to_json()}
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return t


def read_target(capture_root: str | Path, job: str, rank: int) -> NcuTarget | None:
    """The rank's target, or None when it never ran under ncu here. ValueError for a file that is
    not one. The report path is perfd's own (never read from the file)."""
    base, path = rank_paths(capture_root, job, rank)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != TARGET_VERSION:
        raise ValueError(f"{path}: not a perfd ncu target (version {TARGET_VERSION})")
    try:
        o = data["options"]
        opts = NcuOptions(int(o["launch_count"]), o.get("kernel_filter"), o.get("clock_control", "none"),
                          float(o["time_budget_s"]), o.get("kernels_from"), int(o.get("launch_skip") or 0),
                          _opt_int(o.get("window_layer")), _opt_int(o.get("window_layers"))).check()
        return NcuTarget(job, int(rank), int(data["pid"]), opts, report_file(base),
                         float(data["started_at"]), str(data.get("ncu") or ""))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: bad field ({exc})") from None


def _opt_int(v: object) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def rank_prefix(job: str, ranks: Sequence[int], opts: NcuOptions, capture_dir: str | Path | None = None,
                perfd: Sequence[str] | None = None) -> list[str]:
    """What goes between ``torchrun --no-python`` and ``python train.py`` so that the chosen ranks run
    under ncu (``perfd ncu-exec`` reads RANK); the others run the command as it is."""
    import sys

    head = list(perfd) if perfd is not None else [sys.executable, "-m", "perfd.app.cli"]
    opts.check()
    # Printed for $(...): a job name or filter the shell would split or expand (regex:.*gemm.* would
    # become the file names of the folder) goes as hex (nsys_exec.shell_arg).
    words = [*head, "ncu-exec", *shell_arg("--job", job),
             "--ranks", ",".join(str(r) for r in sorted(set(ranks))),
             "--launch-count", str(opts.launch_count), "--clock-control", opts.clock_control,
             "--time-budget", f"{opts.time_budget_s:g}"]
    if opts.kernel_filter:
        words += shell_arg("--kernel-filter", opts.kernel_filter)
    if opts.kernels_from:
        words += ["--kernels-chosen-from", opts.kernels_from]
    if opts.launch_skip:
        words += ["--launch-skip", str(opts.launch_skip)]
    if opts.window_layer is not None:
        words += ["--window-layer", str(opts.window_layer)]
        if opts.window_layers is not None:
            words += ["--window-layers", str(opts.window_layers)]
    if capture_dir is not None:
        words += ["--capture-dir", str(capture_dir)]
    return [*words, "--"]


TIMELINE_TOOLS = ("kineto", "nsys")  # captures whose analysis lists the timeline's top kernels
TRACE_KINDS = ("kineto_trace", "nsys_sqlite")  # their artifacts the timeline can be read again from
# Kernels of a timeline the join looks through: a capture's analysis keeps its top 10, where one
# elementwise function alone has a dozen instantiations (the big H100 Megatron-LM capture: 18 of
# vectorized_elementwise_kernel in its top 80), so the trace is read again when it is still there.
JOIN_TOP_N = 200


@dataclass(frozen=True)
class Timeline:
    """A store's timeline capture as the ncu join reads it: its id, one device's breakdown with its top
    kernels, and the steps the capture asked for (None: it asked for none)."""

    capture_id: str
    device: DeviceBreakdown
    asked_steps: int | None = None


def latest_timeline(manifests: Iterable[Mapping[str, object]], rank: int | None = None) -> Timeline | None:
    """The newest finished Kineto/nsys capture among ``manifests`` (a store's, newest first), with one
    device's analysis that has top kernels, ``rank``'s when that capture has it: the device's JOIN_TOP_N
    kernels when the capture's trace is still on disk, else the ones it kept (the manifest's JSON, read
    here). None: no such capture."""
    from perfd.analytics.breakdown.device_breakdown import devices_of

    for cap in manifests:
        if cap.get("status") != "ok" or cap.get("tool") not in TIMELINE_TOOLS:
            continue
        analysis = cap.get("analysis") or {}
        if not isinstance(analysis, Mapping):
            continue
        keys = ([str(rank)] if rank is not None else []) + sorted(k for k in analysis if k != str(rank))
        for key in keys:
            part = analysis.get(key)
            devices = part.get("devices") if isinstance(part, Mapping) else None
            for dev in devices_of(devices):
                if dev.top_kernels:
                    asked = cap.get("steps")
                    steps = asked.get("count") if isinstance(asked, Mapping) else None
                    return Timeline(str(cap.get("id")), _widened(cap, key, dev),
                                    steps if isinstance(steps, int) and not isinstance(steps, bool) else None)
    return None


def trace_of(manifests: Iterable[Mapping[str, object]], capture_id: str | None,
             rank: int | None = None) -> Path | None:
    """The trace file (Kineto or nsys) of capture ``capture_id`` among ``manifests``, ``rank``'s when it
    has one, that is still on disk (None: none)."""
    for cap in manifests:
        if capture_id is None or str(cap.get("id")) != capture_id:
            continue
        arts = [a for a in _listed(cap.get("artifacts")) if isinstance(a, Mapping)
                and a.get("kind") in TRACE_KINDS and not a.get("pruned")]
        arts.sort(key=lambda a: rank is None or str(a.get("rank")) != str(rank))
        for a in arts:
            p = Path(str(a.get("path")))
            if p.is_file():
                return p
    return None


def _listed(v: object) -> list[object]:
    """A manifest's list (absent, or not a list: none)."""
    return v if isinstance(v, list) else []


def _widened(cap: Mapping[str, object], key: str, dev: DeviceBreakdown) -> DeviceBreakdown:
    """``dev`` read again from its capture's trace with JOIN_TOP_N kernels (``dev`` when it cannot be)."""
    from perfd.capture.chrome_trace import analyze_chrome_trace
    from perfd.capture.nsys_sqlite import analyze_nsys

    for art in _listed(cap.get("artifacts")):
        if not isinstance(art, Mapping) or art.get("kind") not in TRACE_KINDS or art.get("pruned"):
            continue
        if art.get("rank") is not None and str(art.get("rank")) != key:
            continue
        path = Path(str(art.get("path")))
        try:
            read = analyze_nsys if art["kind"] == "nsys_sqlite" else analyze_chrome_trace
            wide = read(path, top_n=JOIN_TOP_N).devices
        except Exception:  # gone, unreadable: the kept top kernels will do
            continue
        for d in wide:
            if d.device == dev.device and d.top_kernels:
                return d
    return dev


@dataclass
class NcuExecutor:
    """The agent's side: finds each rank's target and report, and imports reports as CSV.
    ``ncu``: the binary (looked up when first needed, :meth:`available` says why not)."""

    capture_root: Path
    ncu: str | None = None
    import_timeout_s: float = 300.0
    runner: Runner = subprocess.run
    env: Mapping[str, str] | None = None
    _seen: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (job, rank, pid) -> last ID

    def binary(self) -> str:
        if self.ncu is None:
            self.ncu = find_ncu()
        return self.ncu

    def available(self) -> str | None:
        try:
            self.binary()
        except NcuNotFoundError as exc:
            return str(exc)
        return None

    def target(self, job: str, rank: int) -> NcuTarget | None:
        return read_target(self.capture_root, job, rank)

    def import_csv(self, report: Path, page: str) -> str:
        """``ncu --import REPORT --csv --page PAGE``: the CSV text (NcuError with ncu's words)."""
        if page not in PAGES:
            raise ValueError(f"page {page!r}: one of {', '.join(PAGES)}")
        cmd = [self.binary(), "--import", str(report), "--csv", "--page", page]
        try:
            res = self.runner(cmd, capture_output=True, text=True, timeout=self.import_timeout_s, check=False,
                              env=None if self.env is None else dict(self.env))
        except subprocess.TimeoutExpired as exc:
            raise NcuError(f"{' '.join(cmd)}: no answer within {exc.timeout:.0f} s") from exc
        except OSError as exc:
            raise NcuError(f"{' '.join(cmd)}: {exc}") from exc
        if res.returncode != 0:
            tail = ((res.stderr or "") + (res.stdout or "")).strip()[-1500:]
            raise NcuError(f"{' '.join(cmd)} exited {res.returncode}: {tail}")
        return str(res.stdout)

    def last_seen(self, t: NcuTarget) -> int:
        """The last launch ID of this process already reported (-1: none)."""
        return self._seen.get((t.job, t.rank, t.pid), -1)

    def saw(self, t: NcuTarget, last_id: int) -> None:
        key = (t.job, t.rank, t.pid)
        self._seen[key] = max(self._seen.get(key, -1), last_id)
