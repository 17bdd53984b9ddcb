"""English only where it is shown (issue 57): the sentences perfd/report declares for the analytics'
codes (perfd.report.provenance_text: metric sources, absence reasons, caveats, straggler notes, a
row's exclusion; the JSON legend's exclusion kinds, perfd.report.row_json; an incident's sentences,
its line and its action, perfd.report.incident_text and incident_findings) are in no analytics
source again. Checked on the source (AST, no import): every literal part of each
template that reads as words is looked for in every string constant of perfd/analytics."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

from perfd.report.provenance_text import TEMPLATE
from perfd.report.row_json import EXCLUSION_TEXT

ROOT = Path(__file__).resolve().parents[1]
WORDS = re.compile(r"[A-Za-z][A-Za-z-]+")
MIN_WORDS = 3  # a shorter fragment ("step time", "unknown") is no sentence: it may be said anywhere


def _fragments(template: str, least: int = MIN_WORDS) -> list[str]:
    """The template's literal runs between its fields that hold at least ``least`` words."""
    parts = [lit.strip(" :;,()") for lit, _, _, _ in string.Formatter().parse(template)]
    return [p for p in parts if len(WORDS.findall(p)) >= least]


def _strings(path: Path) -> list[str]:
    """Every string constant of a module: docstrings, f-strings' literal parts, concatenations."""
    return [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)]


def _found(fragments: dict[str, str], files: list[Path]) -> list[str]:
    out = []
    for f in files:
        for s in _strings(f):
            out += [f"{f.name}: {code} {frag!r}" for frag, code in fragments.items() if frag in s]
    return out


def test_no_analytics_module_words_a_code_again() -> None:
    fragments = {frag: c.name for c, t in TEMPLATE.items() for frag in _fragments(t)}
    fragments |= {frag: f"Exclusion.{k.name}" for k, t in EXCLUSION_TEXT.items() for frag in _fragments(t)}
    assert len(fragments) > 30  # the check looks for real sentences
    files = sorted((ROOT / "perfd" / "analytics").rglob("*.py"))
    assert files
    found = _found(fragments, files)
    assert not found, found


# The modules that word incidents (issue 57): their sentences are f-strings and literals, not a table,
# cut by their fields into pieces; a piece is a sentence from INCIDENT_WORDS words ("of the step", "in
# steady state" are said of other things too).
INCIDENT_TEXT = ("incident_text.py", "incident_findings.py")
INCIDENT_WORDS = 5
# Pieces analytics says of something else, in its own words: a capture finding's title
# (advice/capture_findings.py), the docs of a threshold and of the steady state (thresholds.py, steady.py).
SAID_ELSEWHERE = {"× slower than in steady state", "× the steady time per step", "the rank waited for a CPU"}


def _said(path: Path) -> list[str]:
    """A module's literal sentences: its string constants but its docstrings (which may name what
    analytics says of itself), each cut into fragments as a template is."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [frag for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs
            for frag in _fragments(n.value.replace("{", "{{").replace("}", "}}"), INCIDENT_WORDS)]


def test_no_analytics_module_words_an_incident_again() -> None:
    fragments = {frag: name for name in INCIDENT_TEXT for frag in _said(ROOT / "perfd" / "report" / name)
                 if frag not in SAID_ELSEWHERE}
    assert len(fragments) > 40  # the check looks for real sentences
    found = _found(fragments, sorted((ROOT / "perfd" / "analytics").rglob("*.py")))
    assert not found, found


def test_the_check_finds_a_sentence_said_in_a_module(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('def why(n):\n'
                     '    return f"no {n} timers present, " "forward-backward timer is zero"\n')
    fragments = {frag: c.name for c, t in TEMPLATE.items() for frag in _fragments(t)}
    assert [x.split(": ", 1)[1] for x in _found(fragments, [probe])] == [
        "FB_ZERO 'forward-backward timer is zero'"]
    # and an incident's sentence, as the incident used to word itself in analytics (detect.py)
    probe.write_text('def cause(inc):\n'
                     '    return f"the straggler detector named rank {inc.rank} the slowest"\n')
    said = {frag: name for name in INCIDENT_TEXT for frag in _said(ROOT / "perfd" / "report" / name)}
    assert [x.split(": ", 1)[1] for x in _found(said, [probe])] == [
        "incident_text.py 'the straggler detector named rank'"]
