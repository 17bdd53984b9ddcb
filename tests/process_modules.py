"""Which test modules start a process, read from their source (an AST scan; nothing is run):
``python -m tests.process_modules`` prints the count, ``-v`` each module and what it calls, ``-t`` each
test function that does (before parametrization).

A module starts a process where it calls subprocess's functions (run, Popen, call, check_call,
check_output), asyncio's create_subprocess_*, os.fork/system/spawn*/exec*, multiprocessing (a Process,
a Pool, a context), tests/procs.py's helpers that start one (Procs, start_aggregator, start_agent,
run_group, a Procs' start or perfd), pytester's runpytest_subprocess, the product's own API that starts
one for a test (PRODUCT: the engine's nats-server), or a function or class another module under the
test paths (a helper, another test module) defines and that does, transitively; or where a test of it
asks for a fixture of a conftest.py above it that does, or calls a method of a helper class that does
(STARTING_METHODS, found the same way: the engine rig's start_cluster, a restart rig's
start_aggregator). The test paths are pyproject's (tests and the collectors' own tests). What perfd's
own code starts while a test runs it (a bench, a launch on a thread) is not counted."""

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
PRODUCT = {"perfd.engine.natsd.NatsCluster"}  # the product's API that starts a process for the test
TOPS = ("tests", "perfd/collectors")  # pyproject's testpaths
# Method names too common to tell a helper's from anything else's: a call of them is not counted
COMMON = {"start", "run", "stop", "close", "wait", "kill", "get", "put", "send", "read", "write"}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def starts(tree: ast.AST, helpers: frozenset[str] = frozenset(),
           methods: frozenset[str] = frozenset()) -> set[str]:
    """What of the above ``tree`` calls, by the name it is called by. ``helpers``: dotted names of other
    modules' functions and classes that start one; ``methods``: helper classes' methods that do."""
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
                or (last in ("perfd", "start") and head.endswith("procs"))
                or last == "runpytest_subprocess" or full in PRODUCT or full in helpers
                or (head and last in methods)):
            found.add(full)
    return found


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _sources() -> list[Path]:
    return sorted(p for top in TOPS for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def helper_starters() -> tuple[frozenset[str], frozenset[str]]:
    """The dotted names of the functions and classes, in any module under the test paths, that start a
    process (a class: one of its methods does), through the modules' imports of each other until nothing
    more is found; and the names of those classes' methods that do (less COMMON ones)."""
    trees = {_module(p): ast.parse(p.read_text()) for p in _sources()}
    helpers: set[str] = set()
    methods: set[str] = set()
    while True:
        frozen, mfrozen = frozenset(helpers | PRODUCT), frozenset(methods)
        more: set[str] = set()
        for mod, tree in trees.items():
            for name in _local_starters(tree, frozen, mfrozen):
                cls, _, meth = name.partition(".")
                more.add(f"{mod}.{cls}")
                if meth and meth not in COMMON and not meth.startswith("_"):
                    methods.add(meth)
        if more <= helpers and frozenset(methods) == mfrozen:
            return frozenset(helpers), frozenset(methods)
        helpers |= more


def _fixtures_starting(conftest: Path, helpers: frozenset[str], methods: frozenset[str]) -> set[str]:
    tree = ast.parse(conftest.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                "fixture" in _dotted(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list):
            if starts(_with_imports(tree, node), helpers, methods) or starts_via_module_helpers(tree, node):
                names.add(node.name)
    return names


def _with_imports(tree: ast.Module, fn: ast.stmt) -> ast.Module:
    """``fn`` with its module's imports beside it, so that a name it calls is read as imported."""
    body: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
    if isinstance(fn, ast.stmt):
        body.append(fn)
    return ast.Module(body=body, type_ignores=[])


def starts_via_module_helpers(tree: ast.Module, fn: ast.FunctionDef) -> bool:
    """``fn`` calls a function of its own module that starts a process."""
    local = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    called = {_dotted(c.func) for c in ast.walk(fn) if isinstance(c, ast.Call)}
    return any(name in local and local[name] is not fn and starts(local[name]) for name in called)


def _local_starters(tree: ast.Module, helpers: frozenset[str] = frozenset(),
                    methods: frozenset[str] = frozenset()) -> set[str]:
    """The module's own functions (and classes' methods, ``Class.method``) that start a process,
    directly or through another of them."""
    local = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for n in tree.body:
        if isinstance(n, ast.ClassDef):
            local.update({f"{n.name}.{m.name}": m for m in n.body
                          if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))})
    found = {name for name, fn in local.items() if starts(_with_imports(tree, fn), helpers, methods)}
    while True:
        more = {name for name, fn in local.items() if name not in found and any(
            _dotted(c.func) in found or _dotted(c.func).split(".")[-1] in found
            for c in ast.walk(fn) if isinstance(c, ast.Call))}
        if not more:
            return found
        found |= more


def starting_tests(path: Path, fixtures: set[str], helpers: frozenset[str] = frozenset(),
                   methods: frozenset[str] = frozenset()) -> list[str]:
    """The test functions of ``path`` that start a process: directly, through a function of their
    module that does, or through a fixture (of the module or a conftest above it) that does."""
    tree = ast.parse(path.read_text())
    local = _local_starters(tree, helpers, methods)
    fixtures = fixtures | {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in local
                           and any("fixture" in _dotted(d.func if isinstance(d, ast.Call) else d)
                                   for d in n.decorator_list)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            calls = {_dotted(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
            if (starts(_with_imports(tree, node), helpers, methods) or calls & local
                    or {c.split(".")[-1] for c in calls} & {n.split(".")[-1] for n in local}
                    or any(a.arg in fixtures for a in node.args.args)):
                out.append(node.name)
    return out


def test_modules() -> list[Path]:
    return sorted(p for top in TOPS for p in (ROOT / top).rglob("test_*.py")
                  if "/gpu/" not in str(p.relative_to(ROOT)) or p.name.startswith("test_"))


def conftest_fixtures(helpers: frozenset[str] = frozenset(),
                      methods: frozenset[str] = frozenset()) -> dict[Path, set[str]]:
    got = {p.parent: _fixtures_starting(p, helpers, methods) for top in TOPS
           for p in (ROOT / top).rglob("conftest.py")}
    got[ROOT] = _fixtures_starting(ROOT / "conftest.py", helpers, methods)
    return got


def scan() -> tuple[dict[Path, set[str]], dict[Path, list[str]]]:
    """Each test module that starts a process -> what it calls (or the fixture it asks for); and the
    test functions of each that do."""
    helpers, methods = helper_starters()
    conftests = conftest_fixtures(helpers, methods)
    out: dict[Path, set[str]] = {}
    tests: dict[Path, list[str]] = {}
    for path in test_modules():
        tree = ast.parse(path.read_text())
        got = starts(tree, helpers, methods)
        fixtures = {f for d, names in conftests.items() if path.is_relative_to(d) for f in names}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                got |= {f"fixture {a.arg}" for a in node.args.args if a.arg in fixtures}
        if got:
            out[path] = got
            tests[path] = starting_tests(path, fixtures, helpers, methods)
    return out, tests


def main(argv: list[str]) -> int:
    found, tests = scan()
    if "-v" in argv:
        for path, what in found.items():
            print(f"{path.relative_to(ROOT)}: {', '.join(sorted(what))}")
    if "-t" in argv:
        for path, names in tests.items():
            for name in names:
                print(f"{path.relative_to(ROOT)}::{name}")
    print(f"{len(found)} of {len(test_modules())} test modules start a process; "
          f"{sum(map(len, tests.values()))} test functions in them do")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
