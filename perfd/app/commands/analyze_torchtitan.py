"""`perfd analyze torchtitan LOG`: the run analysis of a torchtitan training log, offline.

The log says the layout, the batch, the steps and torchtitan's own tps/tflops/MFU; it does not say
the model's shape or the training dtype, so ``--model`` (a YAML mapping of ModelSpec fields, the
same as the agent's ``collectors.torchtitan.model``) and ``--dtype`` give them. perfd's MFU is then
cross-checked against torchtitan's tflops on every steady step (2%).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfd.core import finite_json


def add_arguments(asub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = asub.add_parser("torchtitan", help="analyse a torchtitan training log")
    p.add_argument("log", help="path to the log file (stdout of the run; gzip/xz/zstd read too)")
    p.add_argument("--model", metavar="FILE", help="YAML mapping of the model's shape (ModelSpec fields: "
                   "num_layers, hidden_size, ffn_hidden_size, num_attention_heads, kv_channels, "
                   "num_query_groups, padded_vocab_size, swiglu); without it perfd has no FLOPs count "
                   "of its own")
    p.add_argument("--gpu", help="GPU name as NVML reports it, e.g. 'NVIDIA H100 80GB HBM3'")
    p.add_argument("--peak-tflops", type=float, help="override the peak dense TFLOP/s per GPU")
    p.add_argument("--dtype", help="training dtype for the peak (torchtitan's default is bf16 mixed "
                   "precision; the log does not say)")
    p.add_argument("--job", default=None, help="job name (default: the file name)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the text report")


def _model(path: str | None) -> dict[str, object]:
    if path is None:
        return {}
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the model must be a YAML mapping of ModelSpec fields")
    return data


def run(args: argparse.Namespace) -> int:
    from perfd.analytics.run.run_analysis import analyze_run
    from perfd.app.commands.input_checks import check_gpu, check_log, refuse
    from perfd.app.commands.peak_args import check_mfu_possible, check_peak_args
    from perfd.collectors.torchtitan.collector import model_spec
    from perfd.collectors.torchtitan.parser import TorchtitanLogParser
    from perfd.core.logfiles import LogFileError, iter_text_lines
    from perfd.report import analysis_json, build_report, render_text

    why = check_log(args.log) or check_peak_args(args.dtype, args.peak_tflops) or \
        check_gpu(args.gpu, args.peak_tflops)
    if why:
        return refuse(why)
    try:
        spec = model_spec({"model": _model(args.model), "dtype": args.dtype})
    except (OSError, ValueError, TypeError) as exc:
        return refuse(f"--model: {exc}")
    name = args.job or Path(args.log).stem
    parser = TorchtitanLogParser(name, Path(args.log).name, spec)
    records = []
    try:
        for line in iter_text_lines(args.log):
            records.extend(parser.feed(line))
    except (OSError, EOFError, LogFileError) as exc:
        return refuse(f"cannot read {args.log}: {exc}")
    if not records:
        return refuse(f"no torchtitan step lines in {args.log} ({parser.line_no} lines read): is it the "
                      "stdout of a torchtitan run?")
    analysis = analyze_run(parser.job_info, records, gpu_name=args.gpu, peak_tflops=args.peak_tflops,
                           job_name=name, live=False)
    why = check_mfu_possible(analysis, parser.job_info, args.dtype, args.peak_tflops)
    if why:
        return refuse(why)
    if args.json:
        out = analysis_json(analysis)
        out["parse"] = {"counts": dict(parser.counts),
                        "issues": [{"line": i.line_no, "reason": i.reason, "text": i.text}
                                   for i in parser.issues[:200]],
                        "issues_total": len(parser.issues)}
        finite_json.write(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(render_text(build_report(analysis)))
    if parser.issues:
        print(f"\n{len(parser.issues)} log lines could not be used (see --json 'parse').")
    return 0
