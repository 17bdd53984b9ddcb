"""The rules an aggregator evaluates: its packs, in order, made one set with one rule per name.
``perfd aggregator`` (``--rules FILE``..., else the shipped ``rules/default.yaml``) and ``perfd rules
check`` both load it here, so a pack the check passes is one the aggregator starts with, and a
rule named like one of an earlier pack is handled the same way in both (the check once
passed a user rule named like a shipped one, and the aggregator given both packs refused to start
on "duplicate rule names").

Overriding: a rule with ``override: true`` replaces the rule of the same name in an earlier pack of
the set (it takes its place); without it, the second rule of a name is an error that says where the
first is and how to override it. An ``override: true`` that replaces nothing is a warning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from perfd.rules.pack_loader import default_pack_path, expand_paths, parse_pack_checked, read_pack
from perfd.rules.rule_types import Rule, RuleError

SHIPPED_PACKS = ("default.yaml", "serving.yaml")  # rules/ beside the package (or installed copies)


@dataclass
class RuleSet:
    rules: list[Rule] = field(default_factory=list)  # in evaluation order, one per name
    errors: list[RuleError] = field(default_factory=list)
    warnings: list[RuleError] = field(default_factory=list)
    packs: list[tuple[str, int]] = field(default_factory=list)  # (path, rules it gave) in order
    replaced: list[tuple[Rule, Rule]] = field(default_factory=list)  # (the rule replaced, its override)


def _where(origin: str) -> tuple[str, int | None]:
    path, _, line = origin.rpartition(":")
    return (path, int(line)) if line.isdigit() else (origin, None)


def load_rule_set(paths: Iterable[str | Path]) -> RuleSet:
    """Every pack of ``paths`` (directories expand to their YAML files), one set: every error and
    warning of every file, and those of names defined twice."""
    out = RuleSet()
    by_name: dict[str, int] = {}  # rule name -> its index in out.rules
    for p in expand_paths(paths):
        text, err = read_pack(p)
        if err is not None:
            out.errors.append(err)
            continue
        assert text is not None
        pack, errs, warns = parse_pack_checked(text, str(p))
        out.errors.extend(errs)
        out.warnings.extend(warns)
        if pack is None:
            continue
        out.packs.append((str(p), len(pack.rules)))
        for rule in pack.rules:
            path, line = _where(rule.origin)
            first = by_name.get(rule.name)
            if first is None:
                if rule.override:
                    out.warnings.append(RuleError(path, line, rule.name, "override: true, but no earlier "
                                                  "pack of the set defines this rule: it overrides nothing"))
                by_name[rule.name] = len(out.rules)
                out.rules.append(rule)
            elif rule.override:
                out.replaced.append((out.rules[first], rule))
                out.rules[first] = rule
            else:
                out.errors.append(RuleError(path, line, rule.name, (
                    f"a rule of this name is already defined at {out.rules[first].origin}: to replace it, "
                    "give this one 'override: true'; to keep both, give this one another name")))
    return out


def shipped_rules() -> dict[str, str]:
    """Rule name -> where it is defined, over the shipped packs (rules/*.yaml)."""
    out: dict[str, str] = {}
    for name in SHIPPED_PACKS:
        p = default_pack_path(name)
        if p.is_file():
            for r in load_rule_set([p]).rules:
                out.setdefault(r.name, r.origin)
    return out
