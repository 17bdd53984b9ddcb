"""What a user of perfd calls documents its arguments and what it returns: every public function and
method of ``perfd.app.api`` and ``perfd.hook`` (their ``__all__``) and the framework entry points
(``perfd.hook.lightning.lightning_callback``, ``perfd.hook.hf.hf_callback``,
``perfd.hook.megatron.install``) has an ``Args:`` section where it takes arguments and a ``Returns:``
(or ``Yields:``) section where it returns something; a class's constructor may document its arguments
in the class's docstring. Read from the objects (inspect), so a name re-exported is checked where it is
defined."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator

import pytest

PUBLIC: dict[str, tuple[str, ...] | None] = {  # None: the module's __all__
    "perfd.app.api": None,
    "perfd.hook": None,
    "perfd.hook.lightning": ("lightning_callback",),
    "perfd.hook.hf": ("hf_callback",),
    "perfd.hook.megatron": ("install",),
}


def _members(modname: str) -> Iterator[tuple[str, Callable[..., object], bool, type | None]]:
    """(name, function, whether a property, its class) for each public function or method."""
    mod = importlib.import_module(modname)
    for n in PUBLIC[modname] or mod.__all__:
        obj = getattr(mod, n)
        if inspect.isclass(obj):
            for m in dir(obj):
                if m.startswith("_") and m != "__init__":
                    continue
                raw = inspect.getattr_static(obj, m)
                fn = raw.fget if isinstance(raw, property) else getattr(raw, "__func__", raw)
                if inspect.isfunction(fn) and fn.__module__.startswith("perfd"):
                    yield f"{modname}.{n}.{m}", fn, isinstance(raw, property), obj
        elif inspect.isfunction(obj):
            yield f"{modname}.{n}", obj, False, None


def _missing(fn: Callable[..., object], prop: bool, cls: type | None) -> list[str]:
    doc = inspect.getdoc(fn) or ""
    init = fn.__name__ == "__init__"
    if init:
        doc = f"{inspect.getdoc(cls) or ''}\n{doc}"
    sig = inspect.signature(fn)
    takes = [p for p, v in sig.parameters.items()
             if p not in ("self", "cls") and v.kind is not inspect.Parameter.VAR_KEYWORD]
    out = []
    if takes and "Args:" not in doc:
        out.append("Args")
    ret = sig.return_annotation
    gives = ret not in (None, "None", inspect.Signature.empty) and not prop and not init
    if gives and "Returns:" not in doc and "Yields:" not in doc:
        out.append("Returns")
    return out


def test_every_public_function_documents_its_arguments_and_what_it_returns() -> None:
    checked = 0
    missing = {}
    for modname in PUBLIC:
        for name, fn, prop, cls in _members(modname):
            checked += 1
            if need := _missing(fn, prop, cls):
                missing[name] = need
    assert checked > 30  # the walk sees the API at all
    assert not missing, f"document these (Google style sections): {missing}"


@pytest.mark.parametrize(("doc", "missing"), [
    ('"""Add."""', ["Args", "Returns"]),
    ('"""Add.\n\n    Args:\n        a: one.\n        b: two.\n    """', ["Returns"]),
    ('"""Add.\n\n    Args:\n        a: one.\n        b: two.\n\n    Returns:\n        The sum.\n    """', []),
])
def test_the_check_reads_the_sections(doc: str, missing: list[str]) -> None:
    space: dict[str, object] = {}
    exec(f"def add(a: int, b: int) -> int:\n    {doc}\n    return a + b\n", space)
    fn = space["add"]
    assert callable(fn)
    assert _missing(fn, False, None) == missing
