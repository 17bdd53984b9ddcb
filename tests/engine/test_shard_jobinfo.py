"""A shard's side of the engine's job-info bucket (perfd.engine.shard_jobinfo), against an in-memory
bucket that answers as nats-py's KeyValue does (a missing key raises, a put returns its revision), on
the test's clock: what is read and when, what a read that raced a node message leaves, what is put and
when, and how slow or failing calls are let go and counted. The bucket on a real nats-server, a shard
joining mid-run reading it: tests/engine/test_summaries_live.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from perfd.analytics.common import BACKWARD_COMPUTE, FORWARD_COMPUTE
from perfd.core.jobinfo_json import job_info_to_json
from perfd.core.model import JobInfo, ParallelLayout, StepRecord, TimerValue
from perfd.engine import shard_jobinfo as sj
from perfd.engine import subjects as S
from perfd.engine.partial import Decoded, Partial
from perfd.engine.shard_summaries import ShardSummaries

OLD = job_info_to_json(JobInfo(layout=ParallelLayout(world_size=4, tp=1, pp=2, dp=2, cp=1)))
NEW = job_info_to_json(JobInfo(layout=ParallelLayout(tp=1, pp=4, dp=1)))


class Missing(Exception):
    """nats-py's KeyNotFoundError, as far as the bucket's reader is concerned."""


class Entry:
    def __init__(self, value: bytes) -> None:
        self.value, self.revision = value, 1


class Bucket:
    """The calls the shard makes, each able to wait on ``gate`` (a slow engine) or raise (an away one)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.gets: list[str] = []
        self.puts: list[tuple[str, bytes]] = []
        self.gate: Callable[[], Awaitable[None]] | None = None
        self.fail: Exception | None = None

    async def _call(self) -> None:
        if self.gate is not None:
            await self.gate()
        if self.fail is not None:
            raise self.fail

    async def get(self, key: str) -> Entry:
        self.gets.append(key)
        await self._call()
        if key not in self.data:
            raise Missing(key)
        return Entry(self.data[key])

    async def put(self, key: str, value: bytes) -> int:
        await self._call()
        self.puts.append((key, value))
        self.data[key] = value
        return len(self.puts)

    # the rest of the protocol, unused here
    async def create(self, key: str, value: bytes) -> int:
        raise NotImplementedError

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        raise NotImplementedError

    async def delete(self, key: str, last: int | None = None) -> bool:
        raise NotImplementedError

    async def keys(self) -> list[str]:
        return list(self.data)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def message(*jobs: str, carries: dict[str, str] | None = None) -> Decoded:
    """A node message of rank 0 of each job, with its forward and backward compute (its stage's row)."""
    timers = {FORWARD_COMPUTE: TimerValue(1.0, 1.0, {0: 1.0}),
              BACKWARD_COMPUTE: TimerValue(2.0, 2.0, {0: 2.0})}
    parts = [Partial(j, 1, StepRecord(job=j, iteration=1, rank=0, step_time_ms=10.0, timers=timers),
                     ranks=[0]) for j in jobs]
    return Decoded("m", "agent", 0, parts, dict(carries or {}))


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_a_job_not_read_is_read_from_the_bucket_once_and_one_carried_or_known_is_not() -> None:
    kv, clock = Bucket(), Clock()
    kv.data[S.job_token("a")] = OLD.encode()
    b, sums = sj.JobInfoBucket(kv, clock), ShardSummaries()
    run(b.fill(message("a", "b", carries={"b": NEW}), sums))
    assert kv.gets == [S.job_token("a")] and sums.has_info("a") and b.read == 1
    assert not sums.has_info("b")  # carried: the fold reads it from the message itself
    run(b.fill(message("a"), sums))
    assert len(kv.gets) == 1  # known now: no round trip a message


