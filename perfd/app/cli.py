"""`perfd` command line. Sub-commands live in perfd/app/commands/; this file only wires arguments.

Heavy imports (grpc, pynvml, analytics) happen inside the sub-command so that `perfd --help`
stays fast and a missing optional dependency only breaks the command that needs it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TextIO

from perfd import __version__
from perfd.core import limits as L
from perfd.core.logline import OneLineFormatter


def _add_analyze(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("analyze", help="analyse a log or a capture offline")
    asub = p.add_subparsers(dest="what", required=True)
    m = asub.add_parser("megatron", help="analyse a Megatron-LM log (stdout of all ranks)")
    m.add_argument("log", help="path to the log file ('-' for stdin)")
    m.add_argument("--gpu", help="GPU name as NVML reports it, e.g. 'NVIDIA H200'; a Megatron log does not "
                   "name its GPU, so without this (or --peak-tflops) MFU is absent")
    m.add_argument("--peak-tflops", type=float, help="override the peak dense TFLOP/s per GPU")
    m.add_argument("--dtype", help="training dtype for the peak (default: from the log's arguments)")
    m.add_argument("--job", default=None, help="job name (default: the file name)")
    m.add_argument("--json", action="store_true", help="print JSON instead of the text report")
    m.add_argument("--capture", metavar="TRACE", help="a capture of the job (Kineto/Chrome trace .json[.gz], "
                   "nsys .nsys-rep or .sqlite): its timeline votes for the bottleneck class and gives the "
                   "step budget, as it does live")
    m.add_argument("--capture-steps", type=int, metavar="N", help="iterations the capture holds, when the "
                   "trace marks none (default: the steps it marks, else its span over the steady step time)")
    m.add_argument("--capture-force", action="store_true", help="read the capture even where it does not "
                   "match the log's job (the tokens of its layer norms, its pipeline SendRecv, its NCCL "
                   "kernels or its kernel time for the job's FLOPs are another job's: refused without this, "
                   "exit 2); the report states the mismatch")
    from perfd.app.commands.analyze import add_iterations_argument

    add_iterations_argument(m)
    from perfd.app.commands.analyze import add_sglang_arguments

    add_sglang_arguments(asub.add_parser("sglang", help="analyse an SGLang server log (and its /metrics)"))
    from perfd.app.commands.analyze_capture import add_arguments as add_capture_arguments

    add_capture_arguments(asub)
    from perfd.app.commands.analyze_torchtitan import add_arguments as add_torchtitan_arguments

    add_torchtitan_arguments(asub)
    from perfd.app.commands.ncu import add_analyze_arguments as add_ncu_arguments

    add_ncu_arguments(asub)


def _add_catalog(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("catalog", help="list every metric perfd reports")
    p.add_argument("--markdown", action="store_true", help="as a Markdown table")
    p.add_argument("--doc", action="store_true", help="the whole docs/metrics.md page")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help shows its default (unless it says one itself, or there is none to show);
    descriptions and the examples in epilogs keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        d = action.default
        if ("default" not in text and d not in (None, False, argparse.SUPPRESS, [])
                and action.option_strings and action.nargs != 0):
            text += f" (default: {d})"
        return text


# One example per command, shown at the end of its --help ("perfd analyze megatron" -> text).
EXAMPLES: dict[str, str] = {
    "perfd": "perfd demo\n  perfd analyze megatron train.log --gpu 'NVIDIA H200'\n  "
             "perfd top --aggregator http://127.0.0.1:9401",
    "perfd analyze": "perfd analyze megatron train.log --gpu 'NVIDIA H200' --dtype bf16",
    "perfd analyze megatron": "perfd analyze megatron train.log.gz --gpu 'NVIDIA H100 80GB HBM3' "
                              "--dtype bf16\n  "
                              "perfd analyze megatron train.log --gpu 'NVIDIA H200' --json | jq .summary",
    "perfd analyze torchtitan": "perfd analyze torchtitan train.log --model llama3_debug.yaml --dtype bf16 "
                                "--gpu 'NVIDIA H100 80GB HBM3'",
    "perfd analyze sglang": "perfd analyze sglang server.log --gpu 'NVIDIA H200' --model-params 8B "
                            "--dtype bf16 "
                            "--metrics http://127.0.0.1:30000/metrics",
    "perfd analyze nsys": "perfd analyze nsys capture.nsys-rep --json",
    "perfd analyze trace": "perfd analyze trace /tmp/perfd-kineto/trace_1234.json.gz",
    "perfd analyze ncu": "perfd analyze ncu rank0.ncu-rep --capture trace_1234.json.gz",
    "perfd catalog": "perfd catalog --markdown > metrics.md",
    "perfd agent": "perfd agent --aggregator 127.0.0.1:50051 --job gpt-8b --megatron-log /logs/train.log "
                   f"--nvml real --metrics-port {L.AGENT_METRICS_PORT}",
    "perfd aggregator": "perfd aggregator --grpc-port 50051 --http-port 9401",
    "perfd shard": "perfd shard --engine nats://nats-0:4222,nats://nats-1:4222,nats://nats-2:4222 "
                   "--id shard-0 --engine-token-file /run/secrets/nats-token --engine-replicas 3",
    "perfd engine": "perfd engine serve --dir /tmp/perfd-engine",
    "perfd engine serve": "perfd engine serve --dir /tmp/perfd-engine --servers 3",
    "perfd demo": "perfd demo --speed 4",
    "perfd rules": "perfd rules check rules/*.yaml",
    "perfd rules check": "perfd rules check rules/default.yaml rules/serving.yaml",
    "perfd bench": "perfd bench parse",
    "perfd report": "perfd report --html report.html --log train.log --gpu 'NVIDIA H200'\n  "
                    "perfd report --html report.html --aggregator http://127.0.0.1:9401 --job gpt-8b",
    "perfd launch": "perfd launch --job gpt-8b --kineto --flight-recorder /tmp/fr -- "
                    "torchrun --nproc-per-node 8 "
                    "pretrain_gpt.py ...",
    "perfd capture": "perfd capture --job gpt-8b --ranks 1 --steps 3 --tool kineto",
    "perfd nsys-prefix": "torchrun --no-python --nproc-per-node 2 $(perfd nsys-prefix --job gpt-8b) "
                         "python train.py",
    "perfd nsys-exec": "RANK=0 perfd nsys-exec --job gpt-8b -- python train.py   "
                       "# what nsys-prefix prints does this per rank",
    "perfd ncu-prefix": "torchrun --no-python --nproc-per-node 8 $(perfd ncu-prefix --job gpt-8b --ranks 3 "
                        "--kernels-from latest) python train.py",
    "perfd ncu-exec": "RANK=3 perfd ncu-exec --job gpt-8b --ranks 3 -- python train.py   "
                      "# what ncu-prefix prints does this per rank",
    "perfd top": "perfd top --aggregator http://127.0.0.1:9401 --job gpt-8b\n  "
                 "perfd top --once   # one screen, then exit (scripts)",
}


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every sub-command parser below it."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out.extend(_subparsers(child))
    return out


def _finish(parser: argparse.ArgumentParser) -> None:
    """Give every (sub-)command the shared formatter and its example."""
    for p in _subparsers(parser):
        p.formatter_class = _HelpFormatter
        example = EXAMPLES.get(p.prog)
        if example and not p.epilog:
            p.epilog = f"example:\n  {example}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfd",
        description="Performance daemon for distributed GPU training and LLM serving.",
    )
    parser.add_argument("--version", action="version", version=f"perfd {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_analyze(sub)
    _add_catalog(sub)
    from perfd.app.commands import register_live_commands

    register_live_commands(sub)
    _finish(parser)
    return parser


def log_handler(stream: TextIO | None = None) -> logging.Handler:
    """Where every perfd command logs (stderr unless ``stream``): one line per record, whatever a
    client put in it (perfd.core.logline)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), handlers=[log_handler()])
    try:
        if args.command == "analyze":
            from perfd.app.commands.analyze import run_analyze

            return run_analyze(args)
        if args.command == "catalog":
            from perfd.app.commands.catalog_docs import run_catalog

            return run_catalog(args)
        handler = getattr(args, "handler", None)
        if handler is None:
            parser.error(f"unknown command {args.command}")
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `perfd ... | head` must not print a traceback
        return 0


if __name__ == "__main__":
    sys.exit(main())
