"""An agent's side of a command: handed to its handler (sync or async), counted, and a failing
handler logged, never raised into the connection that brought it. Shared by the agent's stream to an
aggregator (perfd.transport.client) and its publisher to the engine (perfd.engine.publisher).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable

from perfd.transport.codec import Command

log = logging.getLogger("perfd.transport")


class CommandTarget:
    """Mixed into a client: set ``on_command``; ``_dispatch(cmd)`` from the client's event loop."""

    agent_id: str
    on_command: Callable[[Command], object] | None
    commands_received: int
    command_errors: int
    _tasks: set[asyncio.Future[object]]

    def _dispatch(self, cmd: Command) -> None:
        self.commands_received += 1
        if self.on_command is None:
            log.warning("perfd agent %s: command %s (%s) received but no handler is set",
                        self.agent_id, cmd.id, cmd.kind)
            return
        try:
            res = self.on_command(cmd)
            if inspect.isawaitable(res):
                task = asyncio.ensure_future(res)
                self._tasks.add(task)  # keep a reference until it finishes
                task.add_done_callback(self._command_done)
        except Exception:
            self.command_errors += 1
            log.exception("perfd agent %s: command handler failed for %s", self.agent_id, cmd)

    def _command_done(self, task: asyncio.Future[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.command_errors += 1
            log.error("perfd agent %s: command handler failed", self.agent_id, exc_info=task.exception())
