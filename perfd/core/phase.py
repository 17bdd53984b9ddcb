"""Tasks that live as long as a phase of something (an engine root's lead, a shard's session, an agent's
stream to its aggregator), ended by an event the phase sets, not by a cancel alone.

Why not a cancel alone. Python 3.11's ``asyncio.wait_for`` returns its future's result and drops the
task's cancellation when the two land in the same turn of the loop (fixed in 3.12). Every request to
the engine waits through it (nats-py's request, ``next_msg``): a cancel that arrived with a reply was
lost, the task's loop went round again, and the phase's teardown, awaiting it, waited for ever — a
root whose lease was taken never led again (a loaded run of the suite); an agent's stream whose
aggregator stopped answering would likewise never have been torn down. So a phase's tasks loop
``while not phase.over.is_set()``, and :meth:`Phase.end` sets it before it cancels them: a cancel
lost in a reply ends the task at its next round instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("perfd")

# A task that neither takes its cancel nor sees ``over`` within this is left running, said, not awaited
# (its teardown must end: a session that cannot end cannot start again)
END_TIMEOUT_S = 10.0


class Phase:
    """``spawn`` the phase's tasks (each looping while ``over`` is not set); ``await end()`` once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.over = asyncio.Event()
        self.tasks: list[asyncio.Task[Any]] = []
        self.stuck = 0  # tasks left running at end() (none, unless a task ignores ``over``)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self.tasks.append(task)
        return task

    async def end(self, timeout_s: float = END_TIMEOUT_S) -> None:
        """Set ``over``, cancel the tasks and wait for them, at most ``timeout_s``. Their errors are
        not raised here (their owner reads a task's result where it matters)."""
        self.over.set()
        for t in self.tasks:
            t.cancel()
        if not self.tasks:
            return
        _, late = await asyncio.wait(self.tasks, timeout=timeout_s)
        self.stuck += len(late)
        for t in late:
            log.warning("%s: a task (%s) did not end within %.0f s of its phase's end; left running",
                        self.name, t.get_coro(), timeout_s)
        for t in self.tasks:
            if t.done() and not t.cancelled():
                t.exception()  # read: asyncio does not log it as never retrieved
