"""Per-iteration results held in columns, read back as IterationResult rows.

A run of 500,000 iterations kept as IterationResult objects costs ~1.5 KB an iteration (an object,
its boxed floats, its containers, a `sources` dict built per iteration): most of a GB. Here a float
field costs 8 bytes a row (array('d')), an int or bool field 8 or 1, a text or container field one
reference to a value shared by every row that has the same one, and the provenance (``sources``:
codes with the row's numbers) a shape shared by the rows plus the row's own numbers (_Cites). Rows
are rebuilt on demand, as fresh objects that the caller may change without touching the table;
``column`` reads one field without building rows.

Plain data, no I/O: an analysis over a table is the same function of its inputs as over a list.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from array import array
from bisect import bisect_right
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast, overload

from perfd.analytics.steps.provenance import Arg, Cited, Code
from perfd.core.model import Provenance

T = TypeVar("T")

CITED = "cited"  # a field's metadata key: its values are provenance ({name: Cited}), kept in _Cites
_NO_INT = -(2**63)  # the int64 that stands for None in an ``int | None`` column
_NO_BOOL = -1  # the int8 that stands for None in a ``bool | None`` column


class _Column:
    """One field's values. Subclasses store them compactly; ``get``/``append``/``put`` convert."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def append(self, v: object) -> None:
        self.store.append(self.encode(v))

    def put(self, i: int, v: object) -> None:
        self.store[i] = self.encode(v)

    def get(self, i: int) -> object:
        return self.decode(self.store[i])

    def values(self) -> Iterator[object]:
        return map(self.decode, self.store)

    def encode(self, v: object) -> object:
        return v

    def decode(self, x: object) -> object:
        return x

    def taken(self, order: Sequence[int]) -> _Column:
        """A column of these rows in ``order`` (indexes), with this one's encoding state."""
        new = copy.copy(self)
        new.store = (array(self.store.typecode, (self.store[i] for i in order))
                     if isinstance(self.store, array) else [self.store[i] for i in order])
        return new

    def sliced(self, lo: int, hi: int) -> _Column:
        """A column of rows ``lo`` .. ``hi - 1``."""
        new = copy.copy(self)
        new.store = self.store[lo:hi]
        return new


class _Floats(_Column):
    """``float | None``: None is NaN. The analysis stores finite floats or None (a NaN it was given
    reads back as None, as it would print in JSON)."""

    def __init__(self) -> None:
        super().__init__(array("d"))

    def encode(self, v: object) -> object:
        return math.nan if v is None else v

    def decode(self, x: object) -> object:
        return None if x != x else x  # NaN is the only value unequal to itself


class _Ints(_Column):
    def __init__(self, optional: bool) -> None:
        super().__init__(array("q"))
        self.optional = optional

    def encode(self, v: object) -> object:
        return _NO_INT if v is None else v

    def decode(self, x: object) -> object:
        return None if self.optional and x == _NO_INT else x


class _Bools(_Column):
    def __init__(self) -> None:
        super().__init__(array("b"))

    def encode(self, v: object) -> object:
        return _NO_BOOL if v is None else int(cast(bool, v))  # a bool field's value

    def decode(self, x: object) -> object:
        return None if x == _NO_BOOL else bool(x)


class _Shared(_Column):
    """Text and containers: one reference per row to a value shared by equal rows. Containers are
    kept as tuples (immutable, hashable) and rebuilt as a new list or dict when read."""

    def __init__(self) -> None:
        super().__init__([])
        self.seen: dict[object, object] = {}

    def encode(self, v: object) -> object:
        if isinstance(v, list):
            key: object = (list, tuple(v))
        elif isinstance(v, dict):
            key = (dict, tuple(v.items()))
        else:
            key = v
        try:
            return self.seen.setdefault(key, key)
        except TypeError:  # an unhashable value (none of IterationResult's): kept as it is, unshared
            return v

    def decode(self, x: Any) -> object:
        if isinstance(x, tuple) and len(x) == 2 and x[0] in (list, dict):
            return x[0](x[1])
        return type(x)(x) if isinstance(x, list | dict) else x  # unshared, but still a copy

    def sliced(self, lo: int, hi: int) -> _Column:
        new = super().sliced(lo, hi)
        assert isinstance(new, _Shared)
        new.seen = {}  # not the old table's: its values would outlive their rows
        return new


