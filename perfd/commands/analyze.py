"""`perfd analyze megatron LOG` and `perfd analyze sglang LOG`: offline analyses of a training log
and of an SGLang server log (with its /metrics)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from perfd import finite_json


def add_sglang_arguments(p: argparse.ArgumentParser) -> None:
    """The `perfd analyze sglang` arguments (the parser is built in perfd/cli.py)."""
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
    g.add_argument("--layers", type=int, dest="num_layers")
    g.add_argument("--hidden", type=int, dest="hidden_size")
    g.add_argument("--heads", type=int, dest="num_attention_heads")
    g.add_argument("--kv-heads", type=int, dest="num_kv_heads")
    g.add_argument("--head-dim", type=int)
    g.add_argument("--dtype", help="weights/compute dtype (bf16, fp16, fp8)")
    g.add_argument("--kv-dtype", help="KV cache dtype (default: SGLang's --kv-cache-dtype, else the dtype)")
    g.add_argument("--weight-bytes", help="all weights in bytes, e.g. 16e9 (overrides params × dtype)")
    g.add_argument("--kv-bytes-per-token", type=float, help="KV bytes per token, whole model")
    g.add_argument("--tp", type=int, help="tensor-parallel size (default: the log's server_args)")
    g.add_argument("--pp", type=int, help="pipeline-parallel size")
    g.add_argument("--gpus", type=int, help="GPUs serving the model in total")


def analyze_megatron_file(path: str, job: str | None = None, gpu: str | None = None,
                          peak_tflops: float | None = None, dtype: str | None = None) -> Any:
    """Parse and analyse one log; returns the RunAnalysis (also used by the demo and tests)."""
    from collectors.megatron import parse_file, parse_lines
    from perfd.analytics.megatron_job import analyze_run

    name = job or (Path(path).stem if path != "-" else "stdin")
    parsed = parse_lines(sys.stdin, job=name, source_name="stdin") if path == "-" else parse_file(
        path, job=name)
    analysis = analyze_run(parsed.job_info, parsed.records, gpu_name=gpu,
                           peak_tflops=peak_tflops, dtype=dtype)
    return parsed, analysis


def run_analyze(args: argparse.Namespace) -> int:
    if args.what == "sglang":
        return run_sglang(args)
    if args.what in ("nsys", "trace"):
        from perfd.commands import analyze_capture

        return analyze_capture.run(args)
    if args.what != "megatron":  # argparse enforces the choices; kept for new analysers
        print(f"perfd: unknown analyser {args.what}", file=sys.stderr)
        return 2
    if args.log != "-" and not Path(args.log).is_file():
        print(f"perfd: no such log file: {args.log}", file=sys.stderr)
        return 2
    parsed, analysis = analyze_megatron_file(args.log, args.job, args.gpu, args.peak_tflops,
                                             args.dtype)
    if not parsed.records:
        print(f"perfd: no Megatron iteration lines found in {args.log} "
              f"({parsed.counts.get('lines', 0)} lines read)", file=sys.stderr)
    from perfd.report import analysis_json, build_report, render_text

    if args.json:
        out = analysis_json(analysis)
        out["parse"] = {
            "counts": dict(parsed.counts),
            "issues": [
                {"line": i.line_no, "reason": i.reason, "text": i.text} for i in parsed.issues[:200]
            ],
            "issues_total": len(parsed.issues),
        }
        sys.stdout.write(finite_json.dumps(out, indent=2))
        sys.stdout.write("\n")
        return 0
    print(render_text(build_report(analysis), iterations=analysis if args.iterations else None))
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


def _spec_from_args(args: argparse.Namespace) -> Any:
    from perfd.analytics.serving_spec import ServingModelSpec

    return ServingModelSpec(
        params=_count(args.model_params, "--model-params"),
        active_params=_count(args.active_params, "--active-params"),
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_kv_heads=args.num_kv_heads, head_dim=args.head_dim, dtype=args.dtype, kv_dtype=args.kv_dtype,
        weight_bytes=_count(args.weight_bytes, "--weight-bytes"), kv_bytes_per_token=args.kv_bytes_per_token,
        tp=args.tp, pp=args.pp, gpus=args.gpus)


def _read_metrics(sources: list[str], interval_s: float) -> tuple[Any, Any, list[str]]:
    """(previous, current) snapshots and problems, from URLs (scraped twice) or saved files."""
    import time

    from collectors.sglang.metrics import read_file, scrape

    snaps: list[Any] = []
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
    from collectors.sglang.parser import parse_file, parse_lines
    from perfd.analytics.serving import analyze_serving
    from perfd.report import render_text
    from perfd.report.serving import build_serving_report

    if args.log != "-" and not Path(args.log).is_file():
        print(f"perfd: no such log file: {args.log}", file=sys.stderr)
        return 2
    try:
        spec = _spec_from_args(args)
    except ValueError as exc:
        print(f"perfd: {exc}", file=sys.stderr)
        return 2
    parsed = parse_lines(sys.stdin, source_name="stdin") if args.log == "-" else parse_file(args.log)
    prev, cur, problems = _read_metrics(args.metrics, args.scrape_interval)
    name = args.job or (Path(args.log).stem if args.log != "-" else "stdin")
    bw = args.peak_bandwidth_tbs * 1e12 if args.peak_bandwidth_tbs is not None else None
    analysis = analyze_serving(name, parsed.records, parsed.server, cur, prev, spec, args.gpu,
                               args.peak_tflops, bw, lifetime_percentiles=True)
    report = build_serving_report(analysis)
    if not parsed.records:
        print(f"perfd: no SGLang 'Prefill batch' / 'Decode batch' lines in {args.log} "
              f"({parsed.counts.get('lines', 0)} lines read)", file=sys.stderr)
    for p in problems:
        print(f"perfd: metrics: {p}", file=sys.stderr)
    if args.json:
        out = {
            "records": [r.to_json() for r in parsed.records],
            "summary": analysis.to_json(),
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
