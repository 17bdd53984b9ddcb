"""Every metric the catalog declares is emitted by some code: a declared series that nothing writes
is a dashboard panel, an alert or a rule that stays empty forever (perfd_agent_captures_total was).

Derived from the catalog, not from a hand list. A per-iteration job metric (one with ``attr``) is
emitted by the generic exporter: checked by running it. Any other metric must be named in the code
of perfd/ or collectors/ outside the catalog: as a string (docstrings and comments do not count), or
through the catalog constant that holds its name (or a mapping keyed by names: each of its keys)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from perfd.analytics.steps.iteration import IterationResult
from perfd.analytics.steps.iteration_table import Table
from perfd.core import catalog, catalog_labels
from perfd.exporters.prometheus import job_families

ROOT = Path(__file__).resolve().parents[1]
# The catalog's own files: a name declared there is not emitted by being declared
_CATALOG_FILES = ("catalog.py", "catalog_engine.py")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _constants() -> dict[str, set[str]]:
    """Catalog module constants that hold metric names (a name, or a mapping keyed by names):
    constant -> names."""
    names = set(catalog.names())
    out: dict[str, set[str]] = {}
    for k, v in vars(catalog).items():
        if not k.isupper():
            continue
        if isinstance(v, str) and v in names:
            out[k] = {v}
        elif isinstance(v, dict) and v and all(isinstance(n, str) and n in names for n in v):
            out[k] = set(v)
    return out


def named_in_code() -> dict[str, set[str]]:
    """metric name -> the source files (outside the catalog) whose code names it."""
    consts = _constants()
    names = set(catalog.names())
    found: dict[str, set[str]] = {}
    for top in ("perfd", "collectors"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if path.parent == ROOT / "perfd" / "core" and path.name in _CATALOG_FILES:
                continue
            if "tests" in rel.parts or "gen" in rel.parts:
                continue
            tree = ast.parse(path.read_text(), str(rel))
            docs = _docstrings(tree)
            for node in ast.walk(tree):
                hits: set[str] = set()
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                    hits = {node.value} & names
                elif isinstance(node, ast.Name) and node.id in consts:
                    hits = consts[node.id]
                elif isinstance(node, ast.Attribute) and node.attr in consts:
                    hits = consts[node.attr]
                elif isinstance(node, ast.alias) and node.name in consts:
                    hits = consts[node.name]
                for hit in hits:
                    found.setdefault(hit, set()).add(str(rel))
    return found


def test_job_metrics_come_out_of_the_generic_exporter() -> None:
    iteration = IterationResult(1)
    for m in catalog.job_metrics():
        if m.attr and m.attr != "iteration":
            setattr(iteration, m.attr, 1.0)
    table: Table[IterationResult] = Table(IterationResult, "iteration")
    table.append(iteration)
    emitted = {s.name for fam in job_families({"j": table}) for s in fam.samples}
    assert {m.name for m in catalog.job_metrics()} <= emitted


@pytest.mark.slow
def test_every_other_catalog_metric_is_named_by_code() -> None:
    found = named_in_code()
    never = [m.name for m in catalog.all_metrics() if not m.attr and m.name not in found]
    assert not never, f"declared in perfd/core/catalog.py, emitted nowhere: {never}"


@pytest.mark.slow
def test_the_check_sees_constants_and_ignores_docstrings(tmp_path: Path) -> None:
    found = named_in_code()
    assert "perfd/aggregator/job_rows.py" in found[catalog.JOB_STALLED_SECONDS]  # through the constant
    assert "perfd/agent/node_agent.py" in found["perfd_agent_captures_total"]
    tree = ast.parse('"""perfd_gpu_power_watts"""\nx = 1\n')
    assert len(_docstrings(tree)) == 1


def test_every_closed_label_set_resolves_and_the_doc_counts_its_values() -> None:
    """A label whose values are a closed set names its declaration (catalog_labels.LABEL_SETS); the doc's
    count and values come from it, so a ninth bottleneck class shows up without editing the catalog."""
    from perfd.analytics.breakdown.bottleneck import BottleneckClass
    from perfd.app.commands.catalog_docs import label_text, label_values

    assert set(catalog_labels.LABEL_SETS) <= set(catalog_labels.LABELS)
    for name, ref in catalog_labels.LABEL_SETS.items():
        values = label_values(ref)
        assert values and len(set(values)) == len(values), name
        assert f"{len(values)} values" in label_text(name)
    assert label_values(catalog_labels.LABEL_SETS["class"]) == tuple(c.value for c in BottleneckClass)
    assert not any(ch.isdigit() for ch in catalog_labels.LABELS["class"])  # no count written by hand
