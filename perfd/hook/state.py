"""What the parts of ``StepHook`` share: the per-step ``Slot`` handed from the training thread to
the harvester, and ``HookState``, the state more than one part reads and the error accounting
every part reports to.

Separate so that the parts (the step path and lifecycle in ``perfd.hook.step``, the harvester in
``perfd.hook.harvest``, profile control in ``perfd.hook.profile``) can each live in a module of
its own and import only downward: this module imports none of them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from perfd.hook.sender import DatagramSender
from perfd.hook.timing import Marker, MarkerFactory


class Slot:
    """One step's events and host stamps; slots are reused, never allocated per step.

    Hand-over between the threads: the training thread writes a slot taken from the free deque
    and appends it to the pending deque at step_end(), never touching it again; the harvester
    reads it from there and puts it back on the free deque. A slot whose begin is the previous
    step's end (``prev``) needs that slot's end intact: the harvester keeps the last slot it read
    (``_held``) until it has read the next one, and the training thread only aliases the last
    slot it appended, so the slot referred to is always pending or held, never free.
    """

    __slots__ = ("begin", "data", "data_event", "end", "flops", "index", "prev", "profiling", "seq", "step",
                 "t_begin", "t_data", "tokens", "wall_end_ns")

    def __init__(self, make: MarkerFactory, data_event: bool) -> None:
        self.begin: Marker = make()
        self.end: Marker = make()
        self.data: Marker | None = make() if data_event else None
        self.step = 0
        self.index = 0
        self.prev: Slot | None = None  # the step whose end event is this one's begin
        self.t_begin = 0
        self.t_data = -1  # host stamp of data_ready(), -1 when not called
        self.data_event = False  # the data event was recorded in this step
        self.profiling = False
        self.wall_end_ns = 0
        # This step's work as step_end() was told it (None: the hook's defaults): read, checked and
        # turned into FLOPs by the harvester, never on the training thread.
        self.tokens: Any = None
        self.flops: Any = None
        self.seq: Any = None

    def markers(self) -> list[Marker]:
        return [m for m in (self.begin, self.end, self.data) if m is not None]


class HookState:
    """Base of ``StepHook``: the attributes its parts share (set in ``StepHook.__init__``, declared
    here for the type checker only: no class attributes), and ``_internal``, which every part calls
    instead of letting an exception reach the training loop."""

    sender: DatagramSender
    pid: int
    _rank: int | None
    _outbox: deque[bytes]
    _step_errors: int
    _harvest_errors: int
    last_error: str | None

    @property
    def internal_errors(self) -> int:
        return self._step_errors + self._harvest_errors

    def _internal(self, exc: BaseException, harvester: bool = False) -> None:
        if harvester:  # one counter per thread: += is not atomic across threads
            self._harvest_errors += 1
        else:
            self._step_errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
