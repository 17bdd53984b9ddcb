"""A frozen dataclass's JSON, written and read by reflection on its declaration (pure).

A record that travels as JSON (an analysis's parts, kept and served) is declared once, as a dataclass;
its JSON is its fields in their declared order, each value by its type:

- an enum its value; a nested dataclass its JSON (its own ``to_json``/``from_json`` where it declares
  them, else this module's); a tuple or a list a list; a mapping a JSON object (enum keys their values);
  a number, a string, a bool or None as it is;
- read back, each value is checked against the field's type (perfd.core.typed's ``number`` for floats:
  a bool is not one) and a value that does not fit makes the whole record not fit: ``from_json`` returns
  None, as the hand-written readers did, and the caller says what it left out;
- a field absent from the JSON, or null, reads as its default where it has one, as None where it is
  optional, as its ``absent`` (:func:`absent`) where its JSON may lack it though the record always has
  it (a value an older version did not write); else the record does not fit.

Four more marks on a field, each for a JSON that was not simply its fields: :func:`key` (its JSON's
key is another word: one Python reserves, ``class``, ``from``), :func:`unless_none` (written only when
it is not None: a key older readers did not expect, or that the JSON leaves out while absent),
:func:`unwritten` (never written: what the record carries for its readers in process, read back as its
default) and :func:`flat` (a nested record whose keys are written into this one's, where its fields
lie). A property whose getter is marked :func:`written_after` a field is written after that field (a
figure derived from the fields, a ratio: read back, it is derived again, not read). Two marks make its
reading lenient where a record is read that an older or damaged store may hold: :func:`fitting` (a
list's items that do not fit are left out, not the record) and :func:`or_absent` (a value that does not
fit reads as if the key were absent).

Written here, not with a library: the JSON must stay byte for byte what the hand-written functions
wrote (what is kept on disk and served), which the libraries that do this (dataclasses-json, cattrs,
pydantic) each shape their own way, and none reads perfd's numbers as perfd.core.typed does.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Self, TypeVar, Union, cast, get_args, get_origin, get_type_hints

from perfd.core.typed import number

T = TypeVar("T")
_ABSENT = "record_json.absent"
_KEY = "record_json.key"
_UNLESS_NONE = "record_json.unless_none"
_FLAT = "record_json.flat"
_UNWRITTEN = "record_json.unwritten"
_FITTING = "record_json.fitting"
_OR_ABSENT = "record_json.or_absent"
_AFTER = "_record_json_after"
F = TypeVar("F", bound=Callable[..., object])


class _Unfit(Exception):
    """A value that does not fit its field's type."""


def absent(value: object) -> dict[str, object]:
    """A field's metadata: its JSON may lack it (or hold null), read then as ``value``."""
    return {_ABSENT: value}


def key(name: str) -> dict[str, object]:
    """A field's metadata: its JSON key is ``name``, not the field's name."""
    return {_KEY: name}


def unless_none() -> dict[str, object]:
    """A field's metadata: written only when it is not None (read, where absent, as its default)."""
    return {_UNLESS_NONE: True}


def unwritten() -> dict[str, object]:
    """A field's metadata: not written (read as its default)."""
    return {_UNWRITTEN: True}


def fitting() -> dict[str, object]:
    """A list field's metadata: read back, the items that fit (one that does not is left out, not the
    record); a value that is not a list reads as none."""
    return {_FITTING: True}


def or_absent() -> dict[str, object]:
    """A field's metadata: a value that does not fit reads as if absent (its ``absent``, its default, or
    None), not as the record not fitting."""
    return {_OR_ABSENT: True}


def flat() -> dict[str, object]:
    """A field's metadata: a nested record whose JSON's keys are written into this record's JSON in
    the field's place, and read back from it."""
    return {_FLAT: True}


def written_after(name: str) -> Callable[[F], F]:
    """A property's getter (under ``@property``): its value is written after the field ``name``."""
    def mark(getter: F) -> F:
        setattr(getter, _AFTER, name)
        return getter
    return mark


@functools.cache
def _plan(cls: Hashable) -> tuple[tuple[str, str, bool, bool], ...]:
    """(attribute, JSON key, written only when not None, flattened) for each field of ``cls`` in order,
    each followed by the properties written after it."""
    after: dict[str, list[str]] = {}
    for klass in reversed(cast(type, cls).__mro__):
        for name, v in vars(klass).items():
            if isinstance(v, property) and (f := getattr(v.fget, _AFTER, None)) is not None:
                after.setdefault(f, []).append(name)
    plan: list[tuple[str, str, bool, bool]] = []
    for f in dataclasses.fields(cast(Any, cls)):
        if not f.metadata.get(_UNWRITTEN):
            plan.append((f.name, str(f.metadata.get(_KEY, f.name)), bool(f.metadata.get(_UNLESS_NONE)),
                         bool(f.metadata.get(_FLAT))))
        plan.extend((p, p, False, False) for p in after.pop(f.name, ()))
    if after:  # perfd's bug: a property marked after a field the record lacks
        raise TypeError(f"{cast(type, cls).__name__}: written_after names no field: {sorted(after)}")
    return tuple(plan)


