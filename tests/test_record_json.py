"""A dataclass's JSON by reflection (perfd.core.record_json): what it writes is what the hand-written
functions it replaced wrote, key for key and in their order (the JSON kept on disk and served must not
move), and what it reads back is the record, or None where the JSON does not fit the declaration."""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfd.analytics.breakdown.budget import CutPart, IdleCause, IdleShare, Unprofiled, Window
from perfd.analytics.breakdown.step_parts import Part, Phase
from perfd.core import record_json as rj
from perfd.core.record_json import (
    absent,
    fitting,
    flat,
    key,
    or_absent,
    unless_none,
    unwritten,
    written_after,
)


class Colour(enum.Enum):
    RED = "red"


@dataclass(frozen=True)
class Inner:
    n: int

    def to_json(self) -> dict[str, object]:
        return {"n": self.n, "own": True}

    @staticmethod
    def from_json(d: object) -> Inner | None:
        return Inner(d["n"]) if isinstance(d, dict) and d.get("own") else None


@dataclass(frozen=True)
class Raises:
    """A record whose own reader raises on what it does not read (as some hand readers do)."""

    n: int

    @staticmethod
    def from_json(d: object) -> Raises:
        raise KeyError("n")


@dataclass(frozen=True)
class Outer:
    colour: Colour
    inner: Inner
    xs: tuple[float, ...]
    by: dict[str, float]
    maybe: float | None
    said: str = field(metadata=absent("none said"))
    flag: bool = False


def test_written_in_declared_order_each_value_by_its_type_nested_records_by_their_own() -> None:
    o = Outer(Colour.RED, Inner(3), (1.0, 2.5), {"a": 1.0}, None, "x", True)
    got = rj.to_json(o)
    assert json.dumps(got) == ('{"colour": "red", "inner": {"n": 3, "own": true}, "xs": [1.0, 2.5], '
                               '"by": {"a": 1.0}, "maybe": null, "said": "x", "flag": true}')
    assert rj.from_json(Outer, got) == o


@dataclass(frozen=True)
class Kernel(rj.JsonRecord):
    name: str
    ms: float


@dataclass(frozen=True)
class Marked(rj.JsonRecord):
    kernel: Kernel = field(metadata=flat())
    source: str | None = field(default=None, metadata=key("from"))
    note: str | None = field(default=None, metadata=unless_none())
    n: int = 0
    seen_by: str = field(default="", metadata=unwritten())


def test_a_field_marked_is_written_under_its_key_left_out_when_none_or_spread_into_its_parent() -> None:
    m = Marked(Kernel("gemm", 1.5), "trace.json", None, 2)
    assert json.dumps(m.to_json()) == '{"name": "gemm", "ms": 1.5, "from": "trace.json", "n": 2}'
    assert Marked.from_json(m.to_json()) == m
    noted = Marked(Kernel("gemm", 1.5), None, "why", 0)
    assert json.dumps(noted.to_json()) == '{"name": "gemm", "ms": 1.5, "from": null, "note": "why", "n": 0}'
    assert Marked.from_json(noted.to_json()) == noted
    assert Marked.from_json({"name": "gemm"}) is None  # the flattened record's own fields must fit
    assert Marked.from_json({"name": "gemm", "ms": 1, "source": "x"}) == Marked(Kernel("gemm", 1.0))
    seen = Marked(Kernel("gemm", 1.5), seen_by="rank 3")
    assert "seen_by" not in seen.to_json() and "rank 3" not in json.dumps(seen.to_json())
    assert Marked.from_json({**seen.to_json(), "seen_by": "x"}) == Marked(Kernel("gemm", 1.5))

    @dataclass(frozen=True)
    class NotARecord(rj.JsonWritten):
        n: int = field(metadata=flat())

    with pytest.raises(TypeError, match="flattens records only"):
        NotARecord(1).to_json()


@dataclass(frozen=True)
class Shift(rj.JsonRecord):
    before_ms: float
    after_ms: float
    steps: int = 0

    @property
    @written_after("after_ms")
    def ratio(self) -> float | None:
        return self.after_ms / self.before_ms if self.before_ms else None


def test_a_property_marked_is_written_after_its_field_and_derived_again_when_read() -> None:
    s = Shift(2.0, 3.0, 5)
    assert json.dumps(s.to_json()) == '{"before_ms": 2.0, "after_ms": 3.0, "ratio": 1.5, "steps": 5}'
    assert Shift.from_json({**s.to_json(), "ratio": 99.0}) == s  # derived, not read

    @dataclass(frozen=True)
    class Misnamed(rj.JsonWritten):
        n: int

        @property
        @written_after("m")
        def twice(self) -> int:
            return 2 * self.n

    with pytest.raises(TypeError, match="written_after names no field"):
        Misnamed(1).to_json()


def test_what_is_absent_reads_as_declared_and_what_does_not_fit_reads_as_none() -> None:
    base = {"colour": "red", "inner": {"n": 1, "own": True}, "xs": [], "by": {}}
    assert rj.from_json(Outer, base) == Outer(Colour.RED, Inner(1), (), {}, None, "none said", False)
    for bad in ({"colour": "blue"}, {"inner": {"n": 1}}, {"xs": [True]}, {"xs": 1.0}, {"by": {"a": "1"}},
                {"maybe": "1"}, {"said": 7}, {"flag": 1}, {"colour": None}):
        assert rj.from_json(Outer, {**base, **bad}) is None, bad
    assert rj.from_json(Outer, [base]) is None
    assert Window.from_json({"marked": 2.5, "complete": 1}) is None


