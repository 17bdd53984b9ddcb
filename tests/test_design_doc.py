"""The design reference the code cites is in the repository, and every citation of it resolves.

Source comments, docstrings, threshold declarations and docs cite ``docs/design.md §N`` (sometimes
with the part's name: ``§3 "Transport"``, ``§2 Diagnosis playbook``). A citation of a design file
kept outside the repository cannot be followed from a clone; a citation of a section or a part the
page does not have cannot be followed either; nor can a path outside the repository, in any tracked
file. Values the page quotes as ```NAME` = value`` must be the ones the code declares.
"""

from __future__ import annotations

import fnmatch
import os
import re
from functools import cache
from pathlib import Path

import pytest

from perfd.analytics import thresholds as th

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
CITED = "docs/design.md"

# Any spelling of a file named design.md: only the repository's, spelled exactly CITED, may be cited.
_ANY_DESIGN = re.compile(r"design\.md", re.IGNORECASE)
# Folders outside the repository that facts and fixtures used to be read from, by absolute or relative
# path: a clone has neither, so a file that names them cites something no reader can open.
_OUTSIDE = re.compile(r"(?:/work/|\.\./)(?:shared|briefs)\b")
_SECTION_MARK = re.compile(r"§\s*(\d+(?:\.\d+)*)")
_MD_FILE = re.compile(r"[\w./-]+\.md\b")
_QUOTED_PART = re.compile(r'\s+"([^"\n]+)"')
_NAMED_PART = re.compile(r" ([A-Z][\w-]*(?: [a-z][\w-]*)*)")
_QUOTED_VALUE = re.compile(r"`([A-Z][A-Z0-9_]*)` = (-?\d+(?:\.\d+)?)(\s*%)?")
def _gitignore_rules(text: str) -> list[tuple[bool, bool, str]]:
    """The root .gitignore's patterns as (anchored, folders only, name glob). Its lines are of the forms
    read here (``NAME/``, ``/NAME/``, ``*.ext/``, ``NAME``: one path component, no negation, no ``**``);
    another form fails the test, naming the line, rather than being read wrong."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        anchored, body = line.startswith("/"), line.lstrip("/")
        folders, body = body.endswith("/"), body.rstrip("/")
        assert body and "/" not in body and not line.startswith("!") and "**" not in body, \
            f".gitignore line {line!r}: a form _candidate_paths does not read (one path component only)"
        rules.append((anchored, folders, body))
    return rules


def _ignored(rules: list[tuple[bool, bool, str]], name: str, top: bool, folder: bool) -> bool:
    return any((top or not anchored) and (folder or not folders) and fnmatch.fnmatchcase(name, glob)
               for anchored, folders, glob in rules)


def _ignore_files() -> list[Path]:
    """The root .gitignore and the repository's own info/exclude (git's --exclude-standard reads both:
    a checkout's local scratch folders are listed there). In a worktree .git is a file naming its git
    dir, whose commondir is the repository's."""
    git = ROOT / ".git"
    if git.is_file():
        gitdir = Path(git.read_text().split("gitdir:", 1)[1].strip())
        common = gitdir / "commondir"
        git = (gitdir / common.read_text().strip()).resolve() if common.is_file() else gitdir
    return [f for f in (ROOT / ".gitignore", git / "info" / "exclude") if f.is_file()]


def _candidate_paths() -> list[Path]:
    """The files `git ls-files --cached --others --exclude-standard` lists, read from the work tree in
    this process: every file but .git and what the ignore files say (a folder ignored is not entered).
    A .gitignore below the root applies to its own folder and below (a tool's cache writes one of
    ``*``), each pattern anchored there, as git reads it."""
    base = [r for f in _ignore_files() for r in _gitignore_rules(f.read_text())]
    scoped: dict[Path, list[tuple[Path, list[tuple[bool, bool, str]]]]] = {ROOT: [(ROOT, base)]}
    found = []
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder)
        scopes = scoped.pop(here)
        if here != ROOT and ".gitignore" in files:
            scopes = [*scopes, (here, _gitignore_rules((here / ".gitignore").read_text()))]

        def ignored(name: str, is_dir: bool, scopes: list[tuple[Path, list[tuple[bool, bool, str]]]] = scopes,
                    here: Path = here) -> bool:
            return any(_ignored(rules, name, here == at, is_dir) for at, rules in scopes)

        dirs[:] = sorted(d for d in dirs if d != ".git" and not ignored(d, True))
        for d in dirs:
            scoped[here / d] = scopes
        for f in sorted(files):
            if here == ROOT and f == ".git":  # a worktree's .git is a file naming its repository
                continue
            if not ignored(f, False):
                found.append(here / f)
    return found


