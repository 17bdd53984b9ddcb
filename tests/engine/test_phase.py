"""A phase's tasks (perfd.core.phase) end when the phase does, even where the interpreter drops their
cancel: on Python 3.11, ``asyncio.wait_for`` returns a reply that landed in the same turn as the
cancel and drops the cancel. A root's lead ended that way (its lease taken in a loaded run) waited for
ever on its job-roots task, and never led again. In process, no engine: a request stands in whose
reply the test lands in the same turn as the phase's end."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from nats.js.errors import BucketNotFoundError

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.core.limits import Limits
from perfd.core.phase import Phase
from perfd.core.refusals import Refusals
from perfd.engine import subjects as S
from perfd.engine.engine_state import EngineState
from perfd.engine.engine_state import watch as watch_engine
from perfd.engine.root import Root


class _Engine:
    """A JetStream whose first request (any of the calls a task makes) waits for a reply the test gives:
    through ``asyncio.wait_for``, as nats-py's requests do (``through_wait_for``), or directly, as a
    coroutine that a caller's own ``wait_for`` runs as a task of its own. Every later request answers
    at once: no such bucket, stream or consumer."""

    def __init__(self, through_wait_for: bool = True) -> None:
        self.through_wait_for = through_wait_for
        self.asked = asyncio.Event()
        self.reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.requests = 0
        self.dropped = False  # the task's cancel came back as the reply (3.11), not as CancelledError

    async def _request(self) -> None:
        self.requests += 1
        if self.requests == 1:
            self.asked.set()
            if not self.through_wait_for:
                await self.reply
                raise BucketNotFoundError()
            await asyncio.wait_for(self.reply, 5.0)
            task = asyncio.current_task()
            self.dropped = task is not None and task.cancelling() > 0
        raise BucketNotFoundError()

    async def key_value(self, bucket: str) -> Any:
        await self._request()

    async def stream_info(self, name: str, subjects_filter: str | None = None) -> Any:
        await self._request()

    async def consumer_info(self, stream: str, name: str) -> Any:
        await self._request()


async def _end_as_the_reply_lands(engine: _Engine, phase: Phase) -> int:
    """The phase ended in the turn its request's answer lands; the requests made before it ended."""
    await engine.asked.wait()
    engine.reply.set_result(None)  # the reply and the end (its cancel) in one turn of the loop
    if not engine.through_wait_for:
        await asyncio.sleep(0)  # one turn: the request's own task ends, its caller not yet woken
    made = engine.requests
    await phase.end(timeout_s=5.0)
    return made


def test_the_root_of_every_jobs_reading_of_job_roots_ends_with_its_lead_when_its_cancel_is_dropped() -> None:
    async def body() -> tuple[Phase, bool]:
        root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), EngineSink(AggregatorState(), Guard(
            Limits(), Refusals())), "every")
        engine, phase = _Engine(), Phase("root every")
        phase.spawn(root._keep_job_roots(engine, None, phase.over))  # type: ignore[arg-type]
        await _end_as_the_reply_lands(engine, phase)
        return phase, engine.dropped

    phase, dropped = asyncio.run(body())
    assert phase.stuck == 0 and all(t.done() for t in phase.tasks)
    assert dropped == (sys.version_info < (3, 12))  # the case this is about, where the interpreter has it


def test_the_engines_watch_ends_with_its_lead_when_its_cancel_is_dropped() -> None:
    """The watch's reads wait through a ``wait_for`` of its own, which runs the request as a task: the
    cancel is dropped where that task has ended and the watch has not yet woken to it."""
    async def body() -> tuple[Phase, int, int]:
        engine, phase = _Engine(through_wait_for=False), Phase("root every")
        phase.spawn(watch_engine(engine, 4, EngineState(), phase.over))  # type: ignore[arg-type]
        made = await _end_as_the_reply_lands(engine, phase)
        return phase, made, engine.requests

    phase, made, requests = asyncio.run(body())
    assert phase.stuck == 0 and all(t.done() for t in phase.tasks)
    # 3.11: the watch read on (the other streams, the consumers) after its cancel, and stopped at ``over``
    assert (requests > made) == (sys.version_info < (3, 12))


def test_a_task_that_ignores_the_end_is_counted_and_left_not_waited_for() -> None:
    async def deaf(release: asyncio.Event) -> None:
        while not release.is_set():  # takes no cancel: swallows it, as a dropped one would be
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    async def body() -> tuple[Phase, bool]:
        release, phase = asyncio.Event(), Phase("shard a")
        task = phase.spawn(deaf(release))
        await asyncio.sleep(0)
        await phase.end(timeout_s=0.05)
        running = not task.done()
        release.set()
        await task
        return phase, running

    phase, running = asyncio.run(body())
    assert running and phase.stuck == 1
