"""A shard's side of the engine's job-info bucket (perfd.engine.subjects.JOBINFO_BUCKET): the job infos
it reads from node messages go there, and a job's info it has not read (a partition taken over mid-run:
the agents send a job's info on change and once a minute) is read there before the job's node message
is folded, so that its ranks go into their pipeline stages at once rather than stage-unknown.

Best effort by design: the bucket only shortens the wait for the agents' next send. A bucket the engine
could not make, a get or put that fails or is slow, leaves the shard as it was without it (counted,
logged); no fold waits on it longer than GET_TIMEOUT_S, and no acknowledgement on a put. A get
answered later is read then: the ranks folded meanwhile are grouped by stage then, their summaries
sent again (perfd.engine.stepsummary.PartitionSummaries.restage).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from perfd.engine import subjects as S
from perfd.engine.nats_api import KeyValue, KVEntry
from perfd.engine.partial import Decoded
from perfd.engine.shard_summaries import ShardSummaries

log = logging.getLogger("perfd.engine")
V = TypeVar("V")

# A job whose info the bucket did not hold is asked for again after this long (no round trip a node
# message till then)
ASK_AGAIN_S = 5.0
# A job's info is put again after this long even unchanged: a shard that put an older text (a message
# delivered again, an agent behind) is overwritten within it by the shards that read the current one,
# as the agents' own send (JOBINFO_RESEND_S) would correct a taking shard
PUT_AGAIN_S = 60.0
GET_TIMEOUT_S = 0.5  # a get slower than this is not waited on (the fold goes on; its answer read later)
PUT_TIMEOUT_S = 2.0  # the puts of one flush, together
KEPT = 4096  # jobs whose last put, or last miss, a shard remembers (the oldest let go first)


class JobInfoBucket:
    def __init__(self, kv: KeyValue | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.kv, self.clock = kv, clock
        self.read = 0  # infos read from the bucket
        self.put_errors = 0  # puts the engine refused or did not answer in time
        self._put: dict[str, tuple[str, float]] = {}  # job -> (info, when) this shard put
        self._missed: dict[str, float] = {}  # job -> when the bucket had none of it
        self._pending: dict[str, asyncio.Future[KVEntry]] = {}  # job -> its get, not answered in time
        self.late = 0  # gets answered past GET_TIMEOUT_S, or not at all

    async def fill(self, d: Decoded, summaries: ShardSummaries) -> None:
        """The info of each job of ``d`` that ``summaries`` has not read and ``d`` does not carry, from
        the bucket, into ``summaries``. A get not answered within GET_TIMEOUT_S is not waited on but
        not let go either: its answer, when it comes, is read then (the ranks folded meanwhile grouped
        by stage then: ShardSummaries.fold_in)."""
        if self.kv is None:
            return
        now = self.clock()
        for job in {p.job for p in d.partials if p.fold is not None} - d.job_info_json.keys():
            missed = self._missed.get(job)
            if (summaries.has_info(job) or job in self._pending
                    or (missed is not None and now - missed < ASK_AGAIN_S)):
                continue
            # Its answer read by the callback, whenever it comes (the callback runs before the wait
            # returns where it comes within it): a get is never left without a reader, the consumer
            # cancelled mid-wait (its partition let go) included, and one get a job at a time, whichever
            # partition's consumer asks meanwhile
            get = self._pending[job] = asyncio.ensure_future(self.kv.get(S.job_token(job)))
            summaries.expect(job)
            get.add_done_callback(functools.partial(self._answered, job, summaries))
            await asyncio.wait((get,), timeout=GET_TIMEOUT_S)
            if not get.done():  # the engine slow: the fold goes on, the answer read when it comes
                self.late += 1
                log.info("engine: job %r's info not read from the bucket within %.1f s: its ranks' "
                         "stages once it is", job, GET_TIMEOUT_S)

    def _answered(self, job: str, summaries: ShardSummaries, get: asyncio.Future[KVEntry]) -> None:
        if self._pending.get(job) is get:
            del self._pending[job]
        text = ""
        if get.cancelled():
            log.debug("engine: job %r's info not read from the bucket: the get cancelled", job)
        elif (exc := get.exception()) is not None:  # none there (KeyNotFoundError), or the engine away
            log.debug("engine: job %r's info not read from the bucket: %s", job, exc)
        else:
            value = get.result().value
            text = value.decode() if value else ""
        # another partition's consumer may have read a newer one from a node message meanwhile
        if text and not summaries.has_info(job):
            summaries.fold_in({job: text}, (), -1)
            self.read += 1
            self._missed.pop(job, None)
        else:
            summaries.not_expected(job)  # what was kept to group by stage let go (none is coming now)
            if not text:
                _remember(self._missed, job, self.clock())

    async def put(self, infos: Mapping[str, str]) -> None:
        """The infos read from node messages since the last flush, put where changed or put PUT_AGAIN_S
        ago, concurrently, within PUT_TIMEOUT_S."""
        if self.kv is None:
            return
        now = self.clock()
        due = {job: text for job, text in infos.items()
               if (was := self._put.get(job)) is None or was[0] != text or now - was[1] >= PUT_AGAIN_S}
        if not due:
            return
        kv = self.kv
        puts = [asyncio.ensure_future(kv.put(S.job_token(job), text.encode())) for job, text in due.items()]
        done, pending = await asyncio.wait(puts, timeout=PUT_TIMEOUT_S)
        for t in pending:
            t.cancel()
        for (job, text), t in zip(due.items(), puts, strict=True):
            if t in done and not t.cancelled() and t.exception() is None:
                _remember(self._put, job, (text, now))
            else:  # the bucket full, the engine away: a taking shard waits for the agents' next send
                self.put_errors += 1
                log.warning("engine: job %r's info not put in the engine's bucket: %s", job,
                            "no answer in time" if t in pending else t.exception())


def _remember(d: dict[str, V], key: str, value: V) -> None:
    d.pop(key, None)  # to the end: the oldest let go first
    d[key] = value
    while len(d) > KEPT:
        d.pop(next(iter(d)))
