"""A shard's or a root's leases (perfd.engine.leases) held and renewed on a thread of their own, with its
own event loop and its own connection to the engine, so that no fold, however long, delays a renewal.

Why a thread, not the shard's event loop. A shard folds its node messages on its event loop; a fetch
of them with their collective operations took seconds to fold, and the renewals, each a request and
its reply waiting their turn behind it (with the member count's reads, a few dozen of them a round),
came after the lease's TTL: the shard lost its partitions 5-13 times a run at 100,000 ranks
(docs/evidence/entries/48-scale-history.md), each then waiting out the ack wait at its next holder. Yielding
more often only
shortens the turns; it bounds nothing (a message's fold is as long as its operations make it). Here
the renewals run where nothing else does: the fold holds the interpreter's lock, which a waiting
thread gets within its switch interval (5 ms), so a lease is renewed on time however busy the fold.

A shard or root that stops acting must still lose its leases: the owner calls :meth:`LeaseKeeper.beat`
from its loop (:func:`keep_beating`), and a keeper that has not heard from it for LOOP_STALL_S (a hung
loop, not a busy one: a fold yields between messages) stops renewing, so its partitions (or the root's
lead) move as a dead holder's would.
A lease whose renewal failed (taken, expired, or the engine unreachable for the TTL) is lost at once:
the owner reads it (:meth:`take_lost`, :meth:`held`) and stops consuming that partition. And
:meth:`held` is a time as well: a lease is held until the TTL past the moment its last successful
acquire or renewal was *sent* (the engine's key, written after that, expires no sooner). A keeper
that stopped renewing (its owner's loop silent) or whose renewals hang therefore lets its owner stop
acting before the key can expire and another take it, not at its next round.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from perfd.engine import subjects as S
from perfd.engine.connect import close_bounded, connect
from perfd.engine.leases import Lease
from perfd.engine.nats_api import KeyValue, NatsClient

log = logging.getLogger("perfd.engine")

T = TypeVar("T")

# The owner's loop silent this long: it is hung, and its leases are let go (a busy fold yields between
# messages, each at most seconds: far under this).
LOOP_STALL_S = 30.0
BEAT_S = 0.5  # the owner's loop tells its keeper it is alive this often (keep_beating)
CALL_TIMEOUT_S = 15.0  # an acquire or release through the keeper's thread (one request, or a few)


class LeaseKeeper:
    """``await start()`` (connects), then ``await acquire(key)`` / ``await release(key)`` from the
    owner's loop; the keeper renews every held lease and the member key every ``cfg.renew_s``.
    ``held`` and ``take_lost`` are plain reads, safe from any thread. ``await close()`` ends the
    thread (the leases left held expire by themselves). ``loop_stall_s``: LOOP_STALL_S unless given."""

    def __init__(self, cfg: S.EngineConfig, holder: str, member_key: str | None = None,
                 loop_stall_s: float = LOOP_STALL_S) -> None:
        self.cfg, self.holder, self.member_key = cfg, holder, member_key
        self.loop_stall_s = loop_stall_s
        self.renewals = 0  # rounds of renewal done
        self.renew_errors = 0  # renewals that did not reach the engine (retried until the TTL)
        self.stalled = 0  # rounds skipped: the owner's loop silent past loop_stall_s
        # Rounds whose answers were read more than a TTL after the round before was sent: its leases
        # lapsed in between (``held`` said so). Each one logged with where the time went: the round
        # beginning late (this process's threads not run) or its answers coming late (the engine slow
        # to answer, or again this process).
        self.lapses = 0
        self._last_sent: float | None = None  # when the last round (or acquire) was sent
        self._late_s = 0.0  # how late the round under way began
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"leases {holder}", daemon=True)
        self._nc: NatsClient | None = None
        self._kv: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None
        # on the keeper's loop only
        self._leases: dict[str, Lease] = {}
        # read by the owner: key -> until when it is held (monotonic); replaced whole (a reference read
        # is atomic), never changed in place
        self._until: dict[str, float] = {}
        self._lost: list[str] = []
        self._lost_lock = threading.Lock()
        self._beat = time.monotonic()

    # ---- the owner's side
    async def start(self) -> None:
        self._thread.start()
        try:
            await self._call(self._connect())
        except BaseException:
            await self.close()
            raise

    async def acquire(self, key: str) -> bool:
        return await self._call(self._acquire(key))

    async def release(self, key: str) -> None:
        await self._call(self._release(key))

    def held(self, key: str) -> bool:
        """Whether ``key`` is held now: taken or renewed, and its TTL since then not past."""
        return time.monotonic() < self._until.get(key, 0.0)

    def take_lost(self) -> list[str]:
        """The keys lost since the last call."""
        with self._lost_lock:
            out, self._lost = self._lost, []
        return out

    def beat(self) -> None:
        """The owner's loop is alive (called from it, often)."""
        self._beat = time.monotonic()

    async def close(self) -> None:
        if self._thread.is_alive():
            try:
                await self._call(self._close())
            except Exception as exc:  # a connection already broken: nothing to give back
                log.info("leases %s: close: %s", self.holder, exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, CALL_TIMEOUT_S)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return await asyncio.wait_for(asyncio.wrap_future(fut), CALL_TIMEOUT_S)

    # ---- the keeper's loop
    async def _connect(self) -> None:
        self._nc = await connect(self.cfg, f"perfd leases {self.holder}")
        self._kv = await self._nc.jetstream().key_value(S.LEASES_BUCKET)
        if self.member_key is not None:
            await self._kv.put(self.member_key, self.holder.encode())
        self._task = asyncio.create_task(self._renew_loop())

    async def _close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._nc is not None:
            await close_bounded(self._nc, f"leases {self.holder}")

    async def _acquire(self, key: str) -> bool:
        assert self._kv is not None
        lease = Lease(self._kv, key, self.holder)
        sent = time.monotonic()
        if not await lease.acquire():
            return False
        self._leases[key] = lease
        self._until = {**self._until, key: sent + self.cfg.lease_ttl_s}
        self._last_sent = max(sent, self._last_sent or sent)
        return True

    async def _release(self, key: str) -> None:
        lease = self._leases.pop(key, None)
        self._until = {k: t for k, t in self._until.items() if k != key}
        if lease is not None:
            await lease.release()

    async def _renew_loop(self) -> None:
        # Rounds begin every renew_s from the last one's beginning (not its end): ``held`` counts the TTL
        # from a renewal's sending, so a slow engine's round trips must not add up between two rounds
        began = time.monotonic()
        while True:
            due = max(began + self.cfg.renew_s, time.monotonic())  # a slow last round is not lateness
            await asyncio.sleep(due - time.monotonic())
            began = time.monotonic()
            self._late_s = began - due
            if time.monotonic() - self._beat > self.loop_stall_s:
                self.stalled += 1
                if self.stalled == 1:
                    log.warning("leases %s: its owner's loop silent %.0f s: its leases are let go",
                                self.holder, time.monotonic() - self._beat)
                self._last_sent = None  # let go on purpose: no lapse to tell of when it beats again
                continue
            await self._renew_all()

    async def _put_member(self) -> None:
        if self.member_key is not None and self._kv is not None:
            await self._kv.put(self.member_key, self.holder.encode())

    async def _renew_all(self) -> None:
        assert self._kv is not None
        self.renewals += 1
        leases = list(self._leases.items())
        sent = time.monotonic()
        # the member key beside the renewals, not before them (its round trip would delay them)
        member, *got = await asyncio.gather(self._put_member(), *(lease.renew() for _, lease in leases),
                                            return_exceptions=True)
        if isinstance(member, BaseException):  # tried again next round; the others count one member less
            self.renew_errors += 1
            log.info("leases %s: member key: %s", self.holder, member)
        now = time.monotonic()
        last, self._last_sent = self._last_sent, sent
        if leases and last is not None and now - last > self.cfg.lease_ttl_s:
            self.lapses += 1
            log.warning("leases %s: renewals answered %.1f s after the round before them was sent, past the "
                        "leases' %.1f s TTL: they lapsed meanwhile (this round began %.1f s late: this "
                        "process's threads not run; its answers were read %.1f s after it was sent: the "
                        "engine slow to answer, or this process)", self.holder, now - last,
                        self.cfg.lease_ttl_s, self._late_s, now - sent)
        lost = []
        until = dict(self._until)
        for (key, lease), ok in zip(leases, got, strict=True):
            if self._leases.get(key) is not lease:
                continue  # released (or released and taken again) meanwhile
            if ok is True:
                until[key] = sent + self.cfg.lease_ttl_s
                continue
            if isinstance(ok, BaseException):
                self.renew_errors += 1
                log.info("leases %s: renewing %s: %s: %s", self.holder, key, type(ok).__name__, ok)
                if now < until.get(key, 0.0):
                    continue  # again next round: still ours until the TTL past its last renewal sent
            lost.append(key)
            del self._leases[key]
        for key in lost:
            until.pop(key, None)
        self._until = until
        if lost:
            with self._lost_lock:
                self._lost.extend(lost)


async def keep_beating(keeper: LeaseKeeper) -> None:
    """Tell ``keeper`` the owner's loop is alive every BEAT_S, until cancelled (a task of that loop)."""
    while True:
        keeper.beat()
        await asyncio.sleep(BEAT_S)
