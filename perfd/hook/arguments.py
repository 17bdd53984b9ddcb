"""What ``StepHook(...)`` is given, read so that nothing given to it raises in the training script.

The hook is two lines added to someone else's loop: a model description it cannot count, a layout
key it does not know or a size out of range is the user's to fix, but not by a traceback that stops
their job at start-up. Each such argument is logged once (a warning: Python prints it on stderr even
where the script configured no logging) and what it would have given is left absent — MFU is then
absent, never computed from a guess — and the loop runs as it would without it.

What the hook fills in of ``model=`` (an MLP width of 4·hidden, a head size of hidden ÷ heads, the
logits' width as the padded vocabulary: what Megatron-LM fills when its flags leave them unset) is
said the same way, once, so that a reader knows which FLOPs were counted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfd.core.model import ModelSpec
from perfd.hook.jobinfo import LAYOUT_KEYS, check_layout

if TYPE_CHECKING:
    from perfd.analytics.steps.flops import TokenFlops

log = logging.getLogger("perfd.hook")

PREFIX = "perfd step hook"


@dataclass(frozen=True)
class StepWork:
    """The work of a step as the constructor's arguments give it: the job's tokens and FLOPs per
    step (None: absent), and the per-token FLOPs of ``model=`` for steps that say their own tokens."""

    tokens_per_step: float | None
    flops_per_step: float | None
    token_flops: TokenFlops | None = None
    model_seq: float | None = None
    notes: tuple[str, ...] = ()  # how model= was read: fields ignored, values assumed
    problems: tuple[str, ...] = ()  # what was left absent, and why (each logged once)


def positive(value: object) -> float | None:
    """``value`` as a float when it is a positive, finite Python number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


def read_work(model: ModelSpec | Mapping[str, object] | None, tokens_per_step: object,
              flops_per_step: object) -> StepWork:
    """The step's work from the constructor's arguments; never raises (see the module docstring)."""
    problems: list[str] = []
    tokens, flops = positive(tokens_per_step), positive(flops_per_step)
    if tokens_per_step is not None and tokens is None:
        problems.append(f"tokens_per_step={tokens_per_step!r} is not a positive number: tokens per step "
                        "are absent (give them per step: step_end(tokens=...))")
    if flops_per_step is not None and flops is None:
        problems.append(f"flops_per_step={flops_per_step!r} is not a positive number: MFU is absent")
    token_flops: TokenFlops | None = None
    seq: float | None = None
    notes: tuple[str, ...] = ()
    if flops is None and model is not None:
        # only here: a loop without model= imports no analytics
        from perfd.analytics.steps.flops import token_flops as count

        try:
            token_flops = count(model)
        except Exception as exc:  # ValueError names what is missing; anything else is the input's too
            problems.append(f"{exc}: MFU is absent")
        else:
            notes = token_flops.notes
            seq = positive(token_flops.spec.seq_length)
            if tokens is not None and seq is not None:
                flops = token_flops.flops(tokens, seq)
    for problem in problems:
        log.warning("%s: %s", PREFIX, problem)
    for note in notes:
        log.warning("%s: model=: %s", PREFIX, note)
    return StepWork(tokens, flops, token_flops, seq, notes, tuple(problems))


def read_layout(layout: Mapping[str, int] | None) -> dict[str, int]:
    """The layout's valid sizes; each key that is not one (unknown, or no positive int) logged once
    and left out."""
    out: dict[str, int] = {}
    try:
        items = list((layout or {}).items())
    except Exception:  # not a mapping at all
        log.warning("%s: layout=%r is not a mapping of sizes (%s): ignored", PREFIX, layout,
                    ", ".join(LAYOUT_KEYS))
        return out
    for key, value in items:
        try:
            out.update(check_layout({key: value}))
        except ValueError as exc:
            log.warning("%s: %s: ignored", PREFIX, exc)
    return out


def at_least(value: object, least: int, name: str, default: int) -> int:
    """``value`` when it is an int of at least ``least``; else ``default``, said once."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= least:
        return value
    log.warning("%s: %s=%r must be an int >= %d: %d is used", PREFIX, name, value, least, default)
    return default


def interval(value: object, name: str) -> float | None:
    """``value`` when it is None or a finite number >= 0; else None (the default), said once."""
    if value is None:
        return None
    number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
    if number is not None and math.isfinite(number) and number >= 0:
        return number
    log.warning("%s: %s=%r must be a number of seconds >= 0: the default is used", PREFIX, name, value)
    return None
