"""The rule condition language: precedence, units, absent semantics, errors with columns."""

from __future__ import annotations

import pytest

from perfd.core import catalog
from perfd.rules.expr import (
    ALIASES,
    THROTTLE_REASONS,
    Compare,
    ExprError,
    Num,
    base_name,
    compile_expr,
    series_key,
    tokenize,
)

MFU = "perfd_job_mfu_ratio"
STEP = "perfd_job_step_time_seconds"
HW_THERMAL = 'perfd_gpu_throttle_active{reason="hw_thermal"}'


def ev(text: str, **values: float | None) -> bool:
    return compile_expr(text).evaluate({ALIASES.get(k, k): v for k, v in values.items()})


@pytest.mark.parametrize("text", [
    "1 + 2 * 3 == 7",
    "(1 + 2) * 3 == 9",
    "2 - 1 - 1 == 0",  # left-associative
    "8 / 2 / 2 == 2",
    "-2 * 3 == -6",
    "- -2 == 2",
    "+3 == 3",
    "2 * -3 < 0",
    "not 1 > 2 and 1 < 2",  # (not (1 > 2)) and (1 < 2)
    "1 > 2 and 1 > 2 or 1 < 2",  # and binds tighter than or
    "1 < 2 or 1 > 2 and 1 > 2",
    "not not 1 < 2",
    "abs(-3) == 3",
    "min(3, 1, 2) == 1 and max(3, 1, 2) == 3",
    "1.5e3 == 1500",
    ".5 == 0.5",
    "1 != 2",
    "2 >= 2 and 2 <= 2",
])
def test_true_expressions(text: str) -> None:
    assert compile_expr(text).evaluate({})


@pytest.mark.parametrize("text", ["not (1 < 2 or 1 > 2)", "1 + 2 * 3 == 9", "(1 > 2 or 1 < 2) and 1 > 2"])
def test_false_expressions(text: str) -> None:
    assert not compile_expr(text).evaluate({})


@pytest.mark.parametrize(("text", "value"), [
    ("30%", 0.3), ("150ms", 0.15), ("30s", 30.0), ("5m", 300.0), ("2h", 7200.0), ("1d", 86400.0),
    ("2GiB", 2 * 2**30), ("500MB", 5e8), ("1KiB", 1024.0), ("1.5GHz", 1.5e9), ("85C", 85.0),
    ("300W", 300.0), ("1.1x", 1.1), ("250us", 250e-6),
])
def test_units(text: str, value: float) -> None:
    tok = tokenize(text)[0]
    assert tok.kind == "num"
    assert tok.value == pytest.approx(value)


def test_units_apply_in_conditions() -> None:
    assert ev("mfu < 30%", mfu=0.29)
    assert not ev("mfu < 30%", mfu=0.31)
    assert ev("step_time > 500ms", step_time=0.6)
    assert ev("gpu_memory_used > 70GiB", gpu_memory_used=75 * 2**30)


def test_aliases_and_catalog_names_read_the_same_series() -> None:
    a, b = compile_expr("mfu < 0.3"), compile_expr("perfd_job_mfu_ratio < 0.3")
    assert a.keys == b.keys == (MFU,)


def test_every_alias_points_at_a_catalog_metric_with_valid_labels() -> None:
    for alias, key in ALIASES.items():
        m = catalog.get(base_name(key))  # raises for an unknown metric
        if "{" in key:
            label = key.split("{", 1)[1].split("=", 1)[0]
            assert label in m.labels, alias


def test_throttle_reasons_match_the_nvml_collector() -> None:
    mod = pytest.importorskip("perfd.collectors.nvml.collector")
    assert tuple(name for name, _ in mod.THROTTLE_REASONS) == THROTTLE_REASONS


def test_label_selector_and_series_key() -> None:
    e = compile_expr('perfd_gpu_throttle_active{reason="hw_thermal"} > 0')
    assert e.keys == (HW_THERMAL,) == compile_expr("throttle_hw_thermal > 0").keys
    assert series_key("m", {"b": "2", "a": "1"}) == 'm{a="1",b="2"}'
    assert e.evaluate({HW_THERMAL: 1.0})
    assert not e.evaluate({"perfd_gpu_throttle_active": 1.0})


def test_keys_and_snapshot() -> None:
    e = compile_expr("mfu < 30% and (step_time > 1 or mfu < 10%)")
    assert e.keys == (MFU, STEP)
    assert e.metrics == frozenset({MFU, STEP})
    assert e.snapshot({MFU: 0.2, "other": 1.0}) == {MFU: 0.2, STEP: None}


# --- absent values ----------------------------------------------------------------------------
def test_comparison_with_absent_value_never_fires() -> None:
    for text in ("mfu < 30%", "mfu > 30%", "mfu == 0", "mfu != 0", "mfu + 1 > 0", "abs(mfu) >= 0",
                 "min(mfu, 1) < 2", "max(1, mfu) > 0", "-mfu < 1"):
        assert not ev(text), text
        assert not ev(text, mfu=None), text
        assert compile_expr(text).truth({}) is None, text


