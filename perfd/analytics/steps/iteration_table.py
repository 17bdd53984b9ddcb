"""Per-iteration results held in columns, read back as IterationResult rows.

A run of 500,000 iterations kept as IterationResult objects costs ~1.5 KB an iteration (an object,
its boxed floats, its containers, a `sources` dict of strings built per iteration): most of a GB.
Here a float field costs 8 bytes a row (array('d')), an int or bool field 8 or 1, and a text or
container field one reference to a value shared by every row that has the same one (the sources
of one run repeat from iteration to iteration). Rows are rebuilt on demand, as fresh objects that
the caller may change without touching the table; ``column`` reads one field without building rows.

Plain data, no I/O: an analysis over a table is the same function of its inputs as over a list.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import zlib
from array import array
from bisect import bisect_right
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

PACKED = "packed"  # a field's metadata key: keep its values compressed (_Packed)
_NO_INT = -(2**63)  # the int64 that stands for None in an ``int | None`` column
_NO_BOOL = -1  # the int8 that stands for None in a ``bool | None`` column


class _Column:
    """One field's values. Subclasses store them compactly; ``get``/``append``/``put`` convert."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def append(self, v: Any) -> None:
        self.store.append(self.encode(v))

    def put(self, i: int, v: Any) -> None:
        self.store[i] = self.encode(v)

    def get(self, i: int) -> Any:
        return self.decode(self.store[i])

    def values(self) -> Iterator[Any]:
        return map(self.decode, self.store)

    def encode(self, v: Any) -> Any:
        return v

    def decode(self, x: Any) -> Any:
        return x


class _Floats(_Column):
    """``float | None``: None is NaN. The analysis stores finite floats or None (a NaN it was given
    reads back as None, as it would print in JSON)."""

    def __init__(self) -> None:
        super().__init__(array("d"))

    def encode(self, v: Any) -> Any:
        return math.nan if v is None else v

    def decode(self, x: Any) -> Any:
        return None if x != x else x  # NaN is the only value unequal to itself


class _Ints(_Column):
    def __init__(self, optional: bool) -> None:
        super().__init__(array("q"))
        self.optional = optional

    def encode(self, v: Any) -> Any:
        return _NO_INT if v is None else v

    def decode(self, x: Any) -> Any:
        return None if self.optional and x == _NO_INT else x


class _Bools(_Column):
    def __init__(self) -> None:
        super().__init__(array("b"))

    def encode(self, v: Any) -> Any:
        return _NO_BOOL if v is None else int(v)

    def decode(self, x: Any) -> Any:
        return None if x == _NO_BOOL else bool(x)


class _Shared(_Column):
    """Text and containers: one reference per row to a value shared by equal rows. Containers are
    kept as tuples (immutable, hashable) and rebuilt as a new list or dict when read."""

    def __init__(self) -> None:
        super().__init__([])
        self.seen: dict[Any, Any] = {}

    def encode(self, v: Any) -> Any:
        if isinstance(v, list):
            key: Any = (list, tuple(v))
        elif isinstance(v, dict):
            key = (dict, tuple(v.items()))
        else:
            key = v
        try:
            return self.seen.setdefault(key, key)
        except TypeError:  # an unhashable value (none of IterationResult's): kept as it is, unshared
            return v

    def decode(self, x: Any) -> Any:
        if isinstance(x, tuple) and len(x) == 2 and x[0] in (list, dict):
            return x[0](x[1])
        return type(x)(x) if isinstance(x, list | dict) else x  # unshared, but still a copy


class _Packed(_Column):
    """Values unique to every row but alike between rows (a row's ``sources``: the same texts with
    that iteration's numbers and line): each kept as JSON compressed against the first row's, ~20x
    smaller than the strings. For fields whose metadata has ``packed``; JSON types only."""

    def __init__(self) -> None:
        super().__init__([])
        self.zdict: bytes | None = None

    def encode(self, v: Any) -> Any:
        raw = json.dumps(v, separators=(",", ":")).encode()
        if self.zdict is None:
            self.zdict = raw  # the first row is the dictionary the others are compressed against
        c = zlib.compressobj(zdict=self.zdict)
        return c.compress(raw) + c.flush()

    def decode(self, x: Any) -> Any:
        assert self.zdict is not None
        d = zlib.decompressobj(zdict=self.zdict)
        return json.loads(d.decompress(x) + d.flush())


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
        """``pack``: compress the fields marked PACKED (False where the rows' objects are held
        elsewhere anyway, and the time matters more than the bytes: the aggregator's memo)."""
        self.row_type = row_type
        self.key = key
        self._fields = [f.name for f in dataclasses.fields(row_type)]  # type: ignore[arg-type]
        self._cols: dict[str, _Column] = {
            f.name: _Packed() if pack and f.metadata.get(PACKED) else _COLUMN_OF.get(str(f.type), _Shared)()
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
        for name, col in self._cols.items():
            new = copy.copy(col)  # the same encoding state (a packed column's dictionary)
            new.store = (array(col.store.typecode, (col.store[i] for i in order))
                         if isinstance(col.store, array) else [col.store[i] for i in order])
            out._cols[name] = new
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
        out._cols = {}
        for name, col in self._cols.items():
            new = copy.copy(col)  # the same encoding state (a packed column's dictionary)
            if isinstance(new, _Shared):
                new.seen = {}  # not the old table's: its values would outlive their rows
            new.store = col.store[lo:hi]
            out._cols[name] = new
        out._n = len(range(self._n)[lo:hi])
        return out

    def column(self, name: str) -> Iterator[Any]:
        """One field's values in row order, without building rows."""
        return self._cols[name].values()

    def put(self, i: int, **values: Any) -> None:
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
        self.row = row if row is not None else namedtuple("Row", names)

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
