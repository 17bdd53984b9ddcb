"""Who holds what, through the engine's KV bucket (perfd.engine.subjects.LEASES_BUCKET): a lease is a
key created only where absent, renewed by revision (compare-and-set), gone when its holder stops
renewing (the bucket's keys expire after the lease TTL, EngineConfig.lease_ttl_s). Nothing here
elects by itself: the engine's replicated KV decides, and a holder that cannot renew stops acting
before its lease can be taken.
"""

from __future__ import annotations

import logging

from perfd.engine.nats_api import JetStream, KeyValue

log = logging.getLogger("perfd.engine")


class Lease:
    """One key held by ``holder``. ``await acquire()``, then ``await renew()`` every TTL/3
    (EngineConfig.renew_s): each says whether it is (still) held."""

    def __init__(self, kv: KeyValue, key: str, holder: str) -> None:
        self.kv, self.key, self.holder = kv, key, holder
        self.revision: int | None = None

    @property
    def held(self) -> bool:
        return self.revision is not None

    async def acquire(self) -> bool:
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            self.revision = await self.kv.create(self.key, self.holder.encode())
        except KeyWrongLastSequenceError:
            self.revision = None
            try:  # held under our own name: this holder restarted within the TTL, and takes it back
                e = await self.kv.get(self.key)
                mine = self.holder.encode()
                if e.value == mine:
                    self.revision = await self.kv.update(self.key, mine, last=e.revision)
            except Exception:  # gone or taken meanwhile: not ours now
                self.revision = None
        return self.held

    async def renew(self) -> bool:
        """Renew a held lease; False (and no longer held) when another took it or it expired."""
        from nats.js.errors import KeyWrongLastSequenceError

        if self.revision is None:
            return False
        try:
            self.revision = await self.kv.update(self.key, self.holder.encode(), last=self.revision)
        except KeyWrongLastSequenceError:
            log.warning("lease %s: lost (expired or taken)", self.key)
            self.revision = None
        return self.held

    async def release(self) -> None:
        if self.revision is not None:
            try:
                await self.kv.delete(self.key, last=self.revision)
            except Exception as exc:  # it expires anyway
                log.info("lease %s: release failed (%s); it expires by itself", self.key, exc)
            self.revision = None


async def holders(js: JetStream, kv: KeyValue, prefix: str, bucket: str | None = None) -> dict[str, str]:
    """Every live key of ``kv``, the bucket ``bucket`` (default: the lease bucket), under ``prefix`` (ending
    in ".", or "" for all) and its holder.

    The keys are read from the bucket's stream's subjects (``stream_info`` with a subject filter), not
    with ``kv.keys()``: that opens a watch, an ephemeral consumer the server keeps after it is stopped
    (measured on nats-server 2.15.1: 1,000 ``keys()`` calls left 1,000 consumers, still there 40 s
    later), and the server refuses a stream's 1,001st consumer ("maximum consumers limit reached",
    its default per stream). Sixteen shards, each listing the members every balance (two seconds),
    reached it after ~2 minutes at 100,000 ranks: every shard's session then failed to start again
    and its partitions stalled."""
    from perfd.engine import subjects as S

    bucket = bucket or S.LEASES_BUCKET
    info = await js.stream_info(S.kv_stream(bucket), subjects_filter=S.kv_subject(bucket, prefix + ">"))
    base = len(S.kv_subject(bucket, ""))
    out = {}
    for subject in sorted(info.state.subjects or {}):
        k = subject[base:]
        try:
            e = await kv.get(k)
        except Exception:  # deleted or expired since (a delete marker is a message of its subject too)
            continue
        if e.value:
            out[k] = e.value.decode(errors="replace")
    return out
