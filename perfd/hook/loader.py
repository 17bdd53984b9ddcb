"""The data fetch, stamped: how long the training thread spends getting its batches.

The loop people write fetches the batch *between* steps::

    for i, batch in enumerate(loader, 1):      # the fetch: before step_begin
        with hook.step(step=i):
            ...

so the step hook also times what lies between one step's end and the next one's begin
(perfd.hook.step). To tell a data wait from other host work there (logging, an evaluation, a
checkpoint), the fetches are stamped on a process-wide :class:`FetchClock`: the total time the
training thread has spent inside a fetch. The hook reads it at each step boundary (one attribute
read); the difference between two readings is the data wait in between, wherever the fetch was
(between the steps, inside a step, several micro-batches of a gradient-accumulation step).

Two things stamp it:

- :class:`Loader`, ``hook.loader(iterable)``: wraps any iterable (a DataLoader, a webdataset or a
  streaming pipeline, a generator); each ``next()`` is a fetch. Exact for whatever it wraps.
- :func:`watch_dataloader`: every ``torch.utils.data.DataLoader`` iterator, without a change to the
  script (``_BaseDataLoaderIter.__next__``, which both the single- and the multi-process iterators
  use, wrapped once per process). This is what makes the README's loop, the Hugging Face Trainer's
  and Lightning's fetches read as data waits. ``StepHook(watch_dataloader=False)`` or
  ``PERFD_HOOK_DATALOADER=0`` leaves torch alone; the time between steps then reads as "outside
  the step" unless ``hook.loader`` wraps the loader.

Only fetches on the training thread count (the thread that runs the hook's steps): a prefetching
thread's fetches overlap the step, the loop does not wait for them. A fetch inside another on the
same clock (a ``Loader`` around a DataLoader) is counted once, as the outer one. Cost: two ``perf_counter_ns``
and a thread check per batch (~0.3 µs), nothing per step.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

DISABLE_ENV = "PERFD_HOOK_DATALOADER"  # "0": do not wrap torch's DataLoader iterators
_MARK = "__perfd_fetch__"


class FetchClock:
    """Time the training thread has spent inside fetches, in ns, and how many there were.

    Written only by the thread it watches (``thread``), read by the same thread at step
    boundaries: no lock. ``total_ns`` only grows; a reader keeps its own last reading."""

    __slots__ = ("after", "after_min_ns", "busy", "count", "thread", "total_ns")

    def __init__(self) -> None:
        self.total_ns = 0
        self.count = 0
        self.thread = threading.get_ident()  # the hook sets it to its training thread
        self.busy = False  # a fetch is being timed (an inner one is not counted again)
        # Called with a timed fetch's ns once it is counted, for fetches of after_min_ns or more (the
        # hook: a long fetch inside a step marks the GPU's clock, perfd.hook.step; a prefetched batch,
        # returned at once, costs one comparison more). It must not raise.
        self.after: Callable[[int], None] | None = None
        self.after_min_ns = 0

    @property
    def live(self) -> bool:
        """A fetch has been stamped on the watched thread: its data waits are measured (a step
        without one waited 0 ns for data, it is not unknown)."""
        return self.count > 0

    def watch(self, thread: int | None = None) -> None:
        """Count the fetches of ``thread`` (default: the calling one) from now on."""
        self.thread = threading.get_ident() if thread is None else thread

    def timed(self, fetch: Callable[[], T]) -> T:
        """``fetch()``, its duration added when it runs on the watched thread and no outer fetch
        is being timed. Raises what ``fetch`` raises (StopIteration included), timed too."""
        if self.busy or threading.get_ident() != self.thread:
            return fetch()
        self.busy = True
        t0 = time.perf_counter_ns()
        try:
            return fetch()
        finally:
            took = time.perf_counter_ns() - t0
            self.total_ns += took
            self.count += 1
            self.busy = False
            if took >= self.after_min_ns and self.after is not None:
                self.after(took)


# One per process: a DataLoader's iterator does not know which hook (if any) watches it. A hook that
# leaves torch's DataLoader alone (watch_dataloader=False) keeps a clock of its own for its Loaders.
CLOCK = FetchClock()


class Loader(Generic[T]):
    """``hook.loader(loader)``: iterate it as you would ``loader``; each batch's fetch is stamped.

    Attributes other than iteration (``len()``, ``.dataset``, ``.sampler``, ``set_epoch``...) are
    the wrapped object's."""

    def __init__(self, iterable: Iterable[T], clock: FetchClock = CLOCK) -> None:
        self._iterable = iterable
        self._clock = clock

    def __iter__(self) -> Iterator[T]:
        return _Fetching(iter(self._iterable), self._clock)

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:  # the wrapped object's: of any type
        if name.startswith("__") or name in ("_iterable", "_clock"):
            raise AttributeError(name)
        return getattr(self._iterable, name)


class _Fetching(Generic[T]):
    __slots__ = ("_clock", "_it")

    def __init__(self, it: Iterator[T], clock: FetchClock) -> None:
        self._it, self._clock = it, clock

    def __iter__(self) -> _Fetching[T]:
        return self

    def __next__(self) -> T:
        return self._clock.timed(self._it.__next__)


def watch_disabled() -> bool:
    """``PERFD_HOOK_DATALOADER=0``: torch's DataLoader is left alone."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("0", "false", "off")


def watch_dataloader(clock: FetchClock = CLOCK) -> bool:
    """Stamp every ``torch.utils.data.DataLoader`` fetch of this process on ``clock`` (once per
    process; a no-op when done). Only when the script has imported torch's DataLoader already
    (perfd never imports it) and ``PERFD_HOOK_DATALOADER`` is not ``0``. True when the fetches are
    stamped. Never raises."""
    if watch_disabled():
        return False
    mod = sys.modules.get("torch.utils.data.dataloader")
    cls = getattr(mod, "_BaseDataLoaderIter", None) if mod is not None else None
    try:
        original = cls.__dict__.get("__next__") if cls is not None else None
        if original is None:
            return False
        if getattr(original, _MARK, False):
            return True

        @functools.wraps(original)
        def __next__(self: object) -> object:
            return clock.timed(functools.partial(original, self))

        setattr(__next__, _MARK, True)
        cls.__next__ = __next__  # type: ignore[union-attr]
    except Exception:  # a torch whose iterator class will not take it: no stamps, never an error
        return False
    return True


def dataloader_watched() -> bool:
    """Whether this process's DataLoader fetches are stamped."""
    mod = sys.modules.get("torch.utils.data.dataloader")
    cls = getattr(mod, "_BaseDataLoaderIter", None) if mod is not None else None
    nxt = cls.__dict__.get("__next__") if cls is not None else None
    return bool(getattr(nxt, _MARK, False))
