"""No comment or docstring in perfd/, tests/ or tools/ cites an issue number: a comment says why the code
is as it is, and an issue's number means nothing in a clone. Evidence is cited by its file (an entry under
docs/evidence/entries/ or a folder beside it), history by what it taught. Comments are read with
tokenize and docstrings with ast, so a string that is data (a recorded log line, a report heading a GPU
script writes) is not read; a third-party bug is cited by its URL, which the pattern does not match."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATTERN = re.compile(r"\b[Ii]ssues? ?#?[0-9]+")
TOPS = ("perfd", "tests", "tools")


def _files() -> Iterator[Path]:
    for top in TOPS:
        yield from sorted((ROOT / top).rglob("*.py"))


def _comments(text: str) -> Iterator[tuple[int, str]]:
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def _docstrings(text: str) -> Iterator[tuple[int, str]]:
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                yield body[0].lineno, body[0].value.value


def issue_citations(text: str, name: str) -> list[str]:
    """Each ``name:line: match`` of the pattern in the source's comments and docstrings, by line."""
    read = [*_comments(text), *_docstrings(text)]
    hits = [(line, m.group(0)) for line, s in read for m in PATTERN.finditer(s)]
    return [f"{name}:{line}: {match!r}" for line, match in sorted(hits)]


def test_no_comment_or_docstring_cites_an_issue_number() -> None:
    # Only a file whose text matches the pattern anywhere can cite one: the others (nearly all) are not
    # tokenized and parsed (11 s of the suite's CPU for ~1,000 files, read whole).
    texts = ((path, path.read_text()) for path in _files())
    found = [hit for path, text in texts if PATTERN.search(text)
             for hit in issue_citations(text, path.relative_to(ROOT).as_posix())]
    assert not found, "cite the evidence or say why, not the issue:\n" + "\n".join(found)


def test_the_check_reads_comments_and_docstrings_only() -> None:
    src = ('"""Module, issue 12."""\n'
           "X = 'a log line, issue 13'  # a comment, Issue #14\n"
           "def f() -> None:\n"
           '    """See https://github.com/pytorch/pytorch/issues/143890."""\n'
           "    print(f'issue {X} 17')\n"
           "class C:\n"
           "    \'\'\'issues 15 and 16\'\'\'\n")
    assert issue_citations(src, "probe.py") == [
        "probe.py:1: 'issue 12'", "probe.py:2: 'Issue #14'", "probe.py:7: 'issues 15'"]
