"""JSON text that never carries inf or NaN (neither is JSON; ``allow_nan=False`` raises on them).

A non-finite float in an analysis result means an input made a formula blow up (a zero or absurd
value from a log or a scrape). Rather than raise while answering, the value becomes absent (null)
and its place is named under ``NON_FINITE_KEY`` of the outermost object, so the reader sees which
number was dropped and why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from typing import TextIO

NON_FINITE_KEY = "non_finite_removed"  # JSON paths of values that were inf/NaN, now null
MAX_DEPTH = 200  # deeper than any result perfd builds; below the interpreter's recursion limit


class Lazy:
    """A value computed when it is written (a legend of codes that the rows before it fill as they
    are streamed: perfd.report.row_json)."""

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make


def sanitize(obj: object) -> tuple[object, list[str]]:
    """A copy of ``obj`` with every non-finite float replaced by None, and the paths replaced.
    Dataclass-free plain data expected (dicts, lists, tuples, scalars); other objects pass through
    (``default=str`` renders them)."""
    paths: list[str] = []

    def walk(x: object, path: str, depth: int) -> object:
        if isinstance(x, Lazy):
            x = x.make()
        if isinstance(x, float):
            if math.isfinite(x):
                return x
            paths.append(path or "$")
            return None
        if depth > MAX_DEPTH:
            return x
        if isinstance(x, dict):
            return {k: walk(v, f"{path}.{k}", depth + 1) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(x)]
        return x

    return walk(obj, "", 0), paths


def dumps(obj: object, indent: int | None = None) -> str:
    """``json.dumps(obj, allow_nan=False, default=str, indent=indent)`` after :func:`sanitize`; the
    paths of dropped values go under ``NON_FINITE_KEY`` when ``obj`` is an object."""
    clean, paths = sanitize(obj)
    if paths and isinstance(clean, dict):
        clean[NON_FINITE_KEY] = paths[:100]
    return json.dumps(clean, allow_nan=False, default=str, indent=indent)


def write(obj: Mapping[str, object], out: TextIO, indent: int = 2) -> None:
    """``dumps(obj, indent=indent)`` written to ``out`` a piece at a time (the same value: tested). A
    value of ``obj`` that is an Iterator (per-iteration rows) is written one element at a time, each
    on one line (rows are read as a table: indented, their keys were half the text), so neither the
    list nor the text is ever whole in memory; a :class:`Lazy` value is computed when reached."""
    pad = " " * indent
    paths: list[str] = []

    def text(x: object, path: str, depth: int) -> str:  # x's JSON, indented to sit ``depth`` deep
        clean, bad = sanitize(x)
        paths.extend(f"{path}{p}" if p != "$" else path for p in bad)
        s = json.dumps(clean, allow_nan=False, default=str, indent=indent)
        return s.replace("\n", "\n" + pad * depth)

    def line(x: object, path: str) -> str:  # x's JSON on one line
        clean, bad = sanitize(x)
        paths.extend(f"{path}{p}" if p != "$" else path for p in bad)
        return json.dumps(clean, allow_nan=False, default=str, separators=(",", ":"))

    def items() -> Iterator[tuple[str, object]]:
        yield from obj.items()
        if paths:  # after every value: the paths are known by then
            yield NON_FINITE_KEY, paths[:100]

    out.write("{")
    first = True
    for key, value in items():
        out.write(("\n" if first else ",\n") + pad + json.dumps(key) + ": ")
        first = False
        if isinstance(value, Iterator):
            n = 0
            for n, row in enumerate(value, 1):  # one row a line: rows are read as a table
                out.write(("[\n" if n == 1 else ",\n") + pad * 2 + line(row, f".{key}[{n - 1}]"))
            out.write(f"\n{pad}]" if n else "[]")
        else:
            out.write(text(value, f".{key}", 1))
    out.write("\n}" if not first else "}")