def test_a_job_the_bucket_lacks_is_asked_again_only_after_a_while() -> None:
    kv, clock = Bucket(), Clock()
    b, sums = sj.JobInfoBucket(kv, clock), ShardSummaries()
    run(b.fill(message("a"), sums))
    clock.now += sj.ASK_AGAIN_S / 2
    run(b.fill(message("a"), sums))
    assert len(kv.gets) == 1 and not sums.has_info("a")
    kv.data[S.job_token("a")] = NEW.encode()  # another shard put it
    clock.now += sj.ASK_AGAIN_S
    run(b.fill(message("a"), sums))
    assert len(kv.gets) == 2 and sums.has_info("a")


def test_a_read_that_raced_a_newer_info_leaves_the_newer() -> None:
    """While the get waits, another partition's consumer folds a node message carrying the job's new
    layout: the bucket's older text does not replace it."""
    kv, clock = Bucket(), Clock()
    kv.data[S.job_token("a")] = OLD.encode()
    b, sums = sj.JobInfoBucket(kv, clock), ShardSummaries()

    async def newer_meanwhile() -> None:
        sums.fold_in({"a": NEW}, (), -1)

    kv.gate = newer_meanwhile
    run(b.fill(message("a"), sums))
    assert b.read == 0 and sums._stages["a"][0] == NEW


def _slow_engine(monkeypatch: pytest.MonkeyPatch) -> tuple[Bucket, Clock, asyncio.Event]:
    """A bucket holding job "a"'s info whose gets are answered only once the event is set, and a
    GET_TIMEOUT_S made short: every get is one the fold does not wait on."""
    monkeypatch.setattr(sj, "GET_TIMEOUT_S", 0.01)
    kv, clock = Bucket(), Clock()
    kv.data[S.job_token("a")] = OLD.encode()
    answer = asyncio.Event()

    async def slow() -> None:
        await answer.wait()

    kv.gate = slow
    return kv, clock, answer


def test_a_slow_get_is_not_waited_on_and_its_answer_is_read_when_it_comes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A get not answered within GET_TIMEOUT_S (here made short): fill returns, the fold goes on with the
    job not read; the job is not asked again while its get is out; the answer, when it comes, is read
    then (counted late), and the ranks folded meanwhile go into their stages."""
    kv, clock, answer = _slow_engine(monkeypatch)

    async def scenario() -> None:
        b, sums = sj.JobInfoBucket(kv, clock), ShardSummaries()
        d = message("a")
        await b.fill(d, sums)  # returns: the get not waited on
        sums.fold_in({}, d.partials, 0)  # the fold goes on, its rank's stage unknown
        assert not sums.has_info("a") and b.late == 1 and b.read == 0
        (before,) = sums.take()[0]["a"]
        assert before.stage_unknown
        clock.now += sj.ASK_AGAIN_S
        await b.fill(message("a"), sums)
        assert kv.gets == [S.job_token("a")]  # its get still out: not asked again
        get = b._pending["a"]
        answer.set()
        await asyncio.wait((get,))  # answered: its callbacks ran in order, the bucket's first
        assert sums.has_info("a") and b.read == 1 and b._pending == {} and sums.restaged == 1
        (after,) = sums.take()[0]["a"]  # sent again, its rank in its stage
        assert not after.stage_unknown and after.seq > before.seq

    run(scenario())


def test_one_get_a_job_however_many_partitions_ask_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two partitions' consumers fold the job's first messages at once while the engine is slow: one
    get, counted late once, its answer read by whichever; a consumer cancelled in its wait (its
    partition let go) leaves the get read still, no error left unretrieved."""
    kv, clock, answer = _slow_engine(monkeypatch)

    async def scenario() -> None:
        b, sums = sj.JobInfoBucket(kv, clock), ShardSummaries()
        await asyncio.gather(b.fill(message("a"), sums), b.fill(message("a"), sums))
        assert kv.gets == [S.job_token("a")] and b.late == 1
        get = b._pending["a"]
        answer.set()
        await asyncio.wait((get,))
        assert sums.has_info("a") and b.read == 1 and b._pending == {}

        kv.data[S.job_token("c")] = NEW.encode()
        answer.clear()
        c_sums = ShardSummaries()
        consumer = asyncio.create_task(b.fill(message("c"), c_sums))
        while S.job_token("c") not in kv.gets:
            await asyncio.sleep(0)
        consumer.cancel()  # the shard let the partition go mid-wait
        await asyncio.gather(consumer, return_exceptions=True)
        get = b._pending["c"]
        answer.set()
        await asyncio.wait((get,))
        assert c_sums.has_info("c") and b._pending == {}

    run(scenario())


