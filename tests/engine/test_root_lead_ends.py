"""How a root's lead ends when its lease is no longer held (perfd.engine.root: ``held`` read before each
batch is handled, in the main loop and in the records, events and summaries readers), on in-memory
streams and a keeper whose ``held`` the test sets: a reader that finds it gone ends the lead with it
(it ended alone before, and the root led on without that stream), and a batch fetched after it went
is left unread (handled before, or skipped as let go by the engine)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from perfd.engine import root as root_module
from perfd.engine import subjects as S
from perfd.engine.root import Root


class _Sub:
    """An ordered consumer's subscription: what is pushed, in order, with its stream sequence."""

    def __init__(self) -> None:
        self.q: asyncio.Queue[Any] = asyncio.Queue()
        self.seq = 0

    def push(self, data: bytes) -> None:
        self.seq += 1
        self.q.put_nowait(SimpleNamespace(subject="perfd.x.0123456789abcdef", data=data,
                                          metadata=SimpleNamespace(sequence=SimpleNamespace(stream=self.seq))))

    async def next_msg(self, timeout: float) -> Any:
        from nats.errors import TimeoutError as NatsTimeout

        try:
            return await asyncio.wait_for(self.q.get(), timeout)
        except asyncio.TimeoutError:
            raise NatsTimeout() from None

    async def unsubscribe(self) -> None:
        pass


class _JS:
    def __init__(self) -> None:
        self.subs: dict[str, _Sub] = {}

    async def key_value(self, bucket: str) -> _KV:
        return _KV()

    async def stream_info(self, name: str, subjects_filter: str | None = None) -> Any:
        return SimpleNamespace(state=SimpleNamespace(subjects=None))  # the job-roots bucket: no job root

    async def subscribe(self, subject: str, stream: str, **kw: Any) -> _Sub:
        sub = self.subs[stream] = _Sub()
        return sub


class _Keeper:
    def __init__(self) -> None:
        self.holds = True
        self.reader_window = False  # the next read by a stream reader's task only says not held

    def held(self, key: str) -> bool:
        task = asyncio.current_task()
        if self.reader_window and task is not None and task.get_coro().__name__ == "read_records":  # type: ignore[union-attr]
            self.reader_window = False
            return False
        return self.holds

    def take_lost(self) -> list[str]:
        return []


class _KV:
    async def put(self, key: str, value: bytes) -> int:
        return 1


async def _never(*args: object, **kw: object) -> None:
    await asyncio.Event().wait()


def _root(monkeypatch: pytest.MonkeyPatch) -> tuple[Root, dict[str, list[bytes]]]:
    monkeypatch.setattr(root_module, "watch_engine", _never)
    root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), None, "root-a")  # type: ignore[arg-type]
    seen: dict[str, list[bytes]] = {"records": [], "partials": []}
    monkeypatch.setattr(root, "handle_records", lambda batch: seen["records"].extend(batch))
    monkeypatch.setattr(root, "handle", lambda batch: seen["partials"].extend(batch))
    monkeypatch.setattr(root, "flush", lambda every=False: None)
    return root, seen


async def _until(pred: Any) -> None:
    while not pred():
        await asyncio.sleep(0.01)  # the loop's turn: the lead's tasks run


def test_a_reader_that_finds_the_lease_gone_ends_the_lead(monkeypatch: pytest.MonkeyPatch) -> None:
    root, seen = _root(monkeypatch)

    async def main() -> tuple[bool, int]:
        js, keeper, stop = _JS(), _Keeper(), asyncio.Event()
        lead = asyncio.create_task(root._lead(js, keeper, stop, _KV(), _KV()))  # type: ignore[arg-type]
        await _until(lambda: S.RECORDS_STREAM in js.subs and S.PARTIALS_STREAM in js.subs)
        records = js.subs[S.RECORDS_STREAM]
        records.push(b"r1")
        await asyncio.wait_for(_until(lambda: seen["records"] == [b"r1"]), 10)
        # held says no once, to the records reader alone (a renewal's reply late, then in): it leaves r2
        # unread and ends, and the lead with it; reading on, the lead would never read r2 again
        keeper.reader_window = True
        records.push(b"r2")
        records.push(b"r3")
        await asyncio.wait_for(lead, 10)
        stop.set()
        return lead.done(), root.stats.leadership_lost

    done, lost = asyncio.run(main())
    assert done and lost == 1
    assert seen["records"] == [b"r1"]  # r2 and r3 unread: whoever leads next reads them


def test_a_batch_fetched_after_the_lease_went_is_left_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    root, seen = _root(monkeypatch)

    async def main() -> int:
        js, keeper, stop = _JS(), _Keeper(), asyncio.Event()
        lead = asyncio.create_task(root._lead(js, keeper, stop, _KV(), _KV()))  # type: ignore[arg-type]
        await _until(lambda: S.PARTIALS_STREAM in js.subs)
        partials = js.subs[S.PARTIALS_STREAM]

        # the lease goes while the main loop waits for p2: held is read after the batch came
        async def next_then_gone(timeout: float) -> Any:
            msg = await _Sub.next_msg(partials, timeout)
            if msg.data == b"p2":
                keeper.holds = False
            return msg

        monkeypatch.setattr(partials, "next_msg", next_then_gone)
        partials.push(b"p1")
        await asyncio.wait_for(_until(lambda: seen["partials"] == [b"p1"]), 10)
        partials.push(b"p2")
        await asyncio.wait_for(lead, 10)
        stop.set()
        return root.stats.leadership_lost

    assert asyncio.run(main()) == 1
    assert seen["partials"] == [b"p1"] and root._read_to == 1 and root.stats.partials_skipped == 0
