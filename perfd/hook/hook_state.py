"""What the parts of ``StepHook`` share: the per-step ``Slot`` handed from the training thread to
the harvester, and ``HookState``, the state more than one part reads and the error accounting
every part reports to.

Separate so that the parts (the step path and lifecycle in ``perfd.hook.step``, the harvester in
``perfd.hook.harvest``, profile control in ``perfd.hook.profile``) can each live in a module of
its own and import only downward: this module imports none of them.
"""

from __future__ import annotations

from collections import deque

from perfd.hook.sender import DatagramSender
from perfd.hook.timing import Marker, MarkerFactory


class Slot:
    """One step's events and host stamps; slots are reused, never allocated per step.

    Hand-over between the threads: the training thread writes a slot taken from the free deque
    and appends it to the pending deque at step_end(), never touching it again; the harvester
    reads it from there and puts it back on the free deque. A slot reads the previous step's end
    (``prev``: its period starts there, and its begin too when aliased) and needs that slot's end
    intact: the harvester keeps the last slot it read (``_held``) until it has read the next one,
    and the training thread only refers to the last slot it appended, so the slot referred to is
    always pending or held, never free.
    """

    __slots__ = ("aliased", "begin", "data", "data_event", "end", "f_begin", "f_data", "f_end", "f_mark",
                 "fetch_live", "flops", "gap_fetch_ns", "gap_ns", "index", "paused_in_ns", "paused_ns",
                 "prev", "profiling", "seq", "step", "t_begin", "t_data", "tokens", "wall_end_ns")

    def __init__(self, make: MarkerFactory) -> None:
        self.begin: Marker = make()
        self.end: Marker = make()
        self.data: Marker = make()  # recorded at data_ready() when asked, or after a long host wait
        self.step = 0
        self.index = 0
        # The step before this one (the last appended at this one's begin), None after a gap in the
        # series (the first step, one abandoned or dropped): its end marker starts this one's period.
        self.prev: Slot | None = None
        self.aliased = False  # this step's begin *is* prev's end marker (no begin of its own recorded)
        self.t_begin = 0
        self.t_data = -1  # host stamp of data_ready(), -1 when not called
        # Between the steps, host ns (perfd.hook.step): from prev's step_end() returning to this
        # step_begin(), and of it the stamped fetches (perfd.hook.loader); announced pauses
        # (checkpoint, evaluation) in this step's period, and their fetches, are taken out of both.
        self.gap_ns = -1
        self.gap_fetch_ns = 0
        self.paused_ns = 0  # paused between the steps (in gap_ns)
        self.paused_in_ns = 0  # paused while this step was open
        # The fetch clock's readings at begin, data_ready() and end; whether it had stamped a fetch.
        self.f_begin = self.f_data = self.f_end = 0
        self.fetch_live = False
        self.data_event = False  # the data event was recorded in this step
        # The fetch clock when a fetch inside the step recorded the data event at its end (-1: none did)
        self.f_mark = -1
        self.profiling = False
        self.wall_end_ns = 0
        # This step's work as step_end() was told it (None: the hook's defaults): read, checked and
        # turned into FLOPs by the harvester, never on the training thread.
        self.tokens: object = None
        self.flops: object = None
        self.seq: object = None

    def markers(self) -> list[Marker]:
        return [self.begin, self.end, self.data]


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
        """Exceptions the hook caught instead of letting them reach the loop (``last_error``: the last)."""
        return self._step_errors + self._harvest_errors

    def _internal(self, exc: BaseException, harvester: bool = False) -> None:
        if harvester:  # one counter per thread: += is not atomic across threads
            self._harvest_errors += 1
        else:
            self._step_errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