class _Cites(_Column):
    """A row's provenance (``{metric: Cited}``, perfd.analytics.steps.provenance): what rows share —
    the metrics, codes, names and texts, the "shape" — kept once and referred to by number; what is
    the row's own — its numbers, its log line's number — in one array of doubles for the column,
    each distinct value of a row once (a row's step time and log line recur in most of its sources).
    For fields whose metadata has CITED."""

    def __init__(self) -> None:
        super().__init__(array("I"))  # per row: its shape's number
        self.starts = array("I")  # per row: where its numbers begin in ``nums``
        self.nums = array("d")
        self.shapes: list[_RowShape] = []
        self.widths: list[int] = []  # per shape: how many numbers a row of it holds
        self.shape_ids: dict[_RowShape, int] = {}

    def append(self, v: object) -> None:
        shape, start = self.encode(v)
        self.store.append(shape)
        self.starts.append(start)

    def put(self, i: int, v: object) -> None:
        self.store[i], self.starts[i] = self.encode(v)  # the old numbers stay, unread

    def get(self, i: int) -> dict[str, Cited]:
        nums, j = self.nums, self.starts[i]
        return {key: _cited(cs, nums, j) for key, cs in self.shapes[self.store[i]]}

    def values(self) -> Iterator[dict[str, Cited]]:
        return (self.get(i) for i in range(len(self.store)))

    def encode(self, v: object) -> tuple[int, int]:
        cites = cast("Mapping[str, Cited]", v)  # a CITED field's value: its provenance
        slots: _Slots = {}
        numbers: list[float] = []
        shape = tuple((key, _shape_of(c, slots, numbers)) for key, c in cites.items())
        sid = self.shape_ids.get(shape)
        if sid is None:
            sid = self.shape_ids[shape] = len(self.shapes)
            self.shapes.append(shape)
            self.widths.append(len(numbers))  # a shape names its slots: the same count every time
        start = len(self.nums)
        self.nums.extend(numbers)
        return sid, start

    def taken(self, order: Sequence[int]) -> _Cites:
        out = copy.copy(self)  # the shapes are shared: only ever added to, their numbers never change
        out.store, out.starts, out.nums = array("I"), array("I"), array("d")
        for i in order:
            n = self.widths[self.store[i]]
            out.store.append(self.store[i])
            out.starts.append(len(out.nums))
            out.nums.extend(self.nums[self.starts[i]:self.starts[i] + n])
        return out

    def sliced(self, lo: int, hi: int) -> _Cites:
        return self.taken(range(len(self.store))[lo:hi])


# A shape's parts (plain tuples: hashable, compared by value): a float of the row's own, by slot; a
# record's provenance whose detail ends in a number (its log line), the number by slot; a nested
# cite; anything else kept as it is — the ints too (a world size, a stage count, a rank: a few values
# a run repeats, where a slot would cost every row 8 bytes).
_FLOAT, _LINE, _CITE, _SAME = range(4)
_EXACT_INT = 2**53  # the largest int a double holds exactly
# A float's or a line number's key (value, sign) -> its slot among a row's numbers (_slot).
_Slots = dict[tuple[float, ...], int]
# A Cited's shape: (code, caveat, its arguments' parts as above).
_CiteShape = tuple[Code, "Code | None", tuple[tuple[object, ...], ...]]
# A row's provenance as shapes: ((metric, its Cited's shape), ...), shared by the rows that have it.
_RowShape = tuple[tuple[str, _CiteShape], ...]


def _slot(x: float, slots: _Slots, numbers: list[float]) -> int:
    # -0.0 == 0.0: kept apart by sign, so that a row reads back the zero it had; a line number (an
    # int) is kept apart from a float of the same value
    key: tuple[float, ...] = (x, math.copysign(1.0, x)) if isinstance(x, float) else (x,)
    i = slots.get(key)
    if i is None:
        i = slots[key] = len(numbers)
        numbers.append(x)
    return i


def _arg_shape(a: Arg, slots: _Slots, numbers: list[float]) -> tuple[object, ...]:
    if isinstance(a, float) and a == a:  # NaN: never equal to itself, kept as it is
        return (_FLOAT, _slot(a, slots, numbers))
    if isinstance(a, Provenance):
        head, tail = _split_line(a.detail)
        if tail is not None:
            return (_LINE, a.collector, head, _slot(tail, slots, numbers))
    if isinstance(a, Cited):
        return (_CITE, _shape_of(a, slots, numbers))
    return (_SAME, a)


def _split_line(detail: str) -> tuple[str, int | None]:
    """``detail`` as (its text before a trailing number, the number); (detail, None) when it does
    not end in a number written as Python writes one (no leading zero), nor one a double holds."""
    k = len(detail)
    while k and detail[k - 1].isdigit() and detail[k - 1].isascii():
        k -= 1
    digits = detail[k:]
    if not digits or (digits[0] == "0" and len(digits) > 1) or len(digits) > 16 or int(digits) > _EXACT_INT:
        return detail, None
    return detail[:k], int(digits)


def _shape_of(c: Cited, slots: _Slots, numbers: list[float]) -> _CiteShape:
    return (c.code, c.caveat, tuple(_arg_shape(a, slots, numbers) for a in c.args))


def _arg(part: Any, nums: array[float], j: int) -> Any:
    tag = part[0]
    if tag == _FLOAT:
        return nums[j + part[1]]
    if tag == _LINE:
        return Provenance(part[1], f"{part[2]}{int(nums[j + part[3]])}")
    if tag == _CITE:
        return _cited(part[1], nums, j)
    return part[1]


def _cited(shape: _CiteShape, nums: array[float], j: int) -> Cited:
    code, caveat, args = shape
    return Cited(code, tuple(_arg(p, nums, j) for p in args), caveat)


