"""An agent's stream as the fault tests drive it: batches sent through the real AgentClient, each
acknowledged (the spool kept small by waiting for Acks every few batches)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from perfd.transport.client import AgentClient


@contextlib.asynccontextmanager
async def streaming(c: AgentClient) -> AsyncIterator[AgentClient]:
    """The client's stream open for the block; closed after it (the agent is gone)."""
    task = asyncio.create_task(c.run())
    try:
        yield c
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def send_batches(target: str, agent: str, batches: list[dict[str, Any]], jobs: list[str]) -> None:
    """One agent: Hello naming ``jobs``, the batches (submit's keyword arguments), all acknowledged."""
    async with streaming(AgentClient(target, agent, jobs=jobs)) as c:
        for b in batches:
            c.submit(**b)
            if c.spool.pending_count() >= 8:  # keep the spool (memory) small: wait for Acks
                assert await c.flush(60)
        assert await c.flush(60)
