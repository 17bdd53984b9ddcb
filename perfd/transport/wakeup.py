"""Waking a sender's event loop from whichever thread has something for it to send (the agent's
collectors submit on their own threads; the loop may also be the caller's own)."""

from __future__ import annotations

import asyncio


def wake(loop: asyncio.AbstractEventLoop | None, event: asyncio.Event | None) -> None:
    """Set ``event`` on ``loop``: directly on the loop's own thread, else through the loop. Nothing
    when the loop has not started (its sender reads what is pending when it starts) or is closed."""
    if loop is None or event is None or loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        event.set()
    else:
        loop.call_soon_threadsafe(event.set)
