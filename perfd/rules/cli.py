"""``perfd rules check FILE...``: validate rule packs, print every error, exit 0 or 1.

The lead wires :func:`run_rules_check` into the CLI; it takes the paths and returns the exit code.
"""

from __future__ import annotations

import sys
from typing import TextIO

from perfd.rules.loader import check_files, expand_paths, load_pack


def run_rules_check(paths: list[str], out: TextIO | None = None) -> int:
    """Print ``FILE:LINE: rule NAME: reason`` for each error (all of them), or one OK line per file."""
    stream = out if out is not None else sys.stdout
    if not paths:
        print("perfd rules check: no files given", file=stream)
        return 1
    errors = check_files(paths)
    for e in errors:
        print(e, file=stream)
    if errors:
        files = len({e.path for e in errors})
        print(f"{len(errors)} error(s) in {files} file(s)", file=stream)
        return 1
    for p in expand_paths(paths):
        print(f"{p}: OK, {len(load_pack(p).rules)} rule(s)", file=stream)
    return 0
