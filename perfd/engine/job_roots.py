"""Jobs with a root of their own (``perfd aggregator --engine --engine-job NAME``), as the engine's
job-roots bucket says (perfd.engine.subjects.JOB_ROOTS_BUCKET): a job's own root puts its job's key
there while it leads, and the key lasts JOB_ROOTS_TTL_S past the last put. The root of every job reads
the keys and leaves those jobs' messages to their roots (:meth:`JobRoots.ours`), through a root's
failover (a lease TTL) and for the grace after; the bucket, not a process's memory, holds that grace,
so whichever process of the root of every job leads — a standby that took over, one started again —
leaves the same jobs. perfd.engine.root uses it; nothing here folds or holds a job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from perfd.engine import subjects as S
from perfd.engine.leases import holders
from perfd.engine.nats_api import JetStream, KeyValue
from perfd.engine.rootfold import RootStats

log = logging.getLogger("perfd.engine")


async def mark(roots: KeyValue, job: str, holder: str) -> None:
    """(A job's own root, leading) its job's key put again: the root of every job leaves the job to it
    while the key lasts. A failed put is tried at the next renewal (the key outlasts many)."""
    try:
        await roots.put(S.job_token(job), holder.encode())
    except Exception as exc:
        log.warning("engine root %s: could not mark job %r as led by it (%s)", holder, job[:80], exc)


async def read(js: JetStream) -> set[str]:
    """The tokens of the jobs with a root of their own now: the bucket's keys, listed from its stream's
    subjects (no watch: a watch's consumer is kept by the server after it stops), each one's value read
    (a key deleted or purged by hand keeps its subject: not a root's). No bucket: none (a job's own root
    cannot lead without one). Raises what else the engine raised."""
    from nats.js.errors import BucketNotFoundError, NotFoundError

    try:
        roots = await js.key_value(S.JOB_ROOTS_BUCKET)
        return set(await holders(js, roots, "", S.JOB_ROOTS_BUCKET))
    except (BucketNotFoundError, NotFoundError):
        return set()


class JobRoots:
    """What the root of every job leaves to jobs' own roots: the tokens as last read, and the messages
    it skips for them (counted in ``stats``: led_elsewhere, jobs_led_elsewhere)."""

    def __init__(self, stats: RootStats) -> None:
        self.stats = stats
        self.tokens: set[str] = set()

    def note(self, tokens: Iterable[str]) -> tuple[set[str], set[str]]:
        """``tokens``: the jobs with a root of their own now. Returns (those new among them, those no
        longer: no root of their own for the grace, read again from the next message)."""
        now = set(tokens)
        new, gone = now - self.tokens, self.tokens - now
        self.tokens = now
        self.stats.jobs_led_elsewhere = len(now)
        return new, gone

    def ours(self, msgs: Iterable[tuple[str, bytes]]) -> list[bytes]:
        """Of ``msgs`` (subject, data), the data the root of every job folds: all but those of jobs with
        a root of their own (counted)."""
        if not self.tokens:
            return [data for _, data in msgs]
        out = []
        for subject, data in msgs:
            if S.token_of(subject) in self.tokens:
                self.stats.led_elsewhere += 1
            else:
                out.append(data)
        return out
