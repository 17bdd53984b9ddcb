"""Who holds what, through the engine's KV bucket (perfd.engine.subjects.LEASES_BUCKET): a lease is a
key created only where absent, renewed by revision (compare-and-set), gone when its holder stops
renewing (the bucket's keys expire after the lease TTL, EngineConfig.lease_ttl_s). Nothing here
elects by itself: the engine's replicated KV decides, and a holder that cannot renew stops acting
before its lease can be taken.
"""

from __future__ import annotations

import logging

from perfd.engine.nats_api import KeyValue

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


async def holders(kv: KeyValue, prefix: str) -> dict[str, str]:
    """Every live key under ``prefix`` and its holder."""
    from nats.js.errors import NoKeysError

    try:
        keys = await kv.keys()
    except NoKeysError:
        return {}
    out = {}
    for k in keys:
        if k.startswith(prefix):
            try:
                e = await kv.get(k)
            except Exception:  # expired between keys() and get(): not live
                continue
            if e.value:
                out[k] = e.value.decode(errors="replace")
    return out
