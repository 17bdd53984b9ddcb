"""JSON text that never carries inf or NaN (neither is JSON; ``allow_nan=False`` raises on them).

A non-finite float in an analysis result means an input made a formula blow up (a zero or absurd
value from a log or a scrape). Rather than raise while answering, the value becomes absent (null)
and its place is named under ``NON_FINITE_KEY`` of the outermost object, so the reader sees which
number was dropped and why.
"""

from __future__ import annotations

import json
import math
from typing import Any

NON_FINITE_KEY = "non_finite_removed"  # JSON paths of values that were inf/NaN, now null
MAX_DEPTH = 200  # deeper than any result perfd builds; below the interpreter's recursion limit


def sanitize(obj: Any) -> tuple[Any, list[str]]:
    """A copy of ``obj`` with every non-finite float replaced by None, and the paths replaced.
    Dataclass-free plain data expected (dicts, lists, tuples, scalars); other objects pass through
    (``default=str`` renders them)."""
    paths: list[str] = []

    def walk(x: Any, path: str, depth: int) -> Any:
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


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, allow_nan=False, default=str, **kwargs)`` after :func:`sanitize`; the
    paths of dropped values go under ``NON_FINITE_KEY`` when ``obj`` is an object."""
    clean, paths = sanitize(obj)
    if paths and isinstance(clean, dict):
        clean[NON_FINITE_KEY] = paths[:100]
    return json.dumps(clean, allow_nan=False, default=str, **kwargs)
