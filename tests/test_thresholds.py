"""The rule packs hold the playbook's thresholds of perfd/analytics/thresholds.py and
perfd/core/shared_thresholds.py
(declared once).

Each RuleRef names a rule (rules/default.yaml, rules/serving.yaml) or an alert
(deploy/prometheus/perfd.rules.yml); its expression must compare that operand with the threshold's
value, with the declared ``for:``. Every rule whose expression compares with a non-zero number must be
covered by some threshold, so a number added to a pack without a declaration fails here too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfd.analytics import thresholds as th
from perfd.core.shared_thresholds import RuleRef, Threshold

ROOT = Path(__file__).resolve().parents[1]
PACKS = {"default": ROOT / "rules" / "default.yaml", "serving": ROOT / "rules" / "serving.yaml",
         "prometheus": ROOT / "deploy" / "prometheus" / "perfd.rules.yml"}
_NUM = r"([0-9]+(?:\.[0-9]+)?)\s*(%|s\b|m\b)?"
_UNITS = {None: 1.0, "%": 0.01, "s": 1.0, "m": 60.0}


def _rules(pack: str) -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(PACKS[pack].read_text())
    rules = doc["rules"] if "rules" in doc else [r for g in doc["groups"] for r in g["rules"]]
    return {str(r.get("name") or r.get("alert")): r for r in rules if "record" not in r}


def _comparisons(expr: str, operand: str) -> list[tuple[str, float]]:
    pat = re.escape(operand) + r"(?![\w:])\s*(<=|>=|==|!=|<|>)\s*" + _NUM
    return [(m.group(1), float(m.group(2)) * _UNITS[m.group(3)]) for m in re.finditer(pat, expr)]


REFS = [(name, t, ref) for name, t in th.all_thresholds().items() for ref in t.rules]


@pytest.mark.parametrize(("name", "t", "ref"), REFS, ids=[f"{n}-{r.pack}-{r.name}" for n, _, r in REFS])
def test_pack_rule_holds_the_threshold(name: str, t: Threshold, ref: RuleRef) -> None:
    rules = _rules(ref.pack)
    assert ref.name in rules, f"{name}: no rule {ref.name} in {PACKS[ref.pack]}"
    rule = rules[ref.name]
    found = _comparisons(str(rule["expr"]), ref.operand)
    assert found, f"{ref.name}: no comparison on {ref.operand} in {rule['expr']!r}"
    assert any(op == ref.op and abs(v - t.value) < 1e-9 for op, v in found), \
        f"{ref.name}: {rule['expr']!r} differs from {name} ({ref.operand} {ref.op} {t.value:g})"
    assert rule.get("for") == ref.for_, \
        f"{ref.name}: for: {rule.get('for')} but thresholds.py says {ref.for_}"
    own = {r.for_ for r in t.rules if r.pack != "prometheus"}
    if ref.pack == "prometheus" and own and ref.for_ not in own:
        assert ref.note, f"{ref.name}: a different for: than perfd's own rule needs a note saying why"


def test_every_numeric_rule_is_declared() -> None:
    declared = {(r.pack, r.name) for t in th.all_thresholds().values() for r in t.rules}
    missing = []
    for pack in PACKS:
        for rname, rule in _rules(pack).items():
            nums = [float(m.group(2)) for m in re.finditer(r"(<=|>=|<|>)\s*" + _NUM, str(rule["expr"]))]
            if any(n != 0 for n in nums) and (pack, rname) not in declared:
                missing.append(f"{pack}:{rname}")
    assert not missing, f"rules comparing with numbers not declared in thresholds.py: {missing}"


def test_every_threshold_says_why_and_where() -> None:
    for name, t in th.all_thresholds().items():
        # docs/design.md's section, or where it has none (goodput, the engine's sizing), the module or
        # document that defines it
        assert t.why and t.design.startswith(("docs/design.md", "perfd/analytics/", "docs/scale.md")), name


def test_the_check_catches_a_drift() -> None:
    expr = "job_name:perfd_job_mfu_ratio:avg_over_time_10m < 0.25"
    assert _comparisons(expr, "job_name:perfd_job_mfu_ratio:avg_over_time_10m") == [("<", 0.25)]
    [(op, v)] = _comparisons("mfu < 30% and x > 2s", "mfu")
    assert op == "<" and abs(v - 0.30) < 1e-12
    assert _comparisons("mfu_x < 30%", "mfu") == []
