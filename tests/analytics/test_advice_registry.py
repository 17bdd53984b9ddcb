"""The advice registry (perfd.analytics.breakdown.advice_registry): every class, part and grade in use
has one entry, and every consumer picks an entry up from the registry alone — parametrised over every
entry, and with a class added in a scratch registry."""

from __future__ import annotations

from typing import cast

import pytest

from perfd.analytics import thresholds as th
from perfd.analytics.advice import budget_findings
from perfd.analytics.advice.remedies import Advice, FitContext, JobConfig
from perfd.analytics.advice.remedy_catalog import REMEDIES
from perfd.analytics.breakdown import advice_registry as reg
from perfd.analytics.breakdown import budget as budget_mod
from perfd.analytics.breakdown.advice_registry import (
    CLASSES,
    GRADES,
    PARTS,
    ClassEntry,
    Grade,
    GradeBasis,
    PartEntry,
    class_parts,
    ncu_classes,
    short_name,
)
from perfd.analytics.breakdown.bottleneck import BottleneckClass, BudgetClass
from perfd.analytics.breakdown.budget import (
    NO_FLOPS,
    PartDetail,
    Source,
    StepBudget,
    classify,
    finish,
)
from perfd.analytics.breakdown.ncu_rows import CategorySummary
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.common import TextEnum
from perfd.analytics.finding_types import Severity
from perfd.analytics.ncu.ncu_verdicts import rows_class
from perfd.analytics.run.run_grade import explain_grade, grade_mfu
from perfd.app.commands.catalog_docs import registry_text
from perfd.report import budget_text
from perfd.report.budget_text import class_shares_text, worded_budget
from perfd.report.grade_text import BAND_TEXT, GRADE_TEXT, grade_label

WITH_PARTS = [c for c in CLASSES if class_parts().get(c.cls)]


# A capture's budget class: memory 60% of the step, ahead of compute
MEMORY_60 = BudgetClass(BottleneckClass.MEMORY, {BottleneckClass.MEMORY: 0.6, BottleneckClass.COMPUTE: 0.3},
                        0.3)


def _captured(ms: dict[Part, float], detail: dict[Part, PartDetail] | None = None) -> StepBudget:
    """A budget that saw the kernels (a capture's), with these parts."""
    rows = [(p, v, Source.CAPTURE, PartDetail(**(detail or {}).get(p, {}))) for p, v in ms.items()]
    return finish(rows, [Source.CAPTURE], NO_FLOPS)


# --- every member has its entry; every combination in use has one ---------------------------------------
def test_every_class_part_and_grade_has_exactly_one_entry() -> None:
    assert {c.cls for c in CLASSES} == set(BottleneckClass) and len(CLASSES) == len(BottleneckClass)
    assert {p.part for p in PARTS} == set(Part) and len(PARTS) == len(Part)
    assert {g.grade for g in GRADES} == set(Grade) and len(GRADES) == len(Grade)


def test_a_member_without_an_entry_fails_at_import() -> None:
    with pytest.raises(ValueError, match="no entry for"):
        reg._one_each([Part.DATA], [Part.DATA, Part.LOSS])
    with pytest.raises(ValueError, match="more than one"):
        reg._one_each([Part.DATA, Part.DATA], [Part.DATA])


def test_every_combination_in_use_has_an_entry() -> None:
    """What the parts point at, what the analyzers can return and what the remedies advise on is
    declared: a part's class and fused class are classes with entries, every class a budget can
    support holds parts, every grade grade_mfu gives has an entry, every remedy's part has one."""
    for p in PARTS:
        for c in (p.cls, p.fused_cls):
            assert c is None or c in reg.CLASS
        assert p.name and (p.holds or not p.finding), p.part
    assert set(budget_mod.CLASS_PARTS) == {c.cls for c in WITH_PARTS}
    assert not {BottleneckClass.MIXED, BottleneckClass.UNKNOWN} & set(budget_mod.CLASS_PARTS)
    seen = {grade_mfu(m / 100) for m in range(0, 130)} | {grade_mfu(None), grade_mfu(0.2, steady_steps=1)}
    assert seen == set(Grade)
    # each remedy on a budget where every part is large: the part it advises on has an entry
    big = _captured({p: 10.0 for p in Part if p is not Part.COMPUTE})
    advice = [a for r in REMEDIES if (a := r(FitContext(big, JobConfig()))) is not None]
    assert all(isinstance(a, Advice) and a.part in reg.PART for a in advice)


# --- every entry reaches its consumers ---------------------------------------------------------------------
@pytest.mark.parametrize("entry", WITH_PARTS, ids=lambda c: c.cls.value)
def test_each_class_is_the_budget_class_its_parts_make(entry: ClassEntry) -> None:
    """A budget whose time is one class's parts supports that class, says it by its short name, and
    the budget's finding names it."""
    first = class_parts()[entry.cls][0]
    other = next(p for p in Part if reg.PART[p].cls not in (entry.cls, None))
    b = _captured({first: 80.0, other: 20.0})
    c = classify(b)
    assert c is not None and c.cls is entry.cls
    assert class_shares_text(c).startswith(f"{entry.short} 80%")  # as the report says it
    assert list(c.shares) == list(class_parts())  # every class with parts, in the registry's order
    (said,), _ = budget_findings.bottleneck(budget_findings.BudgetContext(b))
    f = worded_budget(said)  # as the report words it
    assert f.evidence["class"] == entry.cls.value and f.title.startswith(f"Step budget: {entry.cls.value}")
    assert short_name(entry.cls.value) == entry.short


