"""The agent's spool: order, acks, restarts, torn records, the byte cap, a full disk."""

from __future__ import annotations

import errno
import os

import pytest

from perfd.transport.spool import Spool


def _payload(seq: int, size: int = 100) -> bytes:
    return (f"batch-{seq}-".encode() * size)[:size]


def _fill(sp: Spool, n: int, size: int = 100) -> None:
    for _ in range(n):
        seq = sp.next_seq()
        sp.append(seq, _payload(seq, size), n_samples=10)


@pytest.mark.parametrize("on_disk", [False, True])
def test_pending_in_order_and_cumulative_ack(tmp_path, on_disk):
    sp = Spool(tmp_path / "s" if on_disk else None, segment_bytes=1, max_bytes=1 << 30)  # tiny segments
    _fill(sp, 10)
    assert [s for s, _ in sp.pending()] == list(range(1, 11))
    assert dict(sp.pending())[4] == _payload(4)
    assert [s for s, _ in sp.read(after=3, limit=2)] == [4, 5]
    sp.ack(6)
    assert [s for s, _ in sp.pending()] == [7, 8, 9, 10]
    assert sp.pending_count() == 4
    with pytest.raises(ValueError):
        sp.append(3, b"x")  # seqs only go up
    sp.ack(10)
    assert sp.pending_count() == 0 and list(sp.pending()) == []


def test_fully_acked_segments_are_deleted(tmp_path):
    d = tmp_path / "s"
    sp = Spool(d, segment_bytes=64 << 10, max_bytes=1 << 30)
    _fill(sp, 50, size=10_000)  # ~6 records per 64 KiB segment
    segs = sorted(d.glob("*.seg"))
    assert len(segs) >= 8
    sp.ack(50)
    left = sorted(d.glob("*.seg"))
    assert len(left) == 1  # the active segment stays, to take the next appends
    assert sp.pending_count() == 0


def test_seq_continues_after_restart(tmp_path):
    d = tmp_path / "s"
    sp = Spool(d)
    _fill(sp, 5)
    sp.ack(3)
    epoch = sp.epoch
    sp.close()
    sp2 = Spool(d)
    assert sp2.epoch == epoch and sp2.last_seq == 5 and sp2.next_seq() == 6
    assert [s for s, _ in sp2.pending()] == [4, 5]  # unacked batches survive the restart
    sp2.ack(5)
    sp2.close()
    # Even with every segment gone (acked and deleted), state.json carries the last seq on.
    for seg in d.glob("*.seg"):
        seg.unlink()
    sp3 = Spool(d)
    assert sp3.next_seq() == 6 and sp3.pending_count() == 0


def test_seq_continues_after_a_crash_without_close(tmp_path):
    d = tmp_path / "s"
    sp = Spool(d, state_interval_s=3600)  # state.json not rewritten: recovery must use the segments
    _fill(sp, 7)
    del sp  # no close(): like SIGKILL
    sp2 = Spool(d)
    assert sp2.last_seq == 7 and [s for s, _ in sp2.pending()] == list(range(1, 8))


def test_torn_record_is_skipped_and_counted(tmp_path):
    d = tmp_path / "s"
    sp = Spool(d)
    _fill(sp, 3)
    sp.close()
    (seg,) = d.glob("*.seg")
    size = seg.stat().st_size
    with seg.open("ab") as f:  # a fourth record, cut short by a crash mid-write
        f.write(b"\x10\x00\x00\x00garbage")
    sp2 = Spool(d)
    assert sp2.corrupt_records == 1
    assert [s for s, _ in sp2.pending()] == [1, 2, 3]
    assert seg.stat().st_size == size  # the torn tail was cut off
    _fill(sp2, 1)
    sp2.close()
    sp3 = Spool(d)
    assert [s for s, _ in sp3.pending()] == [1, 2, 3, 4] and sp3.corrupt_records == 0


def test_damaged_record_in_the_middle_is_skipped_on_read(tmp_path):
    d = tmp_path / "s"
    sp = Spool(d)
    _fill(sp, 3)
    (seg,) = d.glob("*.seg")
    # Flip a payload byte of record 2 behind the spool's back (a disk error).
    rec = 24 + 100
    with seg.open("r+b") as f:
        f.seek(rec + 24 + 5)
        f.write(b"\xff")
    assert [s for s, _ in sp.pending()] == [1, 3]
    assert sp.corrupt_records == 1


@pytest.mark.parametrize("on_disk", [False, True])
def test_cap_drops_oldest_first_and_counts(tmp_path, on_disk):
    sp = Spool(tmp_path / "s" if on_disk else None, max_bytes=256 << 10, segment_bytes=64 << 10)
    _fill(sp, 200, size=4000)  # ~800 KB into a 256 KiB spool
    assert sp.nbytes <= 256 << 10
    seqs = [s for s, _ in sp.pending()]
    assert seqs[-1] == 200 and seqs == list(range(seqs[0], 201))  # the newest kept, contiguous
    assert sp.dropped_batches == seqs[0] - 1
    assert sp.dropped_samples == 10 * sp.dropped_batches
    if on_disk:
        sp.close()
        assert Spool(tmp_path / "s").dropped_batches == sp.dropped_batches  # persisted with the state


def test_acked_batches_are_not_counted_as_dropped(tmp_path):
    sp = Spool(None, max_bytes=64 << 10)
    _fill(sp, 10, size=4000)
    sp.ack(10)
    _fill(sp, 20, size=4000)
    assert sp.dropped_batches == sum(1 for s in range(11, 31)) - sp.pending_count()


def test_full_disk_keeps_batches_in_memory_and_retries_in_order(tmp_path):
    d = tmp_path / "s"
    sp = Spool(d)
    _fill(sp, 2)
    real = sp._os_write
    full = {"on": True}

    def enospc(fd: int, data: bytes | memoryview) -> int:
        if full["on"]:
            # A partial write first, as a filling disk does, then the error.
            os.write(fd, bytes(data[:7]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    sp._os_write = enospc  # type: ignore[method-assign]
    _fill(sp, 3)  # seqs 3..5: refused by the disk, never an exception
    assert sp.write_errors >= 1
    assert sp.stats()["spool_memory_batches"] == 3
    assert [s for s, _ in sp.pending()] == [1, 2, 3, 4, 5]  # still sendable, in order
    full["on"] = False
    _fill(sp, 1)  # the next append writes the held batches first, then its own
    assert sp.stats()["spool_memory_batches"] == 0
    sp.close()
    sp2 = Spool(d)
    assert sp2.corrupt_records == 0  # the partial writes were truncated away
    assert [(s, p) for s, p in sp2.pending()] == [(s, _payload(s)) for s in range(1, 7)]


def test_memory_held_batches_are_bounded(tmp_path):
    sp = Spool(tmp_path / "s", max_memory_bytes=10_000)

    def enospc(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    sp._os_write = enospc  # type: ignore[method-assign]
    _fill(sp, 50, size=1000)
    assert sp.stats()["spool_memory_batches"] <= 10
    assert sp.dropped_batches == 50 - sp.pending_count()
    assert [s for s, _ in sp.pending()][-1] == 50


def test_ack_above_last_seq_moves_seq_on():
    sp = Spool(None)
    _fill(sp, 2)
    sp.ack(40)  # the aggregator holds more than we remember (state lost): never reuse its seqs
    assert sp.next_seq() == 41
