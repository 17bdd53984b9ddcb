"""The capture tool list is declared once (perfd.core.model.CaptureTool); everyone else derives from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from perfd.app.commands import capture as capture_cmd
from perfd.capture import request as capture_request
from perfd.core.model import CAPTURE_TOOLS
from perfd.rules import rule_types as rules_model

ROOT = Path(__file__).resolve().parents[1]


def _tool_literals(path: Path) -> list[int]:
    """Line numbers of tuple/list/set literals (or Literal[...] subscripts) naming every tool."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[int] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Tuple | ast.List | ast.Set):
            continue
        names = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if names >= set(CAPTURE_TOOLS):
            out.append(node.lineno)
    return out


@pytest.mark.slow
def test_tool_list_written_only_in_model():
    found = {str(p.relative_to(ROOT)): lines
             for d in ("perfd", "collectors") for p in (ROOT / d).rglob("*.py")
             if "tests" not in p.parts and (lines := _tool_literals(p))}
    assert found == {"perfd/core/model.py": found.get("perfd/core/model.py", [])}, found
    assert "perfd/core/model.py" in found


def test_consumers_use_the_declaration():
    assert rules_model.TOOLS == capture_request.TOOLS == CAPTURE_TOOLS == ("kineto", "nsys", "ncu", "auto")
    import argparse

    ap = argparse.ArgumentParser()
    capture_cmd.register(ap.add_subparsers())
    ns = ap.parse_args(["capture", "--job", "j", "--tool", "nsys"])
    assert ns.tool == "nsys"
    assert ap.parse_args(["capture", "--job", "j", "--tool", "ncu"]).tool == "ncu"