@dataclass(frozen=True)
class Lenient(rj.JsonRecord):
    kernels: tuple[Kernel, ...] = field(metadata=fitting())
    label: str = field(default="", metadata=or_absent())
    ms: float | None = field(default=None, metadata=or_absent())
    tag: str = field(default="x", metadata=absent("none said") | or_absent())


def test_a_lenient_field_keeps_what_fits_and_reads_what_does_not_as_absent() -> None:
    ok = {"name": "gemm", "ms": 2}
    got = Lenient.from_json({"kernels": [ok, {"name": 5}, "junk", ok], "label": 7, "ms": "fast", "tag": []})
    assert got == Lenient((Kernel("gemm", 2), Kernel("gemm", 2)), "", None, "none said")
    assert Lenient.from_json({"kernels": "junk"}) == Lenient((), tag="none said")
    assert Lenient.from_json({"kernels": [ok], "ms": 2, "tag": "t"}) == Lenient((Kernel("gemm", 2),), ms=2.0,
                                                                                  tag="t")
    assert Lenient.from_json({}) is None  # the list itself absent, with no default: still not one


def _idle_hand(r: IdleShare) -> dict[str, object]:  # what IdleShare.to_json wrote
    return {"cause": r.cause.value, "phase": r.phase.value, "owner": r.owner, "ms": r.ms, "gaps": r.gaps}


def _window_hand(w: Window) -> dict[str, object]:  # what Window.to_json wrote
    return {"marked": w.marked, "complete": w.complete,
            "cut": [{"part": c.part.value, "edge_ms": c.edge_ms, "expected_ms": c.expected_ms}
                    for c in w.cut]}


def _unprofiled_hand(u: Unprofiled) -> dict[str, object]:  # what Unprofiled.to_json wrote
    return {"captured_ms": u.captured_ms, "steady_ms": u.steady_ms, "host_idle_ms": u.host_idle_ms,
            "factor": u.factor, "data_ms": u.data_ms}


ms = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(st.sampled_from(list(IdleCause)), st.sampled_from(list(Phase)), st.text(max_size=8), ms, ms)
def test_the_budgets_idle_shares_are_written_as_before_and_read_back(cause: IdleCause, phase: Phase,
                                                                     owner: str, t: float, g: float) -> None:
    r = IdleShare(cause, phase, owner, t, g)
    assert json.dumps(r.to_json()) == json.dumps(_idle_hand(r))
    assert IdleShare.from_json(r.to_json()) == r
    # a budget an older version kept: no owner, no gaps
    assert IdleShare.from_json({"cause": cause.value, "phase": phase.value, "ms": t}) == \
        IdleShare(cause, phase, "", t, 0.0)


@given(st.integers(0, 50), st.integers(0, 50),
       st.lists(st.tuples(st.sampled_from(list(Part)), ms, ms), max_size=3), ms, st.none() | ms)
def test_the_budgets_window_and_unprofiled_step_are_written_as_before_and_read_back(
        marked: int, complete: int, cuts: list[tuple[Part, float, float]], f: float,
        data: float | None) -> None:
    w = Window(marked, complete, tuple(CutPart(*c) for c in cuts))
    assert json.dumps(w.to_json()) == json.dumps(_window_hand(w))
    assert Window.from_json(w.to_json()) == w
    u = Unprofiled(f, f + 1, f / 2, 1.5, data)
    assert json.dumps(u.to_json()) == json.dumps(_unprofiled_hand(u))
    assert Unprofiled.from_json(u.to_json()) == u


def test_every_record_read_by_reflection_has_a_declaration_it_can_read() -> None:
    """Each JsonRecord's field types resolve at run time (not only under TYPE_CHECKING) and are ones the
    reader reads: a record whose reader would fail on every input is caught here, not in the field."""
    import importlib
    import typing
    from pathlib import Path

    root = Path(rj.__file__).parents[2]
    for f in (root / "perfd").rglob("*.py"):  # the modules that declare one (no other import needed)
        if "JsonRecord)" in f.read_text() and f.name != "record_json.py":
            importlib.import_module(".".join(f.relative_to(root).with_suffix("").parts))
    records = rj.JsonRecord.__subclasses__()
    assert len(records) >= 8

    def readable(tp: object, where: str) -> None:
        """Every type the reader meets in ``tp``, nested records' fields included."""
        args = [a for a in typing.get_args(tp) if a is not Ellipsis and a is not type(None)]
        if args:
            for a in args:
                readable(a, where)
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            for name, t in typing.get_type_hints(tp).items():  # resolves at run time, or raises
                readable(t, f"{tp.__name__}.{name}")
        elif not (isinstance(tp, type) and issubclass(tp, enum.Enum)):
            assert tp in (float, int, str, bool, typing.Any, object), f"{where}: {tp!r}"

    for cls in records:
        readable(cls, cls.__name__)
    bad = dataclasses.make_dataclass("Bad", [("x", typing.Literal["a"])], bases=(rj.JsonRecord,), frozen=True)
    with pytest.raises(AssertionError, match=r"Bad\.x"):
        readable(bad, "Bad")
    with pytest.raises(TypeError, match="reads no"):  # perfd's error, said, not a record that does not fit
        rj.from_json(bad, {"x": "a"})


def test_non_finite_numbers_and_readers_that_raise_read_as_not_fitting() -> None:
    assert Window.from_json(json.loads('{"marked": NaN, "complete": 1}')) is None
    assert Window.from_json(json.loads('{"marked": Infinity, "complete": 1}')) is None
    assert Unprofiled.from_json(json.loads(
        '{"captured_ms": NaN, "steady_ms": 1, "host_idle_ms": 1, "factor": 1}')) is None

    @dataclass(frozen=True)
    class Holds(rj.JsonRecord):
        inner: Raises

    assert Holds.from_json({"inner": {}}) is None
