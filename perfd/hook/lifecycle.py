"""The step hook's harvester thread loop, and what becomes of every live hook at interpreter exit
and in a forked child (``perfd.hook.harvest`` has the why of the thread itself)."""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections.abc import Callable
from typing import Protocol


class Harvested(Protocol):
    """What this module needs of a ``StepHook``."""

    _stop: bool

    def _pass(self) -> None: ...

    def _last_passes(self) -> None: ...

    def close(self, timeout_s: float = 0.0) -> None: ...

    def _after_fork_in_child(self) -> None: ...


def harvest_loop(ref: Callable[[], Harvested | None], wake: threading.Event, interval_s: float) -> None:
    """The harvester thread. ``ref`` is a weak reference: a hook dropped without close() ends it
    within one interval, instead of being kept alive by its own thread."""
    while True:
        wake.wait(interval_s)
        wake.clear()
        hook = ref()
        if hook is None:
            return
        if hook._stop:  # close(): the last harvest happens here, where the CUDA context is current
            hook._last_passes()
            return
        hook._pass()
        del hook


# Every hook not yet garbage: closed at interpreter exit, fixed up in a forked child.
_LIVE: weakref.WeakSet[Harvested] = weakref.WeakSet()
_registered = False


def track(hook: Harvested) -> None:
    """Called by each new hook. The handlers are registered at the first, after torch was imported
    for it: atexit runs handlers last-registered first, so ours runs before any torch registered,
    while CUDA is still usable."""
    global _registered
    _LIVE.add(hook)
    if _registered:
        return
    _registered = True
    atexit.register(_close_all)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork)


def _close_all() -> None:
    """At exit: report what is done (no wait for the GPU), send the batch, stop the threads."""
    for hook in list(_LIVE):
        hook.close()


def _after_fork() -> None:
    for hook in list(_LIVE):
        hook._after_fork_in_child()


def weakly(method: weakref.WeakMethod[Callable[[int], None]]) -> Callable[[int], None]:
    """A hook's method for an object that lives as long as the process (the fetch clock's ``after``),
    without keeping the hook alive: a hook dropped without close() is collected, its thread ends."""
    def call(arg: int) -> None:
        bound = method()
        if bound is not None:
            bound(arg)
    return call
