"""The directions of import in docs/architecture.md, checked on the source (AST, no import)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
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


def test_analytics_are_pure():
    files = _files("perfd", "analytics") + _files("perfd", "report")
    assert files, "no analytics sources found"
    assert not _violations(files, ("os", "io", "socket", "subprocess", "pathlib", "time", "grpc",
                                   "collectors", "perfd.transport", "perfd.aggregator",
                                   "perfd.agent", "perfd.exporters", "prometheus_client"))


def test_collectors_know_nothing_of_transport_or_exporters():
    files = _files("collectors")
    assert files
    assert not _violations(files, ("perfd.transport", "perfd.aggregator", "perfd.agent",
                                   "perfd.exporters"))
    # gRPC is perfd's transport: no collector may use it, except collectors/k8s, whose source (the
    # kubelet's pod-resources API) is itself a gRPC service.
    k8s = ROOT / "collectors" / "k8s"
    assert not _violations([f for f in files if k8s not in f.parents], ("grpc",))


def test_exporters_know_nothing_of_collectors():
    files = _files("perfd", "exporters")
    assert files
    assert not _violations(files, ("collectors", "perfd.transport", "perfd.agent"))


def test_transport_knows_nothing_of_collectors_or_analytics():
    files = _files("perfd", "transport")
    if not files:
        return
    assert not _violations(files, ("collectors", "perfd.analytics", "perfd.aggregator"))


def test_agent_and_aggregator_never_import_torch():
    """Run in a fresh interpreter: importing the agent, aggregator and collectors loads no torch."""
    code = (
        "import sys, importlib\n"
        "mods = ['perfd.cli', 'perfd.analytics.megatron_job', 'collectors.megatron']\n"
        "import pkgutil\n"
        "for m in ('perfd.agent.main', 'perfd.aggregator.main', 'collectors.nvml', 'collectors.host'):\n"
        "    try:\n"
        "        importlib.util.find_spec(m) and mods.append(m)\n"
        "    except ModuleNotFoundError:\n"
        "        pass\n"
        "for m in mods: importlib.import_module(m)\n"
        "print(','.join(mods))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "collectors.megatron" in res.stdout
