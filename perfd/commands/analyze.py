"""`perfd analyze megatron LOG`: the offline analysis of a Megatron-LM log."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


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
    if args.json:
        out = analysis.to_json()
        out["parse"] = {
            "counts": dict(parsed.counts),
            "issues": [
                {"line": i.line_no, "reason": i.reason, "text": i.text} for i in parsed.issues[:200]
            ],
            "issues_total": len(parsed.issues),
        }
        json.dump(out, sys.stdout, indent=2, allow_nan=False, default=str)
        sys.stdout.write("\n")
        return 0
    from perfd.report import render_text

    print(render_text(analysis.report, iterations=analysis if args.iterations else None))
    if parsed.issues:
        print(f"\n{len(parsed.issues)} log lines could not be used (see --json 'parse').")
    return 0
