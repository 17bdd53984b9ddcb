"""A JSON value from the network checked against the TypedDict that declares it (pure).

What an event's payload must be is declared once, as a TypedDict in perfd.core.events (the keys that must
be there marked ``Required``); :func:`fit` turns a payload into a value of that type or says why not,
so that what a consumer reads is what the declaration says — never a ``KeyError`` or a ``TypeError``
three calls later, on every tick (one process entry without a ``pid`` once took every
endpoint of the aggregator down). Each declaration is compiled once into checks (the aggregator checks
every event it receives).

Rules, kept simple enough to state in a line each:

- a ``Required`` key must be there, and not None;
- an optional key may be absent or None (absent: the source does not say), else of its type;
- ``int`` is an int and not a bool; ``float`` an int or a float (not a bool); ``Literal`` one of its
  values; ``list[X]`` a list of X; ``dict[K, V]`` a mapping of K to V; ``Any`` anything; keys the
  declaration does not name pass as they are (a newer agent may send more);
- a field declared ``list[SomeTypedDict]`` keeps the entries that fit and leaves out the others, each
  one said (one bad process does not hide the rest of a GPU's list); anything else that does not fit
  makes the whole value not fit.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    Any,
    Literal,
    NotRequired,
    Required,
    TypeAlias,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

# A JSON value perfd passes on without reading it (a capture's manifest field, a collector's
# checkpoint, an answer shown as it came): what ``json.loads`` gives and ``json.dumps`` writes. The
# containers are read-only so that a value built with precise types (a ``list[dict[str, float]]``)
# is one; reading into one takes isinstance checks. The one alias of it in perfd: a value read
# from outside whose shape is checked before use is ``object``; a shape that is known, a TypedDict.
# (A string: the alias is recursive, and Python 3.10 has no ``type`` statement; never give it to
# :func:`fit`.)
JSON: TypeAlias = "bool | int | float | str | Sequence[JSON] | Mapping[str, JSON] | None"

Check = Callable[[object], bool]


def obj(v: object) -> Mapping[str, object]:
    """``v`` when it is a JSON object, else an empty one: in a value read from outside (an API's
    answer), a key that is absent or of another type reads as absent."""
    return v if isinstance(v, Mapping) else {}


def objs(v: object) -> list[Mapping[str, object]]:
    """The JSON objects of ``v`` when it is a list (none when it is not one)."""
    return [x for x in v if isinstance(x, Mapping)] if isinstance(v, list) else []


def number(v: object) -> float:
    """``v`` as a float when it is a JSON number (not a bool); raises TypeError for anything else: in a
    value that must hold the number (a record read back), the whole value is then unreadable."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise TypeError(f"{_shown(v)} is not a number")


def numbers(v: object) -> tuple[float, ...]:
    """A JSON list of numbers as floats; raises TypeError as :func:`number` does."""
    if not isinstance(v, list):
        raise TypeError(f"{_shown(v)} is not a list")
    return tuple(number(x) for x in v)

_SHOWN = 40  # characters of an offending value said in a problem (it comes from the network)


@dataclass(frozen=True)
class _Field:
    key: str
    check: Check
    required: bool
    entries: type | None  # the TypedDict of a list field whose entries are filtered one by one


def _shown(v: object) -> str:
    r = repr(v)
    return r if len(r) <= _SHOWN else r[:_SHOWN] + "…"


def _anything(v: object) -> bool:
    return True


def _compile(tp: object) -> Check:
    """A check of one declared type (see the module docstring)."""
    if tp is Any:
        return _anything
    if tp is type(None) or tp is None:
        return lambda v: v is None
    if tp is bool:
        return lambda v: isinstance(v, bool)
    if tp is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    if tp is str:
        return lambda v: isinstance(v, str)
    if isinstance(tp, type) and is_typeddict(tp):  # a TypedDict is a class
        return lambda v: isinstance(v, Mapping) and not fit(v, tp)[1]
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        allowed = frozenset((type(a), a) for a in args)
        return lambda v: (type(v), v) in allowed
    if origin is Union or origin is types.UnionType:
        checks = [_compile(a) for a in args]
        return lambda v: any(c(v) for c in checks)
    if origin is list:
        item = _compile(args[0]) if args else _anything
        return lambda v: isinstance(v, list) and all(item(x) for x in v)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        k = _compile(args[0]) if args else _anything
        val = _compile(args[1]) if len(args) > 1 else _anything
        return lambda v: isinstance(v, Mapping) and all(k(a) and val(b) for a, b in v.items())
    if isinstance(tp, type):
        return lambda v: isinstance(v, tp)
    raise TypeError(f"perfd.core.typed cannot check {tp!r}")


@functools.cache
def _fields(td: type) -> tuple[_Field, ...]:
    out = []
    for key, tp in get_type_hints(td, include_extras=True).items():
        required = get_origin(tp) is Required
        if get_origin(tp) in (Required, NotRequired):
            tp = get_args(tp)[0]
        args = get_args(tp)
        entries = args[0] if get_origin(tp) is list and args and is_typeddict(args[0]) else None
        out.append(_Field(key, _compile(tp), required, entries))
    return tuple(out)


def fit(value: Mapping[str, object], td: type) -> tuple[dict[str, object] | None, list[str]]:
    """(``value`` as a ``td``, or None when it is not one; what was wrong, one line each). The value
    comes back a new dict, with entries of its ``list[TypedDict]`` fields that do not fit left out
    (each a line); a line with a value that fits says what was left out of it."""
    out = dict(value)
    problems: list[str] = []
    for f in _fields(td):
        v = out.get(f.key)
        if v is None:
            if f.required:
                return None, [*problems, f"no {f.key!r}"]
            continue
        if f.entries is not None and isinstance(v, list):
            kept = []
            for i, entry in enumerate(v):
                got, why = fit(entry, f.entries) if isinstance(entry, Mapping) else (None, ["not a mapping"])
                if got is None:
                    problems.append(f"{f.key}[{i}]: {'; '.join(why)}")
                else:
                    kept.append(got)
            out[f.key] = kept
        elif not f.check(v):
            return None, [*problems, f"{f.key!r} is {_shown(v)}, not of its declared type"]
    return out, problems


def fit_entries(values: Sequence[object], td: type) -> tuple[list[dict[str, object]], list[str]]:
    """The entries of a list that are ``td`` values (as :func:`fit`), and a line for each left out."""
    kept: list[dict[str, object]] = []
    problems: list[str] = []
    for i, entry in enumerate(values):
        got, why = fit(entry, td) if isinstance(entry, Mapping) else (None, ["not a mapping"])
        if got is None:
            problems.append(f"[{i}]: {'; '.join(why)}")
        else:
            kept.append(got)
    return kept, problems