def test_not_of_unknown_is_unknown() -> None:
    assert not ev("not (mfu < 30%)")
    assert not ev("not mfu < 30%", mfu=None)
    assert ev("not mfu < 30%", mfu=0.5)


def test_kleene_and_or() -> None:
    # or: a definite True wins over unknown; and: a definite False wins over unknown.
    assert ev("mfu < 30% or step_time > 1", step_time=2.0)
    assert not ev("mfu < 30% or step_time > 1", step_time=0.5)
    assert compile_expr("mfu < 30% or step_time > 1").truth({STEP: 0.5}) is None
    assert compile_expr("mfu < 30% and step_time > 1").truth({STEP: 0.5}) is False
    assert compile_expr("mfu < 30% and step_time > 1").truth({STEP: 2.0}) is None


def test_absent_and_present() -> None:
    assert ev("absent(mfu)")
    assert not ev("present(mfu)")
    assert ev("present(mfu)", mfu=0.0)  # zero is a value, not an absence
    assert not ev("absent(mfu)", mfu=0.0)
    assert ev("absent(mfu) or mfu < 30%")
    assert ev("present(mfu) and not absent(step_time / mfu)", mfu=0.5, step_time=1.0)


def test_division_by_zero_and_nan_are_absent() -> None:
    assert not ev("step_time / mfu > 0", step_time=1.0, mfu=0.0)
    assert ev("absent(step_time / mfu)", step_time=1.0, mfu=0.0)
    assert not ev("mfu < 1", mfu=float("nan"))
    assert ev("absent(mfu)", mfu=float("nan"))


# --- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "column", "message"), [
    ("", 1, "empty expression"),
    ("   ", 1, "empty expression"),
    ("mfu <", 6, "unexpected end of expression"),
    ("(mfu < 3", 1, "unbalanced '('"),
    ("mfu < 3)", 8, "unbalanced ')'"),
    ("((mfu < 3)", 1, "unbalanced '('"),
    ("mfu < 3 < 4", 9, "cannot be chained"),
    ("foo > 1", 1, "unknown metric or alias 'foo'"),
    ("mfo > 1", 1, "did you mean 'mfu'"),
    ("mfu > 3q", 8, "unknown unit 'q'"),
    ("mfu > 3min", 8, "unknown unit 'min'"),
    ("mfu # 1", 5, "unexpected character '#'"),
    ("mfu & 1", 5, "unexpected character '&'"),
    ("mfu", 1, "needs a condition"),
    ("1 + 2", 1, "needs a condition"),
    ("mfu + (1 > 2) > 0", 7, "'+' needs a number"),
    ("mfu < 1 and 2", 13, "'and' needs a condition"),
    ("not mfu", 5, "'not' needs a condition"),
    ("mfu and mfu < 1", 1, "'and' needs a condition"),
    ("mfu < 1 or", 11, "unexpected end of expression"),
    ("sqrt(mfu) > 1", 1, "unknown function 'sqrt'"),
    ('__import__("os") > 1', 1, "unknown function '__import__'"),
    ("abs(mfu, 1) > 1", 1, "abs() takes 1 argument(s), got 2"),
    ("min(mfu) > 1", 1, "min() takes at least 2"),
    ("absent() ", 1, "absent() takes 1"),
    ("abs(mfu > 1) > 1", 5, "abs() needs a number"),
    ("abs(mfu", 4, "unbalanced '('"),
    ('perfd_gpu_throttle_active{color="x"} > 0', 27, "has no label 'color'"),
    ('perfd_gpu_throttle_active{gpu="0"} > 0', 27, "set by the rule's scope"),
    ('perfd_gpu_throttle_active{reason=hw} > 0', 34, "quoted label value"),
    ('perfd_gpu_throttle_active{reason="hw"', 38, "expected ',' or '}'"),
    ('perfd_gpu_throttle_active{reason="hw} > 0', 34, "unterminated string"),
    ('throttle_hw_thermal{reason="x"} > 0', 20, "already selects labels"),
    ("mfu < 1 mfu", 9, "unexpected 'mfu'"),
    ("and > 1", 1, "unexpected keyword 'and'"),
    ("mfu < ,", 7, "unexpected ','"),
])
def test_errors_carry_their_column(text: str, column: int, message: str) -> None:
    with pytest.raises(ExprError) as info:
        compile_expr(text)
    assert info.value.column == column, str(info.value)
    assert message in info.value.message
    assert str(info.value).startswith(f"column {column}: ")


def test_compiled_ast_is_small_dataclasses() -> None:
    e = compile_expr("mfu < 30%")
    assert isinstance(e.root, Compare)
    assert isinstance(e.root.right, Num) and e.root.right.number == pytest.approx(0.3)
    # Parse once, evaluate many times (and the tree is immutable).
    for v in (0.1, 0.2, 0.5):
        assert e.evaluate({MFU: v}) == (v < 0.3)
    with pytest.raises(AttributeError):
        e.root.op = ">"  # type: ignore[misc]


def test_custom_resolver() -> None:
    e = compile_expr("x > 1", resolve=lambda name, col: f"custom_{name}")
    assert e.keys == ("custom_x",)
    assert e.evaluate({"custom_x": 2.0})
