"""`perfd catalog`: print the metric catalog."""

from __future__ import annotations

import argparse

from perfd import catalog


def run_catalog(args: argparse.Namespace) -> int:
    if args.markdown:
        print(catalog.render_markdown())
        return 0
    for m in catalog.all_metrics():
        print(f"{m.name:<48} {m.kind:<9} {m.unit:<10} {m.description}")
    return 0