# A field's annotation (a string: the result classes use ``from __future__ import annotations``)
# -> its column. Any other annotation gets a shared-value column.
_COLUMN_OF: dict[str, Callable[[], _Column]] = {
    "float | None": _Floats,
    "int": lambda: _Ints(optional=False),
    "int | None": lambda: _Ints(optional=True),
    "bool": _Bools,
    "bool | None": _Bools,
}


class Table(Sequence[T], Generic[T]):
    """Rows of one dataclass (``row_type``) in columns. ``key`` names an int field the rows are
    appended in non-decreasing order of, for ``last_index_of``."""

    def __init__(self, row_type: type[T], key: str, pack: bool = True) -> None:
        """``pack``: keep the fields marked CITED in a provenance column (False where the rows'
        objects are held elsewhere anyway, and the time matters more than the bytes: the
        aggregator's memo; each row's mapping is then kept as it is)."""
        self.row_type = row_type
        self.key = key
        self._fields = [f.name for f in dataclasses.fields(row_type)]  # type: ignore[arg-type]
        self._cols: dict[str, _Column] = {
            f.name: _Cites() if pack and f.metadata.get(CITED) else _COLUMN_OF.get(str(f.type), _Shared)()
            for f in dataclasses.fields(row_type)}  # type: ignore[arg-type]
        self._n = 0

    def append(self, row: T) -> None:
        for name, col in self._cols.items():
            col.append(getattr(row, name))
        self._n += 1

    def extend(self, rows: Iterable[T]) -> None:
        for row in rows:
            self.append(row)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...

    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, slice):
            return _View(self, range(self._n)[i])
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        # A new object each time: the caller may change it, the table stays as it was.
        row = self.row_type.__new__(self.row_type)
        row.__dict__.update({name: col.get(i) for name, col in self._cols.items()})
        return row

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(self._n))

    def get(self, i: int, name: str) -> Any:
        """One field of row ``i`` (``i`` >= 0), without building the row."""
        return self._cols[name].get(i)

    def take(self, order: Sequence[int]) -> Table[T]:
        """A new table of these rows in ``order`` (indexes)."""
        out: Table[T] = Table(self.row_type, self.key)
        out._cols = {name: col.taken(order) for name, col in self._cols.items()}
        out._n = len(order)
        return out

    def project(self, names: Sequence[str]) -> Sequence[Any]:
        """The rows with only ``names`` as fields (named tuples): a reader of a few fields of a long
        table does not build, nor decode, the others."""
        return _Projection(self, tuple(names), range(self._n))

    def slice(self, lo: int, hi: int) -> Table[T]:
        """A new table of rows ``lo`` .. ``hi - 1``; this one is left as it is (a reader may hold it)."""
        out: Table[T] = Table.__new__(Table)
        out.row_type, out.key, out._fields = self.row_type, self.key, self._fields
        out._cols = {name: col.sliced(lo, hi) for name, col in self._cols.items()}
        out._n = len(range(self._n)[lo:hi])
        return out

    def column(self, name: str) -> Iterator[Any]:
        """One field's values in row order, without building rows."""
        return self._cols[name].values()

    def put(self, i: int, **values: object) -> None:
        """Set fields of row ``i``."""
        for name, v in values.items():
            self._cols[name].put(i, v)

    def last_index_of(self, key: int) -> int | None:
        """The index of the last row whose ``key`` field equals ``key`` (rows come sorted on it)."""
        keys = self._cols[self.key].store
        i = bisect_right(keys, key) - 1
        return i if i >= 0 and keys[i] == key else None


class _View(Sequence[T]):
    """A slice of a Table, read row by row (slicing a long table does not build its rows)."""

    def __init__(self, table: Table[T], indexes: range) -> None:
        self.table, self.indexes = table, indexes

    def __len__(self) -> int:
        return len(self.indexes)

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...

    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, slice):
            return _View(self.table, self.indexes[i])
        return self.table[self.indexes[i]]

    def __iter__(self) -> Iterator[T]:
        return (self.table[i] for i in self.indexes)


class _Projection(Sequence[Any]):
    """Rows of a Table with only some fields, built one at a time (see Table.project)."""

    def __init__(self, table: Table[Any], names: tuple[str, ...], indexes: range,
                 row: Callable[..., Any] | None = None) -> None:
        self.cols = [table._cols[n] for n in names]
        self.names, self.indexes = names, indexes
        self.row: Callable[..., object] = row if row is not None else namedtuple("Row", names)

    def __len__(self) -> int:
        return len(self.indexes)

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            out = _Projection.__new__(_Projection)
            out.cols, out.names, out.indexes, out.row = self.cols, self.names, self.indexes[i], self.row
            return out
        j = self.indexes[i]
        return self.row(*(c.get(j) for c in self.cols))

    def __iter__(self) -> Iterator[Any]:
        cols, row = self.cols, self.row
        return (row(*(c.get(j) for c in cols)) for j in self.indexes)
