"""The ranks a capture request names, checked where the request enters the aggregator (POST
/api/captures, the Alertmanager webhook; perfd.aggregator.captures.CaptureCoordinator.request).

Each rank is an integer with 0 <= rank < the job's world size when the job states one, and always
below MAX_RANK, well inside the int32 the protocol's Command carries (perfd/transport/perfd.proto);
a rank named twice counts once; at most perfd.core.limits.MAX_CAPTURE_RANKS of them. None named (or an
empty list) asks for every rank of the job, as the command's empty rank list says to the agents.

Unchecked: a rank past int32 was answered 202, failed to encode in the
command sender and left its record ``requested`` with rank 0 held for 600 s (a real capture then got
409); -1 went on to the agent; 500,000 ranks in one request held 7.5 MB a record.
"""

from __future__ import annotations

import re

from perfd.core import limits as L
from perfd.core.bounds import LAYOUT_BOUNDS

# The largest world size a job may state (perfd.core.bounds): no rank is at or past it. 2^22, far inside
# int32, so a checked rank always encodes.
MAX_RANK = LAYOUT_BOUNDS["world_size"][1]
# A rank as a label writes it ("0,3"): at most 12 digits. Longer is no rank, and is not handed to
# int() (which raises past 4,300 digits, and costs quadratic time below that).
_RANK_TEXT = re.compile(r"-?[0-9]{1,12}")


class RanksRefused(ValueError):
    """Why a request's ranks are refused: the API answers 400 with it, the webhook lists it."""


def _shown(value: object) -> str:
    """A named rank as a refusal quotes it: short, whatever it is."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return repr(value)[:40]
    return f"a {type(value).__name__}"


def ranks_of_label(text: str) -> list[object]:
    """The ranks an alert's label names ("0,3"): each that reads as an integer becomes one, the rest
    stay text for :func:`checked_ranks` to refuse by name (an unreadable rank was left out, and a
    label of none read became a capture of every rank)."""
    items = [x.strip() for x in text.split(",")]
    return [int(x) if _RANK_TEXT.fullmatch(x) else x for x in items if x]


def checked_ranks(raw: object, world: int | None, cap: int = L.MAX_CAPTURE_RANKS) -> tuple[int, ...] | None:
    """The ranks a request names, in its order, each once; None: every rank of the job. ``world``:
    the job's stated world size (None: not known). RanksRefused names the first bad rank, or the cap.
    Stops at the first refusal, so a refused request costs at most one pass over what it sent."""
    if raw is None:
        return None
    if not isinstance(raw, (list, tuple)):
        raise RanksRefused(f"'ranks' must be a list of integers, got {_shown(raw)}")
    high = min(world, MAX_RANK) if world is not None and world > 0 else MAX_RANK
    whose = f"the job's world size {high}" if high != MAX_RANK else f"{MAX_RANK} (perfd's largest world size)"
    out: dict[int, None] = {}
    for r in raw:
        if not isinstance(r, int) or isinstance(r, bool):
            raise RanksRefused(f"rank {_shown(r)} is not an integer")
        if not 0 <= r < high:
            raise RanksRefused(f"rank {_shown(r)} is out of range: a rank is >= 0 and below {whose}")
        out[r] = None
        if len(out) > cap:
            raise RanksRefused(f"{len(raw)} ranks named; a capture names at most {cap} distinct ranks "
                               "(name none to capture every rank of the job)")
    return tuple(out) or None
