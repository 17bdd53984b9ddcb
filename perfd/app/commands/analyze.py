"""`perfd analyze megatron LOG` and `perfd analyze sglang LOG`: offline analyses of a training log
and of an SGLang server log (with its /metrics)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from perfd.app.commands.input_checks import check_gpu, check_log, refuse
from perfd.core import finite_json

if TYPE_CHECKING:
    from perfd.analytics.run.run_result import RunAnalysis
    from perfd.collectors.megatron.parser import ParsedLog
    from perfd.core.serving_model import ServingModelSpec
    from perfd.core.serving_records import MetricsSnapshot


def add_sglang_arguments(p: argparse.ArgumentParser) -> None:
    """The `perfd analyze sglang` arguments (the parser is built in perfd/app/cli.py)."""
    p.add_argument("log", help="SGLang server log ('-' for stdin)")
    p.add_argument("--metrics", action="append", default=[], metavar="URL|FILE",
                   help="SGLang /metrics (--enable-metrics): a URL is scraped twice --scrape-interval apart; "
                   "files are saved expositions (give two, older first, for a window; one file covers the "
                   "server's lifetime). Repeatable.")
    p.add_argument("--scrape-interval", type=float, default=10.0, metavar="S",
                   help="seconds between the two scrapes of a --metrics URL (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON: records, summary, report")
    p.add_argument("--job", default=None, help="job name (default: the file name)")
    p.add_argument("--gpu", help="GPU name as NVML reports it (e.g. 'NVIDIA H200'), for the peaks")
    p.add_argument("--peak-tflops", type=float, help="override the peak dense TFLOP/s per GPU")
    p.add_argument("--peak-bandwidth-tbs", type=float, help="override the peak memory bandwidth (TB/s per "
                                                            "GPU)")
    g = p.add_argument_group("model spec (for MBU/MFU; the log's start-up lines fill what they can)")
    g.add_argument("--model-params", help="total parameters, e.g. 8e9 or 8B")
    g.add_argument("--active-params", help="parameters active per token (MoE), e.g. 37B")
    g.add_argument("--layers", type=int, dest="num_layers", help="transformer layers")
    g.add_argument("--hidden", type=int, dest="hidden_size", help="hidden size")
    g.add_argument("--heads", type=int, dest="num_attention_heads", help="attention heads")
    g.add_argument("--kv-heads", type=int, dest="num_kv_heads", help="key/value heads (GQA)")
    g.add_argument("--head-dim", type=int, help="dimension per attention head")
    g.add_argument("--dtype", help="weights/compute dtype (bf16, fp16, fp8)")
    g.add_argument("--kv-dtype", help="KV cache dtype (default: SGLang's --kv-cache-dtype, else the dtype)")
    g.add_argument("--weight-bytes", help="all weights in bytes, e.g. 16e9 (overrides params × dtype)")
    g.add_argument("--kv-bytes-per-token", type=float, help="KV bytes per token, whole model")
    g.add_argument("--tp", type=int, help="tensor-parallel size (default: the log's server_args)")
    g.add_argument("--pp", type=int, help="pipeline-parallel size")
    g.add_argument("--gpus", type=int, help="GPUs serving the model in total")


# Which iterations `perfd analyze megatron` lists row by row. Rows are on request: a long run's
# would bury its summary (100,000 iterations are ~400 MB of JSON), which covers every iteration.
ITERATIONS_ALL, ITERATIONS_STEADY, ITERATIONS_NONE = "all", "steady", "none"
ITERATIONS_DEFAULT = ITERATIONS_NONE


def add_iterations_argument(p: argparse.ArgumentParser) -> None:
    """`--iterations [all|steady|none]` of `perfd analyze megatron` (the parser is built in
    perfd/app/cli.py)."""
    choices = (ITERATIONS_ALL, ITERATIONS_STEADY, ITERATIONS_NONE)
    p.add_argument("--iterations", nargs="?", choices=choices, const=ITERATIONS_ALL,
                   default=ITERATIONS_DEFAULT, metavar="|".join(choices),
                   help="per-iteration rows, in the JSON ('iterations') and as a table in the text "
                   "report: all, the steady-state ones, or none (default: "
                   f"{ITERATIONS_DEFAULT}; the summary covers every iteration either way); a bare "
                   f"--iterations means {ITERATIONS_ALL}")


def analyze_megatron_file(path: str, job: str | None = None, gpu: str | None = None,
                          peak_tflops: float | None = None, dtype: str | None = None,
                          progress: bool = False) -> tuple[ParsedLog, RunAnalysis]:
    """Parse and analyse one log (plain, gzip, xz or zstd); returns (parsed, RunAnalysis) (also used by
    the demo, perfd.app.api and tests). ``progress`` shows a bar on stderr while the file is read."""
    from perfd.analytics.run.run_analysis import analyze_run
    from perfd.collectors.megatron import parse_lines

    name = job or (Path(path).stem if path != "-" else "stdin")
    if path == "-":
        parsed = parse_lines(sys.stdin, job=name, source_name="stdin")
    else:
        parsed = parse_lines(_read_lines(path, progress), job=name, source_name=Path(path).name)
    analysis = analyze_run(parsed.job_info, parsed.records, gpu_name=gpu,
                           peak_tflops=peak_tflops, dtype=dtype, live=False)
    return parsed, analysis


# Logs smaller than this are read before a bar could be seen.
_PROGRESS_MIN_BYTES = 8 << 20


def _read_lines(path: str, progress: bool) -> Iterator[str]:
    """The log's lines; with ``progress`` and a big file, a transient bar on stderr counted in bytes
    read (a compressed log has no known total: the bar then only shows bytes and speed)."""
    from perfd.core.logfiles import compression_of, iter_text_lines, open_log

    size = Path(path).stat().st_size
    if not progress or size < _PROGRESS_MIN_BYTES:
        yield from iter_text_lines(path)
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    total = size if compression_of(path) is None else None
    with Progress(TextColumn("reading {task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), console=Console(stderr=True), transient=True) as bar, \
            open_log(path) as fh:
        task = bar.add_task(Path(path).name, total=total)
        done = 0
        for n, line in enumerate(fh):
            done += len(line)
            if n % 4096 == 0:
                bar.update(task, completed=done)
            yield line.decode("utf-8", "replace")


def run_analyze(args: argparse.Namespace) -> int:
    if args.what == "sglang":
        return run_sglang(args)
    if args.what == "torchtitan":
        from perfd.app.commands import analyze_torchtitan

        return analyze_torchtitan.run(args)
    if args.what in ("nsys", "trace"):
        from perfd.app.commands import analyze_capture

        return analyze_capture.run(args)
    if args.what == "ncu":
        from perfd.app.commands.ncu import run_analyze_ncu

        return run_analyze_ncu(args)
    if args.what != "megatron":  # argparse enforces the choices; kept for new analysers
        print(f"perfd: unknown analyser {args.what}", file=sys.stderr)
        return 2
    from perfd.app.commands.peak_args import check_mfu_possible, check_peak_args

    why = check_log(args.log) or check_peak_args(args.dtype, args.peak_tflops) or \
        check_gpu(args.gpu, args.peak_tflops)
    if why:
        return refuse(why)
    timeline = None
    if getattr(args, "capture", None):
        from perfd.app.commands.analyze_capture import timeline_class

        try:
            steps = getattr(args, "capture_steps", None)
            if steps is not None and steps < 1:
                return refuse(f"--capture-steps must be >= 1 (got {steps})")
            timeline = timeline_class(args.capture, steps, bool(getattr(args, "capture_force", False)))
        except Exception as exc:  # unreadable capture: say what and where, no traceback
            return refuse(f"cannot analyse the capture {args.capture}: {exc}")
    from perfd.app.commands import megatron_offline
    from perfd.core.logfiles import LogFileError

    try:
        with megatron_offline.temporary_directory() as tmp:
            path = megatron_offline.spooled_stdin(tmp) if args.log == "-" else args.log
            name = args.job or (Path(args.log).stem if args.log != "-" else "stdin")
            source = Path(args.log).name if args.log != "-" else "stdin"
            parsed, analysis = megatron_offline.analyze_stream(
                path, lambda p: _read_lines(p, sys.stderr.isatty()), name, source, args.gpu,
                args.peak_tflops, args.dtype, timeline)
    except (OSError, EOFError, LogFileError) as exc:  # unreadable, corrupt or truncated archive
        return refuse(f"cannot read {args.log}: {exc}")
    if analysis is None:
        return refuse(f"no Megatron-LM iteration lines in {args.log} ({parsed.counts.get('lines', 0)} "
                      "lines read): is it the stdout of a Megatron-LM run (another framework's log?)")
    match = analysis.capture_match
    if match is not None and match.refused and not getattr(args, "capture_force", False):
        from perfd.report.capture_text import refusal

        return refuse(refusal(match))
    why = check_mfu_possible(analysis, parsed.job_info, args.dtype, args.peak_tflops)
    if why:
        return refuse(why)
    from perfd.report import analysis_json, build_report, render_text
    from perfd.report.row_json import iteration_rows, row_codes

    steady_only = args.iterations == ITERATIONS_STEADY
    if args.json:
        # the rows are written as they are built (finite_json.write), never held as one list
        codes = row_codes(analysis)
        rows: Iterable[dict[str, object]] = ([] if args.iterations == ITERATIONS_NONE
                                             else iteration_rows(analysis, steady_only, codes))
        out: dict[str, object] = {}
        for key, value in analysis_json(analysis, rows=rows, codes=codes).items():
            out[key] = value
            if key == "iterations":  # which rows they are, next to them
                out["iterations_shown"] = args.iterations
        out["parse"] = {
            "counts": dict(parsed.counts),
            "issues": [
                {"line": i.line_no, "reason": i.reason, "text": i.text} for i in parsed.issues[:200]
            ],
            "issues_total": len(parsed.issues),
        }
        finite_json.write(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table = analysis if args.iterations != ITERATIONS_NONE else None
    print(render_text(build_report(analysis), iterations=table, steady_only=steady_only))
    if parsed.issues:
        print(f"\n{len(parsed.issues)} log lines could not be used (see --json 'parse').")
    return 0


# --- sglang ------------------------------------------------------------------------------------

_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def _count(text: str | None, what: str) -> float | None:
    """'8e9', '8B', '70b', '1.5T' -> float; None for None; ValueError names the flag."""
    if text is None:
        return None
    t = text.strip()
    mult = _SUFFIX.get(t[-1:].upper(), 1.0) if t and t[-1].isalpha() else 1.0
    try:
        value = float(t[:-1] if mult != 1.0 else t) * mult
    except ValueError:
        raise ValueError(f"{what}: not a number: {text!r} (e.g. 8e9 or 8B)") from None
    if value <= 0:
        raise ValueError(f"{what} must be > 0")
    return value


def _spec_from_args(args: argparse.Namespace) -> ServingModelSpec:
    from perfd.core.serving_model import ServingModelSpec

    return ServingModelSpec(
        params=_count(args.model_params, "--model-params"),
        active_params=_count(args.active_params, "--active-params"),
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_kv_heads=args.num_kv_heads, head_dim=args.head_dim, dtype=args.dtype, kv_dtype=args.kv_dtype,
        weight_bytes=_count(args.weight_bytes, "--weight-bytes"), kv_bytes_per_token=args.kv_bytes_per_token,
        tp=args.tp, pp=args.pp, gpus=args.gpus)


def _read_metrics(sources: list[str], interval_s: float
                  ) -> tuple[MetricsSnapshot | None, MetricsSnapshot | None, list[str]]:
    """(previous, current) snapshots and problems, from URLs (scraped twice) or saved files."""
    import time

    from perfd.collectors.sglang.metrics import read_file, scrape

    snaps: list[MetricsSnapshot] = []
    problems: list[str] = []
    for src in sources:
        if src.startswith(("http://", "https://")):
            first, err = scrape(src, time.time())
            if first is None:
                problems.append(f"{src}: {err}")
                continue
            snaps.append(first)
            if len(sources) == 1:
                time.sleep(max(interval_s, 0.0))
                second, err = scrape(src, time.time())
                if second is None:
                    problems.append(f"{src} (second scrape): {err}")
                else:
                    snaps.append(second)
        else:
            try:
                mtime = Path(src).stat().st_mtime
            except OSError as exc:
                problems.append(f"{src}: {exc}")
                continue
            snap, err = read_file(src, mtime)
            if snap is None:
                problems.append(f"{src}: {err}")
            else:
                snaps.append(snap)
    for s in snaps:
        problems.extend(f"{s.source}: {i}" for i in s.issues)
    if len(snaps) >= 2:
        return snaps[-2], snaps[-1], problems
    return None, (snaps[0] if snaps else None), problems


def run_sglang(args: argparse.Namespace) -> int:
    """`perfd analyze sglang LOG [--metrics URL|FILE]... [--json]`."""
    from perfd.analytics.serving.serving_analysis import analyze_serving
    from perfd.app.commands.peak_args import check_peak_args, check_peak_tflops
    from perfd.collectors.sglang.parser import parse_file, parse_lines
    from perfd.report import render_text
    from perfd.report.serving_report import build_serving_report, serving_json

    peak_given = args.peak_tflops if args.peak_tflops is not None else args.peak_bandwidth_tbs
    why = (check_log(args.log) or check_peak_args(args.dtype, args.peak_tflops)
           or check_peak_tflops(args.peak_bandwidth_tbs, "--peak-bandwidth-tbs", "TB/s per GPU",
                                "3.35 for an H100 SXM")
           or check_gpu(args.gpu, peak_given))
    if why:
        return refuse(why)
    try:
        spec = _spec_from_args(args)
    except ValueError as exc:
        return refuse(str(exc))
    from perfd.core.logfiles import LogFileError

    try:
        parsed = parse_lines(sys.stdin, source_name="stdin") if args.log == "-" else parse_file(args.log)
    except (OSError, EOFError, LogFileError) as exc:
        return refuse(f"cannot read {args.log}: {exc}")
    prev, cur, problems = _read_metrics(args.metrics, args.scrape_interval)
    if not parsed.records and cur is None:  # nothing to analyse: neither log lines nor /metrics
        metrics = f"; --metrics: {problems[0]}" if problems else ""
        return refuse(f"no SGLang 'Prefill batch' / 'Decode batch' lines in {args.log} "
                      f"({parsed.counts.get('lines', 0)} lines read): is it an SGLang server log?{metrics}")
    name = args.job or (Path(args.log).stem if args.log != "-" else "stdin")
    bw = args.peak_bandwidth_tbs * 1e12 if args.peak_bandwidth_tbs is not None else None
    analysis = analyze_serving(name, parsed.records, parsed.server, cur, prev, spec, args.gpu,
                               args.peak_tflops, bw, lifetime_percentiles=True)
    report = build_serving_report(analysis)
    for p in problems:
        print(f"perfd: metrics: {p}", file=sys.stderr)
    if args.json:
        out = {
            "records": [r.to_json() for r in parsed.records],
            "summary": serving_json(analysis),
            "report": report.to_json(),
            "parse": {"counts": dict(parsed.counts),
                      "issues": [{"line": i.line_no, "reason": i.reason, "text": i.text}
                                 for i in parsed.issues[:200]],
                      "issues_total": len(parsed.issues)},
            "metrics_sources": [s.source for s in (prev, cur) if s is not None],
            "metrics_problems": problems,
        }
        sys.stdout.write(finite_json.dumps(out, indent=2))
        sys.stdout.write("\n")
        return 0
    print(render_text(report))
    if parsed.issues:
        print(f"\n{len(parsed.issues)} log lines could not be used (see --json 'parse').")
    return 0
