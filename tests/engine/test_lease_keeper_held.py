"""A keeper's ``held`` past its time, as a shard's balance reads it (perfd.engine.lease_keeper,
perfd.engine.shard): the real LeaseKeeper on its thread and the real ``Shard._balance`` over an
in-memory leases bucket. A partition whose lease the keeper still renews but whose time ran out (a
renewal's reply late) is dropped by the shard and let go at the keeper too: kept, the keeper renewed
a partition nobody consumed, which no other shard could take (the shard took another meanwhile)."""

from __future__ import annotations

import asyncio
import time
import types
from typing import Any

from nats.js.errors import KeyWrongLastSequenceError

from perfd.engine import subjects as S
from perfd.engine.lease_keeper import LeaseKeeper
from perfd.engine.shard import Shard


class _Entry:
    def __init__(self, value: bytes, revision: int) -> None:
        self.value, self.revision = value, revision


class _KV:
    """The leases bucket's compare-and-set semantics, in memory."""

    def __init__(self) -> None:
        self.d: dict[str, tuple[bytes, int]] = {}
        self.rev = 0

    def _next(self) -> int:
        self.rev += 1
        return self.rev

    async def create(self, key: str, value: bytes) -> int:
        if key in self.d:
            raise KeyWrongLastSequenceError()
        self.d[key] = (value, self._next())
        return self.rev

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        if key not in self.d or self.d[key][1] != last:
            raise KeyWrongLastSequenceError()
        self.d[key] = (value, self._next())
        return self.rev

    async def get(self, key: str) -> _Entry:
        if key not in self.d:
            raise KeyError(key)
        return _Entry(*self.d[key])

    async def put(self, key: str, value: bytes) -> int:
        self.d[key] = (value, self._next())
        return self.rev

    async def delete(self, key: str, last: int | None = None) -> bool:
        if last is not None and (key not in self.d or self.d[key][1] != last):
            raise KeyWrongLastSequenceError()
        self.d.pop(key, None)
        return True

    async def keys(self) -> list[str]:
        return list(self.d)


class _JS:
    """What the shard's balance asks of JetStream: the lease bucket's subjects under a filter (its keys)."""

    def __init__(self, kv: _KV) -> None:
        self.kv = kv

    async def stream_info(self, name: str, subjects_filter: str | None = None) -> Any:
        assert name == S.kv_stream(S.LEASES_BUCKET) and subjects_filter is not None
        head = subjects_filter.removesuffix(">")
        subjects = {S.kv_subject(S.LEASES_BUCKET, k): 1 for k in self.kv.d
                    if S.kv_subject(S.LEASES_BUCKET, k).startswith(head)}
        return types.SimpleNamespace(state=types.SimpleNamespace(subjects=subjects or None))


def test_a_partition_past_its_time_is_let_go_at_the_keeper_too() -> None:
    async def main() -> dict[str, Any]:
        cfg = S.EngineConfig(("nats://127.0.0.1:1",), partitions=4)
        kv = _KV()
        keeper = LeaseKeeper(cfg, "s1", "member.s1")
        keeper._thread.start()

        async def connected() -> None:  # the keeper on the in-memory bucket, no renewal rounds
            keeper._kv = kv

        await keeper._call(connected())
        shard = Shard(cfg, "s1")  # its scan starts at partition 1: 1, 2, 3, 0
        started: list[int] = []
        shard._start = lambda js, p, kv: started.append(p)  # type: ignore[method-assign]
        for key in ("member.s1", "member.s2", "partition.1", "partition.3"):  # two shards: a share of 2
            kv.d[key] = (b"s1" if key == "member.s1" else b"s2", kv._next())
        await shard._balance(_JS(kv), kv, keeper)  # type: ignore[arg-type]
        took = sorted(shard._leases)
        # partition 2's time runs out (a renewal's reply late: not lost, not held), and partition 1 is
        # free now (its shard gone): the balance drops 2 and takes 1, which comes first in its scan
        keeper._until = {**keeper._until, "partition.2": time.monotonic() - 1.0}
        del kv.d["partition.1"]
        await shard._balance(_JS(kv), kv, keeper)  # type: ignore[arg-type]
        out = {"took": took, "after": sorted(shard._leases.values()), "keeper": sorted(keeper._leases),
               "lost": shard.stats.leases_lost, "engine": kv.d.get("partition.2")}
        await keeper.close()
        return out

    got = asyncio.run(main())
    assert got["took"] == [0, 2] and got["lost"] == 1
    assert got["after"] == ["partition.0", "partition.1"]
    # No orphan: every lease the keeper renews is a partition the shard consumes, and partition 2's key
    # went back to the engine for another shard to take
    assert got["keeper"] == got["after"] and got["engine"] is None
