"""`perfd top`: its parser, and the screen (perfd.app.commands.top_screen) loaded only when it runs.

Apart because every `perfd` command builds the whole parser at its start: the screen's imports (rich,
the budget and plan views, the advice registry) cost 0.35 s of CPU and ~12 MB a process, which
`perfd agent` and the per-rank wrappers (`perfd ncu-exec`, `perfd nsys-exec`) paid at every start.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="watch a running aggregator in the terminal (jobs, ranks, GPUs)")
    p.add_argument("--aggregator", default="http://127.0.0.1:9401", metavar="URL",
                   help="the aggregator's HTTP address")
    p.add_argument("--job", help="the job to show in detail (default: the job with the latest step when "
                                 "top starts; n / p switch jobs)")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one screen and exit (for scripts)")
    p.add_argument("--wait-steps", type=int, metavar="N",
                   help="with --once and --job: first wait until the job has reported its step N (a "
                        "script that starts a job waits on that, not on a sleep); exit 1 if it has not "
                        "within --wait-s")
    p.add_argument("--wait-s", type=float, default=60.0, metavar="S",
                   help="how long --wait-steps waits (default: %(default)s)")
    p.add_argument("--auth-token-file", metavar="FILE",
                   help="the bearer token the aggregator requires (its --auth-token-file)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from perfd.app.commands.top_screen import run as show

    return show(args)