def test_a_failing_or_cancelled_get_leaves_the_job_to_be_asked_again_later() -> None:
    kv, clock = Bucket(), Clock()
    kv.data[S.job_token("a")] = OLD.encode()
    kv.fail = ConnectionError("engine away")
    b, sums = sj.JobInfoBucket(kv, clock), ShardSummaries()
    run(b.fill(message("a"), sums))
    assert not sums.has_info("a") and b.read == 0 and b._missed == {"a": clock.now}
    clock.now += sj.ASK_AGAIN_S / 2
    run(b.fill(message("a"), sums))
    assert len(kv.gets) == 1
    never = asyncio.Event()

    async def stall() -> None:
        await never.wait()

    async def cancelled() -> None:  # a get cancelled (the engine's connection closing under it)
        kv.gate, kv.fail = stall, None
        clock.now += sj.ASK_AGAIN_S
        await b.fill(message("a"), sums)
        get = b._pending["a"]
        get.cancel()
        await asyncio.wait((get,))
        assert b._pending == {} and not sums.has_info("a") and b._missed == {"a": clock.now}

    with pytest.MonkeyPatch.context() as m:
        m.setattr(sj, "GET_TIMEOUT_S", 0.01)
        run(cancelled())


def test_infos_are_put_when_changed_or_due_again_and_failures_counted() -> None:
    kv, clock = Bucket(), Clock()
    b = sj.JobInfoBucket(kv, clock)
    run(b.put({"a": OLD, "b": NEW}))
    assert sorted(kv.puts) == sorted([(S.job_token("a"), OLD.encode()), (S.job_token("b"), NEW.encode())])
    run(b.put({"a": OLD}))  # unchanged, just put
    assert len(kv.puts) == 2
    run(b.put({"a": NEW}))  # changed
    assert kv.puts[-1] == (S.job_token("a"), NEW.encode())
    clock.now += sj.PUT_AGAIN_S  # due again: a stale text another shard put is overwritten
    kv.data[S.job_token("b")] = OLD.encode()
    run(b.put({"b": NEW}))
    assert kv.data[S.job_token("b")] == NEW.encode()
    kv.fail = RuntimeError("bucket full")
    run(b.put({"c": OLD}))
    assert b.put_errors == 1 and S.job_token("c") not in kv.data
    kv.fail = None
    run(b.put({"c": OLD}))  # not remembered as put: tried again at the next flush
    assert kv.data[S.job_token("c")] == OLD.encode() and b.put_errors == 1


def test_without_a_bucket_nothing_is_read_or_put() -> None:
    b, sums = sj.JobInfoBucket(None), ShardSummaries()
    run(b.fill(message("a"), sums))
    run(b.put({"a": OLD}))
    assert not sums.has_info("a") and (b.read, b.put_errors) == (0, 0)


def test_what_a_shard_remembers_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sj, "KEPT", 3)
    kv, clock = Bucket(), Clock()
    b, sums = sj.JobInfoBucket(kv, clock), ShardSummaries()
    for j in "abcde":
        run(b.fill(message(j), sums))
    assert list(b._missed) == ["c", "d", "e"]
    run(b.put({j: OLD for j in "abcde"}))
    assert list(b._put) == ["c", "d", "e"]
