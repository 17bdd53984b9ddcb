"""Hypothesis's checks of time are off for the whole suite, declared once (conftest.py's profile): no
example fails for the wall clock it took, and no test module says so again (a scan of every
``settings(...)`` call under the test paths for the two keywords the profile owns)."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
OWNED = {"deadline", "suppress_health_check"}  # suppress_health_check only where it names too_slow


def _settings_calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == "settings" or getattr(n.func, "attr", None) == "settings")]


def test_the_profile_has_no_time_checks() -> None:
    now = settings.default
    assert now is not None and now.deadline is None
    assert HealthCheck.too_slow in now.suppress_health_check


def test_no_module_declares_them_again() -> None:
    said = []
    for top in ("tests", "perfd/collectors"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for call in _settings_calls(ast.parse(path.read_text(), str(path))):
                for kw in call.keywords:
                    if kw.arg == "deadline" or (kw.arg in OWNED and "too_slow" in ast.unparse(kw.value)):
                        said.append(f"{path.relative_to(ROOT)}:{call.lineno} {kw.arg}")
    assert said == [], "conftest.py's hypothesis profile owns these: " + ", ".join(said)