@pytest.mark.parametrize("entry", [c for c in CLASSES if c.ncu_bound is not None], ids=lambda c: c.cls.value)
def test_each_ncu_bound_votes_for_its_class(entry: ClassEntry) -> None:
    assert entry.ncu_bound is not None
    cat = CategorySummary.from_json({"category": "gemm", "profiled_ms": 9.0,
                                     "bound_ms": {entry.ncu_bound.value: 9.0}})
    assert cat is not None and rows_class([cat], 10.0)[0] is entry.cls


@pytest.mark.parametrize("entry", PARTS, ids=lambda p: p.part.value)
def test_each_part_gets_its_name_finding_and_class(entry: PartEntry) -> None:
    other = Part.LINEAR if entry.part is not Part.LINEAR else Part.NORM
    b = _captured({entry.part: 30.0, other: 70.0})
    assert budget_findings.part_name(entry.part) == entry.name
    fs, _ = budget_findings.parts(budget_findings.BudgetContext(b))
    got = [f for f in fs if f.id == f"budget-{entry.part.value}"]
    if not entry.finding:
        assert got == []
        return
    f = worded_budget(got[0])  # as the report words it
    assert f.title.lower().startswith(entry.name.lower()) and f.observation.startswith(entry.holds)
    assert f.severity is (Severity.INFO if entry.math else Severity.WARNING)  # 30% is over BUDGET_PART_WARN
    c = classify(b)
    assert c is not None
    if entry.cls is not None:
        assert c.shares[entry.cls] >= 0.3 - 1e-9
    # covered by the run's timers: the budget leaves the part to them
    covered = budget_findings.BudgetContext(b, covered=frozenset({entry.part}))
    assert not [f for f in budget_findings.parts(covered)[0] if f.id == f"budget-{entry.part.value}"]


def test_a_fused_part_counts_for_its_fused_class() -> None:
    (fused,) = [p for p in PARTS if p.fused_cls is not None]
    assert fused.cls is not None and fused.fused_cls is not None
    plain = classify(_captured({fused.part: 60.0, Part.DATA: 40.0}))
    one = classify(_captured({fused.part: 60.0, Part.DATA: 40.0}, {fused.part: {"fused": True}}))
    assert plain is not None and one is not None
    assert plain.cls is fused.cls and one.cls is fused.fused_cls


@pytest.mark.parametrize("entry", reg.BANDS, ids=lambda g: g.grade.value)
def test_each_band_grades_its_mfu(entry: reg.GradeEntry) -> None:
    top = entry.below.value if entry.below is not None else 0.9
    mfu = top if entry.inclusive else top - 0.001
    assert grade_mfu(mfu) is entry.grade
    # the band's usual causes give way to a budget only where the entry says the band is explained
    said = explain_grade(mfu, None, None, MEMORY_60)
    assert (said.basis is GradeBasis.BUDGET) == (entry.explained_by is not None)


def test_every_grade_has_its_words_in_the_report() -> None:
    """A grade's sentence, its band's range and its label are the report's (perfd.report.grade_text):
    one for each grade, a range for each band."""
    assert set(GRADE_TEXT) == set(Grade) and set(BAND_TEXT) == {g.grade for g in reg.BANDS}
    assert grade_label(Grade.COMMUNICATION_OVERHEAD) == "fair" and grade_label(Grade.GOOD) == "good"


def test_the_generated_doc_lists_every_entry_with_its_count() -> None:
    text = registry_text()
    assert f"{len(CLASSES)} bottleneck classes" in text and f"{len(PARTS)} parts" in text
    assert f"{len(GRADES)} MFU grades" in text
    for c in CLASSES:
        assert f"| `{c.cls.value}` | {c.short} |" in text
    for p in PARTS:
        assert f"| `{p.part.value}` | {p.name} |" in text


# --- a class added in a scratch registry ------------------------------------------------------------------
class _Scratch(TextEnum):
    HOST = "host-bound"


def test_a_class_added_in_a_scratch_registry_reaches_every_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new class is its member, its entry and the parts that name it: the budget's class, its
    shares, its short name and the ncu vote follow with no other change."""
    host = cast(BottleneckClass, _Scratch.HOST)
    classes = (*CLASSES, ClassEntry(host, "the host", None))
    parts = tuple(PartEntry(p.part, p.name, p.holds, host, math=p.math) if p.part is Part.IDLE_LONG else p
                  for p in PARTS)
    derived = class_parts(classes, parts)
    assert derived[host] == (Part.IDLE_LONG,) and derived[BottleneckClass.SYNC] == (Part.IDLE_SYNC,)
    assert ncu_classes(classes) == ncu_classes()  # no kernel bound: the ncu vote is unchanged
    monkeypatch.setattr(budget_mod, "CLASS_PARTS", derived)
    monkeypatch.setattr(budget_text, "CLASS", {c.cls: c for c in classes})  # the short names it says
    monkeypatch.setattr(budget_mod, "PARTS", parts)
    c = classify(_captured({Part.IDLE_LONG: 70.0, Part.IDLE_SYNC: 30.0}))
    assert c is not None and c.cls is host and list(c.shares)[-1] is host
    assert class_shares_text(c).startswith("the host 70%")
    assert c.shares_json()["host-bound"] == pytest.approx(0.7)
    assert th.CLASS_MIXED_MARGIN.value < 0.4  # the lead above decides
