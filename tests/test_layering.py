"""The directions of import in docs/architecture.md, checked on the source (AST, no import)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# One worker runs the module, each source parsed once in it (_tree): the checks parse all of perfd,
# several times over, and spread over eight workers each parsed it again (8.9 s of CPU in all).
pytestmark = pytest.mark.xdist_group("layering")


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The file's syntax tree, read once a process (the checks only walk it)."""
    return ast.parse(path.read_text(), filename=str(path))


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, package: str | None = None, type_only: bool = False) -> set[str]:
    """Every module ``path`` imports when it runs: top-level and function-level imports, relative
    ones resolved; imports under ``if TYPE_CHECKING:`` (never executed) are not counted unless
    ``type_only`` (a type-only import is still a dependency a reader follows)."""
    tree = _tree(path)
    if package is None:
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
            if type_only:
                todo.extend(node.body)
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from perfd import events`
        todo.extend(ast.iter_child_nodes(node))
    return out


def _files(*parts: str) -> list[Path]:
    return [p for p in (ROOT.joinpath(*parts)).rglob("*.py") if "tests" not in p.parts[len(ROOT.parts):]]


def _violations(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for f in files:
        for mod in _imports(f):
            if any(mod == x or mod.startswith(x + ".") for x in forbidden):
                bad.append(f"{f.relative_to(ROOT)} imports {mod}")
    return bad


_IO = ("os", "io", "socket", "subprocess", "pathlib", "time", "grpc", "prometheus_client")
_LIVE = ("perfd.collectors", "perfd.transport", "perfd.aggregator", "perfd.agent", "perfd.exporters")


@pytest.mark.slow
def test_analytics_are_pure_and_below_the_report():
    files = _files("perfd", "analytics")
    assert files, "no analytics sources found"
    assert not _violations(files, (*_IO, *_LIVE, "perfd.report", "perfd.app"))


def test_report_is_pure():
    files = _files("perfd", "report")
    assert files, "no report sources found"
    assert not _violations(files, (*_IO, *_LIVE, "perfd.app"))


def _package(module: str) -> str | None:
    """The unit the cycle check works on: perfd.<subpackage or module>, perfd.collectors.<name>."""
    parts = module.split(".")
    if parts[0] != "perfd" or len(parts) < 2:
        return None
    return ".".join(parts[:3] if parts[1] == "collectors" and len(parts) > 2 else parts[:2])


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for f in _files("perfd"):
        src = _package(".".join(f.relative_to(ROOT).with_suffix("").parts))
        if src is None:
            continue
        for mod in _imports(f):
            dst = _package(mod)
            target = ROOT.joinpath(*dst.split(".")) if dst else None
            if target is not None and dst != src and (target.exists() or target.with_suffix(".py").exists()):
                graph.setdefault(src, set()).add(str(dst))
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.slow
def test_no_import_cycle_between_packages():
    """Function-level imports count: a cycle hidden inside a function is still a cycle."""
    graph = _package_graph()
    assert "perfd.report" in graph["perfd.aggregator"] | graph["perfd.app"]  # the graph is real
    assert not _cycles(graph), f"import cycles between packages: {_cycles(graph)}"


def test_the_cycle_check_sees_a_function_level_cycle(tmp_path: Path):
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from perfd.agent import node_agent\n"
                     "def g():\n    from perfd.report import build_report\n    return build_report\n"
                     "from . import flops\n")
    mods = _imports(probe, package="perfd.analytics")
    assert "perfd.report" in mods and "perfd.analytics.flops" in mods
    assert not any(m.startswith("perfd.agent") for m in mods)


@pytest.mark.slow
def test_collectors_know_nothing_of_transport_or_exporters():
    files = _files("perfd", "collectors")
    assert files
    assert not _violations(files, ("perfd.transport", "perfd.aggregator", "perfd.agent",
                                   "perfd.exporters"))
    # gRPC is perfd's transport: no collector may use it, except collectors/k8s, whose source (the
    # kubelet's pod-resources API) is itself a gRPC service.
    # Nor of what runs them: the aggregator, the launcher, the commands, the command line (perfd.app).
    assert not _violations(files, ("perfd.app", "perfd.aggregator"))
    # Nor of the analysis above them: what both need (thresholds, dtypes, timer names, the served
    # model's spec) lives below both, on the ground floor (perfd.core: shared_thresholds, dtypes, model,
    # serving_model).
    assert not _violations(files, ("perfd.analytics",))
    k8s = ROOT / "perfd" / "collectors" / "k8s"
    assert not _violations([f for f in files if k8s not in f.parents], ("grpc",))


def test_the_launcher_imports_no_collector():
    """`perfd launch` sets up what collectors read (the manifest, the Flight Recorder's environment)
    through modules below both (perfd.core.manifest, perfd.core.flight_recorder_env)."""
    assert not _violations([ROOT / "perfd" / "app" / "launcher.py"], ("perfd.collectors",))


def test_no_module_is_loose_at_the_root():
    """perfd/ holds packages (one a layer or a part); at its root only the package's own __init__.py
    and __main__.py (`python -m perfd`). A new module goes into the package its meaning puts it in."""
    loose = sorted(p.name for p in (ROOT / "perfd").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"], loose


def test_nothing_imports_the_entry_points():
    """perfd/app (the command line, its commands, the notebook API, the launcher, the demo) is the top:
    no other package of perfd imports it, not even for the type checker."""
    files = [f for f in _files("perfd") if (ROOT / "perfd" / "app") not in f.parents
             and f != ROOT / "perfd" / "__main__.py"]
    bad = [f"{f.relative_to(ROOT)} imports {mod}" for f in files for mod in _imports(f, type_only=True)
           if mod == "perfd.app" or mod.startswith("perfd.app.")]
    assert not bad, bad


def test_the_core_is_the_ground_floor():
    """perfd/core holds what every layer shares (the data model, the catalogs, the limits, the clock):
    it imports the standard library, third-party packages and itself, nothing else of perfd, not even
    for the type checker; its __init__ imports nothing (importing one module loads no other)."""
    files = sorted((ROOT / "perfd" / "core").rglob("*.py"))
    assert {"model.py", "events.py", "catalog.py", "limits.py", "clock.py"} <= {f.name for f in files}
    bad = [f"{f.relative_to(ROOT)} imports {mod}" for f in files
           for mod in _imports(f, type_only=True)
           if (mod == "perfd" or mod.startswith("perfd.")) and mod != "perfd.core"
           and not mod.startswith("perfd.core.")]
    assert not bad, bad
    init = _tree(ROOT / "perfd" / "core" / "__init__.py")
    assert not [n for n in init.body if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_the_ground_floor_check_sees_an_import_from_above(tmp_path: Path):
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nfrom . import model\n"
                     "if TYPE_CHECKING:\n    from perfd.collectors import collector\n")
    mods = _imports(probe, package="perfd.core", type_only=True)
    assert "perfd.core.model" in mods and "perfd.collectors.collector" in mods


def test_the_clock_is_ground_every_layer_may_take_it():
    """perfd/core/clock.py (the one Clock of the aggregator's time-dependent parts) imports nothing of
    perfd, not even of the ground floor it sits on."""
    assert not _violations([ROOT / "perfd" / "core" / "clock.py"], ("perfd",))


def test_exporters_know_nothing_of_collectors():
    files = _files("perfd", "exporters")
    assert files
    assert not _violations(files, ("perfd.collectors", "perfd.transport", "perfd.agent"))


# The analytics the shards' step summaries reduce with (perfd/engine/stepsummary.py): the step's timer
# names, how ranks group into pipeline stages, a record's vocabulary — pure definitions declared once in
# the analytics, read here rather than written a second time. Nothing else of the analytics.
ENGINE_ANALYTICS = ("perfd.analytics.common", "perfd.analytics.steps.stragglers",
                    "perfd.analytics.steps.vocabulary")


def test_the_engine_knows_nothing_of_the_aggregator_agent_or_analytics():
    """perfd/engine sits beside the transport: a job's root hands records to a sink (the aggregator's
    state, wired in by the aggregator), never imports it; nats is imported where it is used (an
    optional dependency: `perfd agent` and `perfd aggregator` run without it). Of the analytics, only
    the pure definitions the step summaries reduce with (ENGINE_ANALYTICS), and only there."""
    files = _files("perfd", "engine")
    assert files
    bad = _violations(files, ("perfd.aggregator", "perfd.agent", "perfd.analytics", "perfd.collectors",
                              "perfd.exporters", "perfd.report", "perfd.app"))
    bad = [b for b in bad if not (b.startswith("perfd/engine/stepsummary.py imports ")
                                  and b.split(" imports ")[1].startswith(ENGINE_ANALYTICS))]
    assert not bad, bad
    # and the analytics never reach back into the engine
    assert not _violations(_files("perfd", "analytics"), ("perfd.engine",))
    for f in files:
        top = [n for n in _tree(f).body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
        assert not any(m == "nats" or m.startswith("nats.") for m in names), f


def test_transport_knows_nothing_of_collectors_or_analytics():
    files = _files("perfd", "transport")
    if not files:
        return
    assert not _violations(files, ("perfd.collectors", "perfd.analytics", "perfd.aggregator"))


# perfd.analytics, bottom to top: each package imports only those before it (perfd/analytics/__init__.py
# says what each holds). The root modules (common, thresholds, finding_types) come first.
ANALYTICS_LAYERS = ("common", "thresholds", "finding_types", "steps", "collectives", "incidents", "breakdown",
                    "ncu", "advice", "serving", "run")


def _module_graph(package: str, type_only: bool) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (a package's __init__ counts as a module:
    importing anything below it runs it)."""
    base = ROOT.joinpath(*package.split("."))
    mods = {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
            for f in base.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, f in mods.items():
        pkg = name if f.name == "__init__.py" else name.rsplit(".", 1)[0]
        for mod in _imports(f, package=pkg, type_only=type_only):
            if mod in mods and mod != name:
                graph.setdefault(name, set()).add(mod)
            parent = mod.rsplit(".", 1)[0]  # `from perfd.analytics.steps import beat` runs steps/__init__
            if parent in mods and parent != name and parent.startswith(package):
                graph.setdefault(name, set()).add(parent)
    return graph


@pytest.mark.parametrize("type_only", [False, True], ids=["runtime", "with-type-only"])
@pytest.mark.parametrize("package", ["perfd.analytics", "perfd.aggregator", "perfd.capture", "perfd.engine"])
def test_no_import_cycle_between_modules(package: str, type_only: bool) -> None:
    """Inside analytics, the aggregator, the capture and the engine, one direction between modules too,
    TYPE_CHECKING imports included: a back-reference only for the type checker is still a loop a reader
    has to untie (the capture's timeline readers and its analyses name the GPU's activities from
    capture/timeline_events.py, below them all)."""
    graph = _module_graph(package, type_only)
    assert sum(len(v) for v in graph.values()) > 20  # the graph is real
    assert not _cycles(graph), f"import cycles between modules: {_cycles(graph)}"


def test_analytics_packages_import_only_the_layers_below() -> None:
    order = {name: i for i, name in enumerate(ANALYTICS_LAYERS)}
    upward = []
    for src, dsts in _module_graph("perfd.analytics", type_only=True).items():
        a = src.split(".")[2] if src.count(".") >= 2 else None
        for dst in dsts:
            b = dst.split(".")[2] if dst.count(".") >= 2 else None
            if a is not None and b is not None and a != b and order[b] > order[a]:
                upward.append(f"{src} imports {dst}: {b} is above {a}")
    assert not upward, upward
    # The package root imports nothing: importing perfd.analytics.common loads no analysis.
    root = ast.parse((ROOT / "perfd" / "analytics" / "__init__.py").read_text())
    assert not [n for n in root.body if isinstance(n, (ast.Import, ast.ImportFrom))]