@cache
def _texts() -> dict[str, str]:
    """Every text file of the repository by its relative path (binary and unreadable ones left out)."""
    texts = {}
    for path in _candidate_paths():
        if path == Path(__file__).resolve():  # its examples of broken citations are on purpose
            continue
        try:
            data = path.read_bytes()
        except OSError:  # listed by git but deleted in the work tree
            continue
        if b"\0" in data[:8192]:
            continue
        try:
            texts[path.relative_to(ROOT).as_posix()] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def _sections(doc: str) -> dict[str, list[str]]:
    """Section number -> its title and the names of its parts (``### `` headings), lower case."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in doc.splitlines():
        top = re.match(r"## (\d+(?:\.\d+)*)\. (.+)$", line)
        if top:
            current = sections.setdefault(top.group(1), [top.group(2).strip().lower()])
            continue
        sub = re.match(r"### (?:(\d+(?:\.\d+)+)\.? )?(.+)$", line)
        if sub and current is not None:
            current.append(sub.group(2).strip().lower())
            if sub.group(1):  # a numbered part is a section of its own too
                sections.setdefault(sub.group(1), [sub.group(2).strip().lower()])
    return sections


def _names_part(names: list[str], name: str) -> bool:
    name = name.strip().lower()
    return any(n == name or n.startswith(name + ":") or n.startswith(name + " ") for n in names)


def _citations(path: str, text: str) -> list[tuple[int, str, str | None]]:
    """(line, section, part name or None) of every citation of the design page in one file. A §
    belongs to the design page when the nearest file named before it (within 200 characters) is the
    page, or, in the page itself, when no other file is named there."""
    found = []
    for m in _SECTION_MARK.finditer(text):
        before = text[max(0, m.start() - 200):m.start()]
        files = _MD_FILE.findall(before)
        if files:
            if not files[-1].endswith(CITED):
                continue
        elif path != CITED:
            continue
        rest = text[m.end():m.end() + 100]
        part = _QUOTED_PART.match(rest) or _NAMED_PART.match(rest)
        found.append((text.count("\n", 0, m.start()) + 1, m.group(1), part.group(1) if part else None))
    return found


def check_citations(texts: dict[str, str], doc: str) -> list[str]:
    """What is wrong with the citations in ``texts`` against the design page ``doc``."""
    sections = _sections(doc)
    problems = []
    for path, text in sorted(texts.items()):
        for m in _ANY_DESIGN.finditer(text):
            if text[max(0, m.start() - 5):m.start()] != "docs/" or m.group() != "design.md":
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{path}:{line}: cites a design file other than {CITED}: "
                                f"{text[max(0, m.start() - 20):m.end()]!r}")
        for m in _OUTSIDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{path}:{line}: cites a file outside the repository")
        for line, section, part in _citations(path, text):
            if section not in sections:
                problems.append(f"{path}:{line}: {CITED} has no §{section}")
            elif part is not None and not _names_part(sections[section], part):
                problems.append(f"{path}:{line}: {CITED} §{section} has no part {part!r} "
                                f"(its parts: {sections[section]})")
    return problems


def test_the_design_page_has_its_sections() -> None:
    sections = _sections(DESIGN.read_text())
    assert [s for s in sections if "." not in s] == ["1", "2", "3", "4", "5"]
    assert "/work/" not in DESIGN.read_text()


def test_every_citation_resolves_inside_the_repository() -> None:
    texts = _texts()
    assert CITED in texts and "perfd/analytics/thresholds.py" in texts
    assert sum(len(_citations(p, t)) for p, t in texts.items()) > 50  # the scan sees them at all
    problems = check_citations(texts, texts[CITED])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("text, wrong", [
    ('x = 1  # see DESIGN.md §2', "other than"),
    ('x = 1  # see ../shared/DESIGN.md §2', "other than"),
    ('"""From /work/shared/design.md §2."""', "other than"),
    ("# (docs/design.md §9)", "has no §9"),
    ('# docs/design.md §3 "Transports"', "has no part 'Transports'"),
    ("_D = 'docs/design.md §2 Diagnosis playbooks'", "has no part 'Diagnosis playbooks'"),
    ("# the bytes are in ../shared/fixtures", "outside the repository"),
    ('LOG = Path("/work/shared/fixtures/megatron/a.log")', "outside the repository"),
    ("measured on the H100 (`/work/shared/gpu/README.md`)", "outside the repository"),
    ("| `/work/briefs/probe/run.sh` |", "outside the repository"),
    ("see ../shared", "outside the repository"),
])
def test_the_check_catches_a_broken_citation(text: str, wrong: str) -> None:
    problems = check_citations({"perfd/x.py": text}, DESIGN.read_text())
    assert problems and all(p.startswith("perfd/x.py:1: ") for p in problems), problems
    assert any(wrong in p for p in problems), problems


def test_the_check_reads_parts_and_other_pages() -> None:
    doc = DESIGN.read_text()
    ok = ('# docs/design.md §3 "Transport"; docs/design.md §2 Stragglers (root-cause hints), §3 GPM; '
          "docs/design.md §4 Targets; docs/design.md §2 has none; docs/collectives.md §9")
    assert check_citations({"perfd/x.py": ok}, doc) == []


def test_values_the_page_quotes_are_the_declared_ones() -> None:
    declared = th.all_thresholds()
    quoted = _QUOTED_VALUE.findall(DESIGN.read_text())
    assert len(quoted) >= 10
    for name, number, percent in quoted:
        assert name in declared, f"docs/design.md quotes {name}, which no thresholds module declares"
        value = float(number) / (100 if percent else 1)
        assert declared[name].value == pytest.approx(value), (name, declared[name].value, value)
