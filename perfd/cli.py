"""`perfd` command line. Sub-commands live in perfd/commands/; this file only wires arguments.

Heavy imports (grpc, pynvml, analytics) happen inside the sub-command so that `perfd --help`
stays fast and a missing optional dependency only breaks the command that needs it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from perfd import __version__


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
    m.add_argument("--iterations", action="store_true",
                   help="text mode: also print a per-iteration table")
    from perfd.commands.analyze import add_sglang_arguments

    add_sglang_arguments(asub.add_parser("sglang", help="analyse an SGLang server log (and its /metrics)"))
    from perfd.commands.analyze_capture import add_arguments as add_capture_arguments

    add_capture_arguments(asub)


def _add_catalog(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("catalog", help="list every metric perfd reports")
    p.add_argument("--markdown", action="store_true", help="as a Markdown table")
    p.add_argument("--doc", action="store_true", help="the whole docs/metrics.md page")


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
    from perfd.commands import register_live_commands

    register_live_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "analyze":
            from perfd.commands.analyze import run_analyze

            return run_analyze(args)
        if args.command == "catalog":
            from perfd.commands.catalog import run_catalog

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
