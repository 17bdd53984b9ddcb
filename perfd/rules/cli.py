"""``perfd rules check FILE...``: validate rule packs, print every error and warning, exit 0 or 1.

The lead wires :func:`run_rules_check` into the CLI; it takes the paths and returns the exit code.
A warning (a rule that loads but reads a series its scope never holds, so it never fires) is
printed and does not fail the check: the pack would load and run as written.
"""

from __future__ import annotations

import sys
from typing import TextIO

from perfd.rules.loader import check_files_warned, expand_paths, load_pack


def run_rules_check(paths: list[str], out: TextIO | None = None) -> int:
    """Print ``FILE:LINE: rule NAME: reason`` for each error and warning (all of them), or one OK
    line per file."""
    stream = out if out is not None else sys.stdout
    if not paths:
        print("perfd rules check: no files given", file=stream)
        return 1
    errors, warnings = check_files_warned(paths)
    for e in errors + warnings:
        print(e, file=stream)
    if errors:
        files = len({e.path for e in errors})
        print(f"{len(errors)} error(s) in {files} file(s)", file=stream)
        return 1
    warned = {w.path for w in warnings}
    for p in expand_paths(paths):
        n = sum(1 for w in warnings if w.path == str(p))
        note = f", {n} warning(s)" if str(p) in warned else ""
        print(f"{p}: OK, {len(load_pack(p).rules)} rule(s){note}", file=stream)
    return 0
