"""`perfd ncu-prefix`, `perfd ncu-exec` (the chosen ranks of a job under Nsight Compute, profiling off
until a capture opens a range) and `perfd analyze ncu REPORT` (a report's per-kernel rows offline).
The work is in perfd/capture/ncu_exec.py, perfd/analytics/breakdown/ncu_kernels.py and ncu_join.py."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from perfd.core import finite_json
from perfd.core import limits as L

if TYPE_CHECKING:
    from perfd.analytics.breakdown.device_breakdown import DeviceBreakdown
    from perfd.analytics.breakdown.ncu_rows import CategorySummary, JoinedKernel
    from perfd.analytics.ncu.join import TimelineKernel
    from perfd.analytics.ncu.launches import LayerWindow
    from perfd.capture.analysis import TraceData
    from perfd.capture.ncu_exec import NcuOptions
    from perfd.capture.ncu_report import NcuReport


def add_budget_arguments(p: argparse.ArgumentParser, filter_help: str = "", prefix: str = "") -> None:
    """The options that fix what a rank under ncu may cost (ncu-prefix, ncu-exec; ``perfd launch``
    takes them with ``prefix`` "ncu-": --ncu-launch-count, ...)."""
    from perfd.capture.ncu_exec import CLOCK_CONTROLS

    p.add_argument(f"--{prefix}launch-count", dest="launch_count", type=int, default=L.NCU_LAUNCH_COUNT,
                   metavar="N",
                   help="the kernel budget: kernels ncu profiles in the process, over all its ranges "
                   f"(ncu --launch-count; ~{L.NCU_REPLAY_S_PER_KERNEL} s each)" + " (default: %(default)s)")
    p.add_argument(f"--{prefix}launch-skip", dest="launch_skip", type=int, default=0, metavar="N",
                   help="launches of the range that pass the filter ncu lets go before it profiles (ncu "
                   "--launch-skip; ncu-prefix chooses it with --kernels-from so that the range covers the "
                   "forward and backward of one layer)")
    p.add_argument(f"--{prefix}kernel-filter", dest="kernel_filter", metavar="REGEX",
                   help="ncu --kernel-name, e.g. regex:^(gemm_a|softmax_b)$ " + (filter_help or "(default: "
                        "every kernel whose function does not begin with nccl: a replayed NCCL kernel "
                        "waits for peers that never join, and hangs)"))
    p.add_argument(f"--{prefix}clock-control", dest="clock_control", choices=CLOCK_CONTROLS, default="none",
                   help="none: the job's clocks as they run (default); base: ncu locks the SM clock to "
                   "base while it profiles (comparable runs, slower kernels)")
    p.add_argument(f"--{prefix}time-budget", dest="time_budget", type=float, default=None, metavar="S",
                   help="seconds one range may take; past it the capture cancels the range (it closes "
                   "at the next step boundary) and says it overran (default: what the launches take, "
                   f"~{L.NCU_RANGE_SETUP_S:g} s for ncu's first profile and ~{L.NCU_REPLAY_S_PER_KERNEL} s "
                   f"a launch, and a quarter more; at least {L.NCU_TIME_BUDGET_S:g})")
    p.add_argument(f"--{prefix}capture-dir", dest="capture_dir", help="the agent's capture_dir, where it "
                   "looks for ranks under ncu "
                   "(default: this user's ~/.local/state/perfd/captures; an agent with --state-dir DIR "
                   "uses DIR/captures)")


def options_from(args: argparse.Namespace, kernel_filter: str | None = None,
                 kernels_from: str | None = None, window: LayerWindow | None = None) -> NcuOptions:
    """NcuOptions from the budget arguments (``window``: a perfd.analytics.ncu.launches.LayerWindow
    chosen on the timeline, which sets the skip and the count); ValueError naming the one out of
    bounds."""
    from perfd.capture.ncu_exec import NcuOptions

    flt = kernel_filter or args.kernel_filter
    chosen = (kernels_from or getattr(args, "kernels_from_capture", None)) if flt else None
    if window is not None:
        return NcuOptions(window.count, flt, args.clock_control, time_budget(args, window.count), chosen,
                          window.skip, window.layer, window.layers_total).check()
    return NcuOptions(args.launch_count, flt, args.clock_control, time_budget(args, args.launch_count),
                      chosen, int(getattr(args, "launch_skip", 0) or 0), getattr(args, "window_layer", None),
                      getattr(args, "window_layers", None)).check()


def time_budget(args: argparse.Namespace, launches: int) -> float:
    """--time-budget as given, else what ``launches`` take with a margin (ncu_exec.default_time_budget_s)."""
    from perfd.capture.ncu_exec import default_time_budget_s

    given = getattr(args, "time_budget", None)
    return float(given) if given is not None else default_time_budget_s(launches)


def _ranks(text: str) -> list[int]:
    try:
        ranks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--ranks {text!r}: comma-separated integers") from None
    if not ranks or any(r < 0 for r in ranks):
        raise ValueError(f"--ranks {text!r}: at least one rank, none negative")
    return ranks


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("ncu-prefix", help="print the wrapper that puts chosen ranks under Nsight Compute "
                       "(profiling off) for torchrun --no-python")
    p.add_argument("--job", required=True, help="the job name the agent knows it by")
    p.add_argument("--ranks", default="0", help="comma-separated ranks to run under ncu (default: 0); the "
                   "others run as they are, at no cost; a rank under ncu pays ~80 µs a kernel launch")
    add_budget_arguments(p, "(default: the top kernels of --kernels-from, else every kernel whose function "
                            "does not begin with nccl)")
    p.add_argument("--kernels-from", metavar="latest|none|FILE.json",
                   help="name filter from a capture's top kernels by time: latest = the job's newest "
                   "Kineto/nsys capture in --capture-dir (any rank's: the default, without --kernel-filter), "
                   "a capture analysis (perfd analyze trace|nsys --json), or none (the first kernels "
                   "launched, not by time)")
    p.add_argument("--top", type=int, default=10, help="top kernels the filter names (default: %(default)s)")
    p.set_defaults(handler=run_ncu_prefix)
    e = sub.add_parser("ncu-exec", help="run one rank under ncu when RANK is one of --ranks, else as it is "
                       "(what ncu-prefix prints; torchrun sets RANK)")
    who = e.add_mutually_exclusive_group(required=True)
    who.add_argument("--job", help="the job name the agent knows it by")
    who.add_argument("--job-hex", help="the same, as hex of its UTF-8 (what ncu-prefix prints for a name "
                     "the shell would split or expand)")
    e.add_argument("--kernel-filter-hex", help="--kernel-filter as hex of its UTF-8 (ditto)")
    e.add_argument("--ranks", default="0", help="ranks to run under ncu (default: 0)")
    e.add_argument("--kernels-chosen-from", dest="kernels_from_capture", metavar="CAPTURE",
                   help="the capture whose timeline chose --kernel-filter's kernels by time (ncu-prefix "
                   "prints it; the capture's analysis says how its kernels were chosen)")
    e.add_argument("--window-layer", type=int, metavar="N", help="the layer --launch-skip/--launch-count "
                   "cover (ncu-prefix prints it; said with the capture)")
    e.add_argument("--window-layers", type=int, metavar="N", help="the stage's layers (ditto)")
    add_budget_arguments(e)
    e.add_argument("cmd", nargs=argparse.REMAINDER, help="the rank's command, after --")
    e.set_defaults(handler=run_ncu_exec)


def add_analyze_arguments(asub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    a = asub.add_parser("ncu", help="per-kernel rows of an Nsight Compute report (.ncu-rep through the ncu "
                        "binary, or its CSV export)")
    a.add_argument("report", help=".ncu-rep (ncu from $PERFD_NCU, PATH or /opt/nvidia/nsight-compute/*/ncu) "
                   "or a CSV of ncu --import R --csv --page details|raw")
    a.add_argument("--csv", action="append", default=[], metavar="FILE",
                   help="another CSV page of the same report (details and raw merge by launch ID)")
    a.add_argument("--capture", metavar="FILE", help="join to a capture of the job: a Kineto/Chrome trace "
                   "(.json[.gz]) or an nsys .nsys-rep/.sqlite (each profiled launch matched to the trace's "
                   "launch it was, by launch order: its op, pass and layer), or a capture analysis JSON "
                   "(its top kernels, by name)")
    a.add_argument("--device", type=int, default=None, help="the capture's device to join to (default: the "
                   "first with kernels)")
    a.add_argument("--kernel-filter", metavar="REGEX", help="with a trace as --capture: the ncu "
                   "--kernel-name the range ran with (default: the functions the report holds), so that "
                   "its launches are matched one by one to the trace's launches that pass it")
    a.add_argument("--launch-skip", type=int, default=0, metavar="N", help="with a trace: the range's "
                   "ncu --launch-skip (default: 0)")
    a.add_argument("--json", action="store_true", help="print JSON")


def _capture_dir(args: argparse.Namespace) -> Path:
    from perfd.capture.nsys_exec import default_capture_root

    return Path(args.capture_dir) if args.capture_dir else default_capture_root()


def _filter_from(args: argparse.Namespace) -> tuple[str | None, str, str | None, LayerWindow | None]:
    """(kernel filter, where it came from, the capture id that chose it, the layer window) for
    --kernels-from: a capture (latest: the job's newest), its analysis JSON, or a trace file."""
    from perfd.analytics.breakdown.device_breakdown import devices_of
    from perfd.analytics.ncu.join import kernel_filter, timeline_kernels
    from perfd.capture.launch_order import read_trace
    from perfd.capture.ncu_exec import (
        NCU_ARMED_US_PER_LAUNCH,
        NCU_ARMED_US_PER_LAUNCH_HIGH,
        armed_cost_ms,
        latest_timeline,
        trace_of,
    )

    src = args.kernels_from
    trace: Path | TraceData | None = None  # a trace file given is read once, for its kernels and window
    asked: int | None = None  # the steps the capture asked for (a store's capture)
    dev: DeviceBreakdown | None
    if src == "latest":
        from perfd.capture.store import CaptureStore

        store = CaptureStore(_capture_dir(args), quota_bytes=1)  # read only: nothing is written
        caps = store.list(args.job)
        tl = latest_timeline(caps)
        cid, dev, asked = (tl.capture_id, tl.device, tl.asked_steps) if tl is not None else (None, None, None)
        where = f"capture {cid}" if cid else f"no Kineto/nsys capture of job {args.job} in {store.root}"
        trace = trace_of(caps, cid)
    elif _is_trace(Path(src)):
        from perfd.capture.analysis import TraceEmpty, analyze_trace
        from perfd.capture.ncu_exec import JOIN_TOP_N

        cid, trace = None, read_trace(src)
        try:  # an empty trace names no kernel: no filter, said, as one that holds none
            devices = analyze_trace(trace, top_n=JOIN_TOP_N).devices
        except TraceEmpty:
            devices = ()
        dev = next((d for d in devices if d.top_kernels), None)
        where = src if dev else f"{src} holds no kernel"
    else:
        cid = None
        try:
            data = json.loads(Path(src).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"--kernels-from {src}: {exc}") from None
        listed = devices_of(data.get("devices") if isinstance(data, dict) else None)
        dev = next((d for d in listed if d.top_kernels), None)
        where = src if dev else f"{src} lists no top kernels"
    if dev is None:
        return None, where, None, None
    given = asked or dev.trace_steps
    cost = armed_cost_ms(dev, float(given) if given else _steps_of(dev))
    if cost is not None:
        where += (f"; arming ncu costs ~{NCU_ARMED_US_PER_LAUNCH:.0f}-{NCU_ARMED_US_PER_LAUNCH_HIGH:.0f} µs "
                  "a kernel launch for the life of the process (measured on the H100: one-element adds; a "
                  f"12-layer Megatron-LM job): this job launched ~{cost[0]:.0f} kernels a step, so expect "
                  f"+{cost[1]:.0f} to +{cost[2]:.0f} ms of host time per step on the ranks under ncu")
    # the capture's id, or the analysis file's name as a plain word (NcuOptions.check)
    named = cid or "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(src).stem)[:200]
    flt = kernel_filter(timeline_kernels(dev), args.top)
    window, why = _window(trace, flt, args) if flt else (None, "")
    if why:
        where += f"; {why}"
    return flt, where, named or None, window


def _is_trace(p: Path) -> bool:
    """A timeline file (a Kineto/Chrome trace, an nsys export or report), not an analysis JSON."""
    if p.suffix in (".sqlite", ".nsys-rep", ".gz"):
        return True
    if p.suffix != ".json":
        return False
    try:
        with p.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b"traceEvents" in head or b"schemaVersion" in head


def _window(trace: Path | TraceData | None, flt: str, args: argparse.Namespace
            ) -> tuple[LayerWindow | None, str]:
    """The launch window covering one layer's forward and backward on the trace's steps (a file, or its
    events already read), and what was chosen (or why none: then the range profiles the step's first
    --launch-count filtered launches)."""
    from perfd.analytics.ncu.launches import layer_window
    from perfd.capture.launch_order import launches_of, read_launches
    from perfd.capture.ncu_exec import default_time_budget_s, range_estimate_s

    if trace is None:
        return None, "no trace of the capture on disk to choose a launch window from"
    try:
        w = layer_window(read_launches(trace) if isinstance(trace, Path) else launches_of(trace), flt)
    except Exception as exc:  # an unreadable trace: the plain budget will do
        return None, f"no launch window ({type(exc).__name__}: {str(exc)[:200]})"
    if w is None:
        return None, "no launch window: the trace shows no step with a forward and backward layer"
    need = range_estimate_s(w.count)
    if w.count > L.MAX_NCU_LAUNCH_COUNT or (args.time_budget is not None and need > float(args.time_budget)):
        return None, (f"no launch window: layer {w.layer}'s forward and backward are {w.count} filtered "
                      f"launches, ~{need:.0f} s to profile, beyond the time budget of "
                      f"{float(args.time_budget or 0):g} s (--time-budget "
                      f"{default_time_budget_s(w.count):g}, or none: the window's own; or --top fewer "
                      "kernels)")
    return w, (f"launch window: skip {w.skip}, count {w.count} of the step's {w.per_step} filtered launches: "
               f"the forward and backward of layer {w.layer} of {w.layers_total}, ~{need:.0f} s to profile "
               f"(time budget {time_budget(args, w.count):g} s)")


def _steps_of(dev: DeviceBreakdown) -> float | None:
    """Steps a capture's device breakdown holds, from its NVTX ProfilerStep ranges where it has them."""
    return float(sum(r.count for r in dev.nvtx if r.name.startswith("ProfilerStep"))) or None


def run_ncu_prefix(args: argparse.Namespace) -> int:
    """``torchrun --no-python ... $(perfd ncu-prefix --job J --ranks 1) python train.py``."""
    from perfd.capture.ncu_exec import NcuNotFoundError, find_ncu, rank_prefix

    try:
        find_ncu()  # the ranks under ncu need it; say so now rather than when torchrun starts them
        ranks = _ranks(args.ranks)
        flt, chosen, window = None, None, None
        if not args.kernel_filter and args.kernels_from != "none":
            # By time whenever the job has a timeline (without one the budget went to
            # the first kernels of the step, 11 of 15 rows elementwise or normalisation)
            args.kernels_from = args.kernels_from or "latest"
            flt, where, chosen, window = _filter_from(args)
            print(f"perfd ncu-prefix: kernel filter from {where}: "
                  + (f"{flt} (the top kernels by time)" if flt else
                     "none: the first kernels launched, not by time (take a Kineto capture of the job first, "
                     "or of another rank, to choose them by time)"), file=sys.stderr)
        opts = options_from(args, flt, chosen if flt else None, window)
        words = rank_prefix(args.job, ranks, opts, str(_capture_dir(args)))
    except (NcuNotFoundError, ValueError) as exc:
        print(f"perfd ncu-prefix: {exc}", file=sys.stderr)
        return 2
    from perfd.app.commands.capture import _words_for_shell

    line = _words_for_shell(words, "ncu-prefix")
    if line is None:
        return 2
    print(line)
    return 0


def run_ncu_exec(args: argparse.Namespace) -> int:
    """Become ``ncu ... CMD`` for a chosen rank (after recording the target the agent reads), else
    ``CMD`` itself. exec: the rank's process keeps this pid, nothing of perfd stays between."""
    from perfd.capture.ncu_exec import NcuNotFoundError, find_ncu, ncu_argv, rank_paths, write_target
    from perfd.core.armed import ARMED_ENV, armed_line

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("perfd ncu-exec: no command (perfd ncu-exec --job J --ranks 0 -- python train.py)",
              file=sys.stderr)
        return 2
    rank_text = os.environ.get("RANK", "")
    if rank_text and not rank_text.isdigit():
        print(f"perfd ncu-exec: RANK={rank_text!r} is not a rank", file=sys.stderr)
        return 2
    rank = int(rank_text) if rank_text else 0  # a process started without torchrun is rank 0
    try:
        from perfd.capture.nsys_exec import from_hex

        if args.job_hex is not None:
            args.job = from_hex(args.job_hex, "--job")
        if args.kernel_filter_hex is not None:
            args.kernel_filter = from_hex(args.kernel_filter_hex, "--kernel-filter")
        chosen = rank in _ranks(args.ranks)
        argv = list(cmd)
        if chosen:
            opts = options_from(args)
            ncu = find_ncu()
            root = _capture_dir(args)
            base, _ = rank_paths(root, args.job, rank)
            argv = ncu_argv(ncu, base, cmd, opts)
            write_target(root, args.job, rank, opts, ncu)
            # Armed from its first step: the hook reads the variable (ncu passes the environment to
            # the rank's process), the log's reader the line (perfd.core.armed).
            os.environ[ARMED_ENV] = "ncu"
            print(armed_line(rank, args.job), file=sys.stderr, flush=True)
    except (NcuNotFoundError, ValueError, OSError) as exc:
        print(f"perfd ncu-exec: {exc}", file=sys.stderr)
        return 2
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"perfd ncu-exec: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 0  # not reached: exec replaced this process


# --- perfd analyze ncu -------------------------------------------------------------------------------
def _texts(args: argparse.Namespace) -> list[str]:
    from perfd.capture.ncu_exec import PAGES, NcuExecutor

    path = Path(args.report)
    if path.suffix == ".ncu-rep":
        ex = NcuExecutor(path.parent)
        why = ex.available()
        if why is not None:
            raise ValueError(f"{path} is an ncu report and reading it needs the ncu binary: {why}")
        texts = [ex.import_csv(path, page) for page in PAGES]
    else:
        texts = [_csv_text(path)]
    return texts + [_csv_text(Path(c)) for c in args.csv]


def _csv_text(path: Path) -> str:
    """An ncu CSV export's text, gzip/xz/zstd-compressed or plain (told by its first bytes: exports are
    kept compressed, as tests/data/ncu's are). Raises OSError, EOFError (a cut archive) or
    LogFileError."""
    from perfd.core.logfiles import open_log

    with open_log(path) as f:
        return f.read().decode(errors="replace")


def _timeline(path: str, device: int | None) -> tuple[list[TimelineKernel], dict[str, float] | None,
                                                    float | None, TraceData | None]:
    """The capture's kernels on ``device``, its categories and marked steps, and its events where it is
    a trace (read once: the rows by launch are matched to the same events)."""
    from perfd.analytics.breakdown.device_breakdown import devices_of
    from perfd.analytics.ncu.join import timeline_kernels
    from perfd.capture.analysis import analyze_trace
    from perfd.capture.launch_order import read_trace
    from perfd.capture.ncu_exec import JOIN_TOP_N

    p = Path(path)
    data = json.loads(p.read_text()) if p.suffix == ".json" and not _is_trace(p) else None
    trace: TraceData | None = None
    if isinstance(data, dict) and "devices" in data:  # an analysis: perfd analyze trace|nsys --json
        devices = devices_of(data["devices"])
    else:
        trace = read_trace(p)
        devices = analyze_trace(trace, top_n=JOIN_TOP_N).devices
    dev = next((d for d in devices if d.top_kernels and (device is None or d.device == device)), None)
    if dev is None:
        raise ValueError(f"{p.name}: no device{'' if device is None else f' {device}'} with kernels")
    marked = dev.trace_steps  # the steps the trace marks: each kernel's time per step
    steps = float(marked) if marked is not None and marked > 0 else None
    return timeline_kernels(dev), dev.categories(), steps, trace


def run_analyze_ncu(args: argparse.Namespace) -> int:
    from perfd.analytics.ncu.join import join, summarize
    from perfd.capture.ncu_exec import NcuError
    from perfd.capture.ncu_report import NcuParseError, parse_exports

    path = Path(args.report)
    if not path.is_file():
        print(f"perfd: no such file: {path}", file=sys.stderr)
        return 2
    try:
        report = parse_exports(_texts(args))
    except (NcuParseError, NcuError, ValueError, OSError, EOFError) as exc:  # LogFileError: a ValueError
        print(f"perfd: cannot read the ncu report {path}: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    timeline: list[TimelineKernel] = []
    cats, steps, trace = None, None, None
    if args.capture:
        try:
            timeline, cats, steps, trace = _timeline(args.capture, args.device)
        except Exception as exc:  # an unreadable capture: say what and where, no traceback
            print(f"perfd: cannot read the capture {args.capture}: {exc}", file=sys.stderr)
            return 1
    joined, cov = None, None
    if trace is not None:
        from perfd.capture.ncu_capture import by_launch

        flt = args.kernel_filter or inferred_filter(report)
        joined, cov = by_launch(report, trace, flt, max(0, args.launch_skip), steps, args.device)
    if joined is None:
        joined = join(report.kernels, timeline, steps)
    summaries = summarize(joined, cats)
    for problem in report.problems:
        print(f"perfd: note: {problem}", file=sys.stderr)
    if args.json:
        out = {**{k: v for k, v in report.to_json().items() if k != "kernels"},
               "kernels": [j.to_json() for j in joined], "categories": [c.to_json() for c in summaries],
               "coverage": cov.to_json() if cov is not None else None}
        sys.stdout.write(finite_json.dumps(out, indent=2) + "\n")
        return 0
    print(render(report, joined, summaries, joined_to=args.capture))
    if cov is not None:
        from perfd.report.ncu_text import coverage_text

        print(f"\ncoverage: {coverage_text(cov)}")
    return 0


def inferred_filter(report: NcuReport) -> str | None:
    """An ncu --kernel-name that passes the functions the report profiled: inside the range it passes
    what the range's own filter did (a function the filter passed that ran there would be in the
    report)."""
    import re

    from perfd.analytics.ncu.join import function_name

    names = sorted({function_name(k.name) for k in report.kernels})
    ok = [n for n in names if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
    return f"regex:^({'|'.join(ok)})$" if ok and len(ok) == len(names) else None


def _pct(v: float | None) -> str:
    return "   -" if v is None else f"{100 * v:3.0f}%"


def render(report: NcuReport, joined: list[JoinedKernel], summaries: list[CategorySummary],
           joined_to: str | None = None) -> str:
    """The text view of an ncu report: per category, then per kernel."""
    clock = report.sm_clock_hz
    lines = [f"{len(report.kernels)} kernels, {report.launches} launches profiled (pages: "
             f"{', '.join(report.pages)}); SM clock while profiled "
             f"{'unknown' if clock is None else f'{clock / 1e9:.2f} GHz'}"
             + ("; truncated input" if report.truncated else "")]
    if summaries:
        lines += ["", "by category (means weighted by profiled time; SOL = speed of light):"]
        for c in summaries:
            share = ("" if c.captured_share is None
                     else f", {100 * c.captured_share:.0f}% of the captured time")
            lines.append(f"  {c.category:<13} {c.kernels:3d} kernels{share}: compute SOL "
                         f"{_pct(c.compute_throughput)}, memory SOL {_pct(c.memory_throughput)}, DRAM "
                         f"{_pct(c.dram_throughput)}, tensor {_pct(c.tensor_pipe)}, occupancy "
                         f"{_pct(c.achieved_occupancy)}; {c.bound.value if c.bound else 'class unknown'}"
                         + (f"; top stall {c.top_stall}" if c.top_stall else ""))
    lines += ["", "kernels" + (f" (joined to {Path(joined_to).name})" if joined_to else "") + ":",
              "   share  calls    dur ms  comp   mem  dram  tens   occ  class          stall         name"]
    for j in joined:
        k = j.kernel
        share = "     -" if j.captured_share is None else f"{100 * j.captured_share:5.1f}%"
        dur = "       -" if k.duration_ms is None else f"{k.duration_ms:9.3f}"
        stall = k.stalls[0].reason if k.stalls else "-"
        lines.append(f"  {share} {k.invocations:6d} {dur} {_pct(k.compute_throughput)} "
                     f"{_pct(k.memory_throughput)} {_pct(k.dram_throughput)} {_pct(k.tensor_pipe)} "
                     f"{_pct(k.achieved_occupancy)}  {(k.bound.value if k.bound else '-'):<14} "
                     f"{stall:<13} [{j.category}] {k.name[:90]}")
    return "\n".join(lines)
