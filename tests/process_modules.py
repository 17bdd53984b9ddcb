"""Which test modules start a process, read from their source (an AST scan; nothing is run):
``python -m tests.process_modules`` prints the count, ``-v`` each module and what it calls, ``-t`` each
test function that does (before parametrization).

A module starts a process where it calls subprocess's functions (run, Popen, call, check_call,
check_output), asyncio's create_subprocess_*, os.fork/system/spawn*/exec*, multiprocessing (a Process,
a Pool, a context), or tests/procs.py's helpers that start one (Procs, start_aggregator, start_agent,
run_group); or where a test of it asks for a fixture of a conftest.py above it that does."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
OS = {"fork", "system", "spawnv", "spawnl", "spawnve", "spawnle", "execv", "execve", "execvp", "posix_spawn",
      "posix_spawnp", "popen"}
ASYNCIO = {"create_subprocess_exec", "create_subprocess_shell"}
MULTIPROCESSING = {"Process", "Pool", "get_context"}
HELPERS = {"Procs", "start_aggregator", "start_agent", "run_group"}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def starts(tree: ast.AST) -> set[str]:
    """What of the above ``tree`` calls, by the name it is called by."""
    from_imports: dict[str, str] = {}  # local name -> module.name
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                from_imports[a.asname or a.name] = f"{node.module}.{a.name}"
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if not name:
            continue
        head, _, last = name.rpartition(".")
        full = from_imports.get(name, name) if not head else name
        mod, _, fn = full.rpartition(".")
        if ((mod.endswith("subprocess") and fn in SUBPROCESS) or (mod == "os" and fn in OS)
                or (mod.endswith("asyncio") and fn in ASYNCIO)
                or (mod.split(".")[0] in ("multiprocessing", "mp") and fn in MULTIPROCESSING)
                or (fn in HELPERS and (mod.endswith("procs") or not mod))
                or (last == "perfd" and head.endswith("procs"))):
            found.add(full)
    return found


def _fixtures_starting(conftest: Path) -> set[str]:
    tree = ast.parse(conftest.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                "fixture" in _dotted(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list):
            if starts(node) or starts_via_module_helpers(tree, node):
                names.add(node.name)
    return names


def starts_via_module_helpers(tree: ast.Module, fn: ast.FunctionDef) -> bool:
    """``fn`` calls a function of its own module that starts a process."""
    local = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    called = {_dotted(c.func) for c in ast.walk(fn) if isinstance(c, ast.Call)}
    return any(name in local and local[name] is not fn and starts(local[name]) for name in called)


def _local_starters(tree: ast.Module) -> set[str]:
    """The module's own functions that start a process, directly or through another of them."""
    local = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for n in tree.body:
        if isinstance(n, ast.ClassDef):
            local.update({f"{n.name}.{m.name}": m for m in n.body
                          if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))})
    found = {name for name, fn in local.items() if starts(fn)}
    while True:
        more = {name for name, fn in local.items() if name not in found and any(
            _dotted(c.func) in found or _dotted(c.func).split(".")[-1] in found
            for c in ast.walk(fn) if isinstance(c, ast.Call))}
        if not more:
            return found
        found |= more


def starting_tests(path: Path, fixtures: set[str]) -> list[str]:
    """The test functions of ``path`` that start a process: directly, through a function of their
    module that does, or through a fixture (of the module or a conftest above it) that does."""
    tree = ast.parse(path.read_text())
    local = _local_starters(tree)
    fixtures = fixtures | {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in local
                           and any("fixture" in _dotted(d.func if isinstance(d, ast.Call) else d)
                                   for d in n.decorator_list)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            calls = {_dotted(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
            if (starts(node) or calls & local or {c.split(".")[-1] for c in calls} & local
                    or any(a.arg in fixtures for a in node.args.args)):
                out.append(node.name)
    return out


def test_modules() -> list[Path]:
    return sorted(p for top in ("tests", "collectors") for p in (ROOT / top).rglob("test_*.py")
                  if "/gpu/" not in str(p.relative_to(ROOT)) or p.name.startswith("test_"))


def conftest_fixtures() -> dict[Path, set[str]]:
    got = {p.parent: _fixtures_starting(p) for top in ("tests", "collectors")
           for p in (ROOT / top).rglob("conftest.py")}
    got[ROOT] = _fixtures_starting(ROOT / "conftest.py")
    return got


def scan() -> dict[Path, set[str]]:
    """Each test module that starts a process -> what it calls (or the fixture it asks for)."""
    conftests = conftest_fixtures()
    out: dict[Path, set[str]] = {}
    for path in test_modules():
        tree = ast.parse(path.read_text())
        got = starts(tree)
        fixtures = {f for d, names in conftests.items() if path.is_relative_to(d) for f in names}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                got |= {f"fixture {a.arg}" for a in node.args.args if a.arg in fixtures}
        if got:
            out[path] = got
    return out


def main(argv: list[str]) -> int:
    found = scan()
    if "-v" in argv:
        for path, what in found.items():
            print(f"{path.relative_to(ROOT)}: {', '.join(sorted(what))}")
    conftests = conftest_fixtures()
    tests = {path: starting_tests(path, {f for d, names in conftests.items() if path.is_relative_to(d)
                                         for f in names}) for path in found}
    if "-t" in argv:
        for path, names in tests.items():
            for name in names:
                print(f"{path.relative_to(ROOT)}::{name}")
    print(f"{len(found)} of {len(test_modules())} test modules start a process; "
          f"{sum(map(len, tests.values()))} test functions in them do")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
