"""A node message's process groups as the shard and the root read them
(perfd.engine.collective_codec): every group read once and its object shared by the messages that
name it, keyed by what it is (its strings, whether it lists ranks, its ranks' runs), never by where a
message lists it; contiguous ranks as one run, others as several; every nullable column sometimes
unset (the masks the row-by-row reader read) read back equal."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest

from perfd.core.collfold import GroupRef, reduce
from perfd.core.model import CollectiveRecord
from perfd.engine import collective_codec as cc
from perfd.transport.gen import perfd_pb2 as pb
from tests.collectives.test_collective_partial import synthetic_job


def _with(rec: CollectiveRecord, **changes: object) -> CollectiveRecord:
    """A copy of ``rec`` with ``changes`` (set one by one: the record is a plain dataclass)."""
    out = copy.copy(rec)
    for name, value in changes.items():
        setattr(out, name, value)
    return out


def _rec(rank: int, seq: int, **kw: object) -> CollectiveRecord:
    base = CollectiveRecord(job="j", source="flight_recorder", op="all_reduce", rank=rank, pg_id=3,
                            pg_name="3", pg_desc="TENSOR_MODEL_PARALLEL_GROUP", comm_id=None,
                            pg_ranks=[0, 1, 2, 3], collective_seq_id=seq, state="completed",
                            time_created_ns=1_000 * (seq + 1), duration_ms=0.5, group_size=4)
    return _with(base, **kw)


def _read(records: list[CollectiveRecord], strings_first: Sequence[str] = ()) -> list[GroupRef]:
    """The groups of ``records`` as a message carrying them is read; ``strings_first``: strings the
    message lists before its own (so the same string has another index than in another message)."""
    m = pb.CollectivePartial()
    m.strings.extend(strings_first)
    cc.to_pb(reduce("j", records), m)  # its strings numbered after those
    got = cc.from_pb(m)
    return [row.group for _, row in got.ordered()]


@pytest.mark.parametrize("ranks", [[0, 2, 5, 6], [7, 3, 3, 9, 1], [0, 1, 2, 3, 8, 9, 10, 11],
                                   [*range(0, 4096, 8), 5]])
def test_a_group_of_any_ranks_reads_back_as_itself_and_once(ranks: list[int]) -> None:
    recs = [_rec(0, 0, pg_ranks=ranks, group_size=len(ranks))]
    first, again = _read(recs)[0], _read(recs)[0]
    assert first.pg_ranks == tuple(ranks)
    assert again is first  # the second message's group is the first's object


def test_the_cache_never_hands_a_message_another_groups_object() -> None:
    """Groups that differ in one thing only, each in its own message and listed in another order of
    strings: each message gets its own group (keyed by index, or by the strings without the ranks,
    the wrong one would come back)."""
    variants: list[dict[str, object]] = [
        {}, {"pg_ranks": [0, 1, 2, 4]}, {"pg_ranks": [0, 2, 1, 3]}, {"pg_ranks": None, "group_size": None},
        {"pg_ranks": []}, {"pg_desc": "DATA_PARALLEL_GROUP"}, {"comm_id": "0xabc"}, {"pg_name": "4"},
        {"pg_ranks": list(range(100_000)), "group_size": 100_000},
        {"pg_ranks": list(range(1, 100_001)), "group_size": 100_000},
    ]
    for rounds in range(2):  # the second round reads every group from the cache
        for i, kw in enumerate(variants):
            rec = _rec(0, 0, **kw)
            pad = ["pad"] * ((i + rounds) % 3)
            (got,) = set(_read([rec], pad))
            want = GroupRef(rec.pg_name, rec.comm_id, rec.pg_desc,
                            None if not rec.pg_ranks else tuple(rec.pg_ranks))
            assert got == want, (rounds, kw)


def test_two_groups_of_one_message_that_differ_only_in_their_ranks() -> None:
    recs = [_rec(0, 0), _rec(0, 1, pg_id=4, pg_ranks=[0, 4, 8, 12])]
    a, b = _read(recs)
    assert (a.pg_ranks, b.pg_ranks) == ((0, 1, 2, 3), (0, 4, 8, 12))


def test_rows_with_every_nullable_column_sometimes_unset_read_back_equal() -> None:
    """The columns are read whole and zipped: a column set on some rows only is spread over the rows
    its masks name, an f64 duration beside f32 ones stays in its row."""
    recs, _ = synthetic_job()
    recs = recs[:40]
    for i, name in enumerate(cc.NULLABLE):
        if name in ("rank", "pg_id"):  # the key's: cleared on a row of the other kind of key
            continue
        recs[i] = _with(recs[i], **{name: None})
    recs[len(cc.NULLABLE)] = _with(recs[len(cc.NULLABLE)], duration_ms=0.1)  # not a float32
    recs[len(cc.NULLABLE) + 1] = _with(recs[len(cc.NULLABLE) + 1], rank=None, pg_id=None, host="h",
                                      pid=7)
    p = reduce("j", recs)
    m = pb.CollectivePartial()
    cc.to_pb(p, m)
    assert any(u & cc.DURATION_F64 for u in m.unset) and len({u for u in m.unset}) > 5
    m2 = pb.CollectivePartial()
    m2.ParseFromString(m.SerializeToString())
    assert cc.from_pb(m2) == p


def test_a_100k_world_group_costs_no_ranks_list_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message naming the world group reads it from the cache: no ranks list is made again."""
    world = list(range(100_000))
    rec = _rec(5, 0, pg_ranks=world, group_size=len(world))
    first = _read([rec])[0]
    calls: list[Sequence[int]] = []
    real = cc.ranks_of_runs

    def counting(runs: Sequence[int]) -> tuple[int, ...]:
        calls.append(runs)
        return real(runs)

    monkeypatch.setattr(cc, "ranks_of_runs", counting)
    again = _read([rec])[0]
    assert again is first and calls == []
    monkeypatch.undo()
    fresh = _read([_rec(5, 0, pg_ranks=world[:-1], group_size=len(world) - 1)])[0]
    assert fresh.pg_ranks == tuple(world[:-1])


def test_a_group_without_ranks_is_not_one_listing_none() -> None:
    """Not made by reduce (an empty list is no ranks there), but a message may say either: a group
    that lists no ranks and one that lists an empty set are two groups, whichever is read first."""
    for order in ((False, True), (True, False)):
        for has in order:
            m = pb.CollectivePartial(job="j", strings=["sync", "flight_recorder", "barrier"])
            m.groups.add(pg_name=1, has_ranks=has)
            m.source.append(2)
            m.op.append(3)
            m.group.append(0)
            m.state.append(0)
            m.host.append(0)
            m.is_p2p.append(False)
            m.unset.append((1 << len(cc.NULLABLE)) - 1)
            (row,) = cc.from_pb(m).ops.values()
            assert row.group.pg_ranks == (() if has else None)
