"""Sub-commands of the `perfd` CLI, one module each. Each registers its parser and a handler."""

from __future__ import annotations

import argparse


def register_live_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the sub-commands of the live pipeline (agent, aggregator, demo, record, ...)."""
    from perfd.app.commands import bench, capture, engine, launch, live, ncu, report, top

    live.register(sub)
    bench.register(sub)
    report.register(sub)
    launch.register(sub)
    capture.register(sub)
    ncu.register(sub)
    top.register(sub)
    engine.register(sub)
