"""``perfd rules check [FILE...]``: validate the set of rule packs the aggregator would load, print
every error and warning, exit 0 or 1.

The set is checked as ``perfd aggregator --rules FILE...`` loads it (perfd.rules.ruleset: the packs
in order, one rule per name, ``override: true`` to replace an earlier pack's rule), or, with no
FILE, the shipped ``rules/default.yaml`` the aggregator loads without ``--rules``. A user rule
named like a shipped rule whose pack is not in the set is noted with how to override it, should
that pack be added. A warning (a rule that loads but reads a series its scope never holds, so it
never fires; an override that replaces nothing) is printed and does not fail the check.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from perfd.rules.pack_loader import default_pack_path
from perfd.rules.ruleset import load_rule_set, shipped_rules


def run_rules_check(paths: list[str], out: TextIO | None = None) -> int:
    """Print ``FILE:LINE: rule NAME: reason`` for each error and warning (all of them), then one OK
    line per file and what the aggregator would load."""
    stream = out if out is not None else sys.stdout
    files = paths or [str(default_pack_path())]
    rs = load_rule_set(files)
    for e in rs.errors + rs.warnings:
        print(e, file=stream)
    if rs.errors:
        n = len({e.path for e in rs.errors})
        print(f"{len(rs.errors)} error(s) in {n} file(s)", file=stream)
        return 1
    for path, n_rules in rs.packs:
        n = sum(1 for w in rs.warnings if w.path == path)
        print(f"{path}: OK, {n_rules} rule(s){f', {n} warning(s)' if n else ''}", file=stream)
    for old, new in rs.replaced:
        print(f"{new.origin}: rule {new.name}: overrides the rule of {old.origin}", file=stream)
    in_set = {str(Path(p).resolve()) for p, _ in rs.packs}
    for r in rs.rules:
        where = shipped_rules().get(r.name)
        if where is not None and str(Path(where.rpartition(":")[0]).resolve()) not in in_set:
            print(f"{r.origin}: rule {r.name}: note: a shipped rule has this name ({where}); to use both "
                  f"packs, give this one 'override: true' (it then replaces the shipped one)", file=stream)
    how = "perfd aggregator" + ("".join(f" --rules {f}" for f in paths) if paths else " (no --rules)")
    print(f"{how} loads {len(rs.rules)} rule(s)"
          + (f", {len(rs.replaced)} replaced by override" if rs.replaced else ""), file=stream)
    return 0
