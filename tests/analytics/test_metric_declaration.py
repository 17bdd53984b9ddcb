"""Each job metric is declared once (perfd/core/catalog.py) and every consumer derives from it."""

from __future__ import annotations

import dataclasses
import types
import typing

from perfd.analytics.run.run_analysis import SUMMARY_METRICS
from perfd.analytics.steps.iteration import IterationResult, job_values
from perfd.core import catalog
from perfd.rules.expr import ALIASES

_NUMERIC = (int, float)


def _numeric_fields() -> list[str]:
    hints = typing.get_type_hints(IterationResult)
    out = []
    for f in dataclasses.fields(IterationResult):
        t = hints[f.name]
        union = typing.get_origin(t) in (typing.Union, types.UnionType)
        members = set(typing.get_args(t)) if union else {t}  # list[int] is not a number
        if members & set(_NUMERIC) and bool not in members:
            out.append(f.name)
    return out


def test_every_numeric_iteration_field_is_a_catalog_metric_or_marked_internal() -> None:
    declared = {m.attr for m in catalog.job_metrics()}
    internal = {f.name for f in dataclasses.fields(IterationResult) if f.metadata.get("internal")}
    stray = [n for n in _numeric_fields() if n not in declared and n not in internal]
    assert not stray, (f"IterationResult fields {stray} are neither in perfd/core/catalog.py (attr=...) nor "
                       "marked internal (_internal(why))")
    assert not declared & internal


def test_every_declared_attr_exists_and_aliases_are_unique() -> None:
    names = {f.name for f in dataclasses.fields(IterationResult)}
    for m in catalog.job_metrics():
        assert m.attr in names, f"{m.name}: IterationResult has no attribute {m.attr!r}"
        assert m.labels == catalog.JOB and m.kind == "gauge"
    aliases = [m.alias for m in catalog.CATALOG if m.alias]
    assert len(aliases) == len(set(aliases))
    assert {a: ALIASES[a] for a in catalog.aliases()} == catalog.aliases()  # rules take every alias


def test_job_values_scale_and_leave_absent_out() -> None:
    it = IterationResult(7, step_time_ms=250.0, mfu=0.31, lm_loss=float("nan"))
    vals = job_values(it)
    assert vals == {"perfd_job_iteration": 7.0, "perfd_job_step_time_seconds": 0.25,
                    "perfd_job_mfu_ratio": 0.31}
    # a summary's steady medians (keyed by the same attributes) map the same way
    medians = {"iteration": 7, "step_time_ms": 250.0, "mfu": 0.31, "lm_loss": None}
    assert catalog.median_values(medians) == vals
    assert set(SUMMARY_METRICS) >= {m.attr for m in catalog.job_metrics(catalog.SUMMARY)}
    assert "iteration" not in SUMMARY_METRICS