class JsonWritten:
    """A dataclass's ``to_json`` by reflection (:func:`to_json`): a record whose JSON is its fields
    declares itself one, and writes no field list. One whose reading is its own (a reader that keeps
    what fits of a list, or raises) keeps its ``from_json``."""

    __slots__ = ()

    def to_json(self) -> dict[str, object]:
        return to_json(self)


class JsonRecord(JsonWritten):
    """... and its ``from_json`` by reflection too (:func:`from_json`)."""

    __slots__ = ()

    @classmethod
    def from_json(cls, d: object) -> Self | None:
        return from_json(cls, d)


def to_json(obj: object) -> dict[str, object]:
    """``obj``'s fields in their declared order, each value as its JSON."""
    out: dict[str, object] = {}
    for name, k, unless_none_, flat_ in _plan(cast(Hashable, type(obj))):
        v = getattr(obj, name)
        if flat_:
            nested = _out(v)
            if not isinstance(nested, dict):
                raise TypeError(f"record_json flattens records only: {type(obj).__name__}.{name}")
            out.update(nested)
        elif not (unless_none_ and v is None):
            out[k] = _out(v)
    return out


def _out(v: object) -> object:
    if isinstance(v, enum.Enum):
        return v.value
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        own = getattr(v, "to_json", None)
        return own() if own is not None else to_json(v)
    if isinstance(v, (tuple, list)):
        return [_out(x) for x in v]
    if isinstance(v, Mapping):
        return {(k.value if isinstance(k, enum.Enum) else k): _out(x) for k, x in v.items()}
    return v


def from_json(cls: type[T], d: object) -> T | None:
    """A ``cls`` from its JSON (:func:`to_json`'s), or None where it does not fit its declaration."""
    try:
        return _record(cls, d)
    except _Unfit:
        return None


@functools.cache
def _hints(cls: Hashable) -> dict[str, Any]:
    return get_type_hints(cls)


def _record(cls: type[T], d: object) -> T:
    if not isinstance(d, Mapping):
        raise _Unfit(cls.__name__)
    hints: dict[str, Any] = _hints(cast(Hashable, cls))
    kw: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.metadata.get(_UNWRITTEN):
            continue  # its default (a field without one is perfd's bug: the constructor says so)
        v = d if f.metadata.get(_FLAT) else d.get(f.metadata.get(_KEY, f.name))
        if v is not None:
            try:
                kw[f.name] = (_fitting if f.metadata.get(_FITTING) else _in)(hints[f.name], v)
                continue
            except _Unfit:
                if not f.metadata.get(_OR_ABSENT):
                    raise
        if _ABSENT in f.metadata:
            kw[f.name] = f.metadata[_ABSENT]
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        elif type(None) in get_args(hints[f.name]):
            kw[f.name] = None
        else:
            raise _Unfit(f"{cls.__name__}.{f.name}")
    return cls(**kw)


def _fitting(tp: Any, v: object) -> object:
    """A list field's items that fit its item type (:func:`fitting`)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin not in (tuple, list) or not (origin is list or (len(args) == 2 and args[1] is Ellipsis)):
        raise TypeError(f"record_json: fitting() marks a list or tuple[X, ...], not {tp!r}")  # perfd's bug
    items = []
    for x in v if isinstance(v, list) else ():
        try:
            items.append(_in(args[0], x))
        except _Unfit:
            continue
    return tuple(items) if origin is tuple else items


def _in(tp: Any, v: object) -> object:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if v is None and len(inner) < len(args):
            return None
        for a in inner:
            try:
                return _in(a, v)
            except _Unfit:
                continue
        raise _Unfit(repr(tp))
    if origin in (tuple, list):
        if not isinstance(v, list):
            raise _Unfit(repr(tp))
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):  # list[X], tuple[X, ...]
            items = [_in(args[0], x) for x in v]
            return tuple(items) if origin is tuple else items
        if len(v) != len(args):  # tuple[X, Y]: as many, each its own
            raise _Unfit(repr(tp))
        return tuple(_in(a, x) for a, x in zip(args, v, strict=True))
    if origin is dict or origin is Mapping:
        if not isinstance(v, Mapping):
            raise _Unfit(repr(tp))
        return {_in(args[0], k): _in(args[1], x) for k, x in v.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(v)
        except ValueError as exc:
            raise _Unfit(repr(tp)) from exc
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        own = getattr(tp, "from_json", None)  # a reader of its own, or JsonRecord's (this module's)
        try:
            got = own(v) if callable(own) else _record(tp, v)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a reader of its own that raises
            raise _Unfit(tp.__name__) from exc
        if got is None:
            raise _Unfit(tp.__name__)
        return got
    if tp is float or tp is int:
        # a number, not a bool; finite (json.loads reads NaN and Infinity: no record's value); an int
        # where one is declared (2.0 reads as 2, 2.5 does not fit)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _Unfit(tp.__name__)
        if tp is float:
            return number(v)
        if v != int(v):
            raise _Unfit("int")
        return int(v)
    if tp is str:
        if not isinstance(v, str):
            raise _Unfit("str")
        return v
    if tp is bool:
        if not isinstance(v, bool):
            raise _Unfit("bool")
        return v
    if tp is Any or tp is object:
        return v
    raise TypeError(f"record_json reads no {tp!r}: declare the field with a type it reads")  # perfd's bug
