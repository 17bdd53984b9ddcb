"""A collector's configuration values: from YAML, the command line or the agent, so unknown until
checked (each collector's ``from_dict`` checks its own keys; these convert a value the way
``float()`` and ``int()`` would, with a type a checker can follow)."""

from __future__ import annotations


def as_float(value: object) -> float:
    """``float(value)`` of a number or its text ("2.5"); anything else raises TypeError, as
    ``float()`` itself does."""
    if isinstance(value, int | float | str):
        return float(value)
    raise TypeError(f"float() argument must be a string or a real number, not '{type(value).__name__}'")


def as_int(value: object) -> int:
    """``int(value)`` of a number or its text ("8"); anything else raises TypeError, as ``int()``
    itself does."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"int() argument must be a string or a real number, not '{type(value).__name__}'")
