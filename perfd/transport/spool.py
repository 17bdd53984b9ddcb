"""The agent's durable outbox: encoded batches with their sequence numbers, until acknowledged.

Layout of a spool directory::

    state.json                 epoch, last_seq, acked_seq, loss counters (atomically replaced)
    series.jsonl               the agent's SeriesTable journal (written by series.SeriesTable)
    00000000000000000001.seg   segment files, named by the first seq they hold
    ...

Each record is ``<u32 length><u32 crc32><u64 seq><u64 n_samples>`` followed by ``length`` payload
bytes; the crc covers seq, n_samples and payload. A torn write (the agent or the machine died
mid-record) or a damaged record is detected on open or on read, skipped and counted in
``corrupt_records``; it never raises. Records after a damaged one in the same segment cannot be
re-synchronised and are lost with it (counted once).

Bounded by ``max_bytes``: beyond it the OLDEST batches are dropped first (whole segments), and
``dropped_batches`` / ``dropped_samples`` count them. A failed write (ENOSPC, EIO, ...) is counted
in ``write_errors``; the batch is kept in memory (bounded by ``max_memory_bytes``, oldest dropped
and counted beyond it) and written once the disk accepts writes again, in order.

Sequence numbers survive restarts: ``last_seq`` is the larger of state.json's and the highest
seq found in the segments. With ``directory=None`` the spool lives in memory only (tests,
ephemeral agents): same interface, nothing survives the process.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import struct
import time
import uuid
import zlib
from array import array
from collections.abc import Iterator
from pathlib import Path

from perfd.core.privdir import private_dir

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<IIQQ")  # length, crc32, seq, n_samples
_CRC_PART = struct.Struct("<QQ")  # seq, n_samples: covered by the crc with the payload
MAX_RECORD_BYTES = 256 << 20  # a length beyond this in a header is damage, not a batch


class _MemQueue:
    """Records in seq order with O(log n) "after seq" lookup and O(1) amortised pops from the front."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.data: list[bytes] = []
        self.samples: list[int] = []
        self.head = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.seqs) - self.head

    def push(self, seq: int, data: bytes, n_samples: int) -> None:
        self.seqs.append(seq)
        self.data.append(data)
        self.samples.append(n_samples)
        self.nbytes += len(data) + _HEADER.size

    def first(self) -> tuple[int, bytes, int]:
        h = self.head
        return self.seqs[h], self.data[h], self.samples[h]

    def pop(self) -> tuple[int, bytes, int]:
        rec = self.first()
        self.data[self.head] = b""  # free the payload now; the list slot goes at the next compaction
        self.head += 1
        self.nbytes -= len(rec[1]) + _HEADER.size
        if self.head > 1024 and self.head * 2 > len(self.seqs):
            del self.seqs[: self.head], self.data[: self.head], self.samples[: self.head]
            self.head = 0
        return rec

    def after(self, seq: int, limit: int) -> list[tuple[int, bytes]]:
        i = bisect.bisect_right(self.seqs, seq, lo=self.head)
        return [(self.seqs[j], self.data[j]) for j in range(i, min(i + limit, len(self.seqs)))]

    def count_after(self, seq: int) -> int:
        return len(self.seqs) - bisect.bisect_right(self.seqs, seq, lo=self.head)


class _Segment:
    def __init__(self, path: Path, first_seq: int) -> None:
        self.path = path
        self.first_seq = first_seq
        self.seqs = array("Q")
        self.offsets = array("Q")
        self.samples = array("Q")
        self.size = 0  # valid bytes; anything beyond (a torn tail we could not truncate) is never read
        self._rfd: int | None = None

    @property
    def last_seq(self) -> int:
        return self.seqs[-1] if self.seqs else 0

    def read_fd(self) -> int:
        if self._rfd is None:
            self._rfd = os.open(self.path, os.O_RDONLY)
        return self._rfd

    def close(self) -> None:
        if self._rfd is not None:
            os.close(self._rfd)
            self._rfd = None


def _pack(seq: int, data: bytes, n_samples: int) -> bytes:
    tail = _CRC_PART.pack(seq, n_samples)
    crc = zlib.crc32(data, zlib.crc32(tail))
    return _HEADER.pack(len(data), crc, seq, n_samples) + data


class Spool:
    """Durable (or in-memory) outbox of encoded batches keyed by a per-agent sequence number."""

    def __init__(
        self,
        directory: Path | str | None,
        *,
        max_bytes: int = 256 << 20,
        segment_bytes: int = 4 << 20,
        max_memory_bytes: int = 32 << 20,
        fsync: bool = False,
        state_interval_s: float = 1.0,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.max_bytes = max_bytes
        # At least four segments under the cap, so dropping the oldest one frees a bounded share.
        self.segment_bytes = max(64 << 10, min(segment_bytes, max_bytes // 4))
        self.max_memory_bytes = max_memory_bytes
        self.fsync = fsync
        self.state_interval_s = state_interval_s
        # Counters (read them directly or via stats()).
        self.dropped_batches = 0
        self.dropped_samples = 0
        self.corrupt_records = 0
        self.write_errors = 0  # failed write attempts (a held batch is retried at each append)
        self.epoch = uuid.uuid4().hex
        self.last_seq = 0
        self.acked_seq = 0
        self._segments: list[_Segment] = []
        self._active_fd: int | None = None  # write fd of self._segments[-1] while it takes appends
        self._mem = _MemQueue()  # memory mode: everything; disk mode: batches the disk refused
        self._disk_bytes = 0
        self._state_written_at = 0.0
        if self.directory is not None:
            private_dir(self.directory)  # ours, 0700, no link: another user's folder is refused
            self._open_dir()

    # ------------------------------------------------------------------ public

    @property
    def in_memory(self) -> bool:
        return self.directory is None

    @property
    def nbytes(self) -> int:
        return self._disk_bytes + self._mem.nbytes

    def pending_count(self) -> int:
        n = self._mem.count_after(self.acked_seq)
        for seg in self._segments:
            n += len(seg.seqs) - bisect.bisect_right(seg.seqs, self.acked_seq)
        return n

    def stats(self) -> dict[str, int]:
        return {
            "spool_bytes": self.nbytes,
            "spool_pending_batches": self.pending_count(),
            "spool_memory_batches": len(self._mem) if self.directory is not None else 0,
            "dropped_batches": self.dropped_batches,
            "dropped_samples": self.dropped_samples,
            "corrupt_records": self.corrupt_records,
            "write_errors": self.write_errors,
            "last_seq": self.last_seq,
            "acked_seq": self.acked_seq,
        }

    def next_seq(self) -> int:
        return self.last_seq + 1

    def append(self, seq: int, data: bytes, n_samples: int = 0) -> None:
        """Store one encoded batch. ``seq`` must exceed every seq appended before. Never raises
        on I/O errors: a batch the disk refuses is kept in memory and retried."""
        if seq <= self.last_seq:
            raise ValueError(f"seq {seq} is not above the spool's last seq {self.last_seq}")
        self.last_seq = seq
        if self.directory is None:
            self._mem.push(seq, data, n_samples)
        else:
            # Keep order: while older batches wait in memory, newer ones queue behind them.
            if len(self._mem):
                self.retry_unwritten()
            if len(self._mem) or not self._write(seq, data, n_samples):
                self._mem.push(seq, data, n_samples)
        self._enforce_cap()

    def settled(self, seq: int) -> bool:
        """Batch ``seq`` is safe from this process dying: acknowledged, on disk in a segment, or
        dropped by the cap (below the oldest segment: counted in ``dropped_batches``). One held only
        in memory (the disk refused it), or lost with a process that held it so, is not; nor is any
        of an in-memory spool's until acknowledged (perfd.agent.checkpoints resumes by this)."""
        if seq <= self.acked_seq:
            return True
        if self.directory is None or seq > self.last_seq or not self._segments:
            return False
        if seq < self._segments[0].first_seq:
            return True
        for seg in self._segments:
            if seg.seqs and seg.seqs[0] <= seq <= seg.seqs[-1]:
                i = bisect.bisect_left(seg.seqs, seq)
                return i < len(seg.seqs) and seg.seqs[i] == seq
        return False

    def retry_unwritten(self) -> int:
        """Write batches held in memory after a failed write; returns how many are still waiting."""
        if self.directory is None:
            return 0
        while len(self._mem):
            seq, data, n = self._mem.first()
            if not self._write(seq, data, n):
                break
            self._mem.pop()
        return len(self._mem)

    def read(self, after: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` unacknowledged batches with seq > ``after``, in seq order."""
        after = max(after, self.acked_seq)
        out: list[tuple[int, bytes]] = []
        for seg in self._segments:
            if len(out) >= limit:
                return out
            if seg.last_seq <= after:
                continue
            i = bisect.bisect_right(seg.seqs, after)
            while i < len(seg.seqs) and len(out) < limit:
                data = self._read_record(seg, i)
                if data is not None:
                    out.append((seg.seqs[i], data))
                i += 1
        if len(out) < limit:
            if out:
                after = out[-1][0]
            out.extend(self._mem.after(after, limit - len(out)))
        return out

    def pending(self, after: int = 0, chunk: int = 64) -> Iterator[tuple[int, bytes]]:
        """Every unacknowledged batch with seq > ``after``, in order."""
        while True:
            recs = self.read(after, chunk)
            if not recs:
                return
            yield from recs
            after = recs[-1][0]

    def ack(self, seq: int) -> None:
        """Cumulative: every batch with seq <= ``seq`` is durable at the aggregator."""
        if seq <= self.acked_seq:
            return
        self.acked_seq = seq
        # The aggregator can know a higher seq than we do when our state was lost (e.g. batches
        # held in memory on a full disk, then a crash): never reuse a seq it has seen.
        raised = seq > self.last_seq
        self.last_seq = max(self.last_seq, seq)
        while len(self._mem) and self._mem.first()[0] <= seq:
            self._mem.pop()
        deleted = False
        while len(self._segments) > 1 and self._segments[0].last_seq <= seq:
            # The active (last) segment is kept even when fully acked: deleting and re-creating a
            # file per batch in the steady state would cost more than the bytes it frees.
            self._delete_segment(self._segments[0])
            deleted = True
        self._save_state(force=deleted or raised)

    def close(self) -> None:
        if self.directory is None:
            return
        self._save_state(force=True)
        if self._active_fd is not None:
            os.close(self._active_fd)
            self._active_fd = None
        for seg in self._segments:
            seg.close()

    # ------------------------------------------------------------------ disk internals

    def _os_write(self, fd: int, data: bytes | memoryview) -> int:  # a seam for tests that simulate ENOSPC
        return os.write(fd, data)

    def _open_dir(self) -> None:
        assert self.directory is not None
        state_path = self.directory / "state.json"
        try:
            st = json.loads(state_path.read_text())
            self.epoch = str(st["epoch"])
            self.last_seq = int(st.get("last_seq", 0))
            self.acked_seq = int(st.get("acked_seq", 0))
            self.dropped_batches = int(st.get("dropped_batches", 0))
            self.dropped_samples = int(st.get("dropped_samples", 0))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            # Unreadable state: keep the segments (their seqs still bound last_seq) but take a new
            # epoch, so the aggregator does not discard our batches as duplicates of older ones.
            log.warning("spool state %s unreadable (%s): starting a new epoch", state_path, e)
        for path in sorted(self.directory.glob("*.seg")):
            seg = self._scan(path)
            if not seg.seqs or seg.last_seq <= self.acked_seq:
                seg.close()
                path.unlink(missing_ok=True)
                continue
            self._segments.append(seg)
            self._disk_bytes += seg.size
            self.last_seq = max(self.last_seq, seg.last_seq)
        self._save_state(force=True)

    def _scan(self, path: Path) -> _Segment:
        """Index one segment; truncate (or fence off) a torn or damaged tail."""
        try:
            first = int(path.stem)
        except ValueError:
            first = 0
        seg = _Segment(path, first)
        with path.open("rb") as f:
            blob = f.read()
        off, prev = 0, 0
        while off < len(blob):
            ok = off + _HEADER.size <= len(blob)
            if ok:
                length, crc, seq, n = _HEADER.unpack_from(blob, off)
                end = off + _HEADER.size + length
                ok = (length <= MAX_RECORD_BYTES and end <= len(blob) and seq > prev
                      and zlib.crc32(blob[off + _HEADER.size:end], zlib.crc32(_CRC_PART.pack(seq, n))) == crc)
            if not ok:
                self.corrupt_records += 1
                log.warning("spool segment %s: torn or damaged record at byte %d of %d; skipped",
                            path.name, off, len(blob))
                try:
                    os.truncate(path, off)
                except OSError:
                    pass  # seg.size fences the damaged tail off for this process anyway
                break
            seg.seqs.append(seq)
            seg.offsets.append(off)
            seg.samples.append(n)
            prev, off = seq, end
        seg.size = off
        return seg

    def _read_record(self, seg: _Segment, i: int) -> bytes | None:
        off = seg.offsets[i]
        try:
            end = seg.offsets[i + 1] if i + 1 < len(seg.offsets) else seg.size
            blob = os.pread(seg.read_fd(), end - off, off)
        except OSError as e:
            self.corrupt_records += 1
            log.warning("spool segment %s: read failed (%s); record skipped", seg.path.name, e)
            return None
        if len(blob) >= _HEADER.size:
            length, crc, seq, n = _HEADER.unpack_from(blob)
            data = blob[_HEADER.size:_HEADER.size + length]
            if len(data) == length and zlib.crc32(data, zlib.crc32(_CRC_PART.pack(seq, n))) == crc:
                return data
        self.corrupt_records += 1  # damaged after it was written (disk error): skip, do not send garbage
        log.warning("spool segment %s: record %d failed its crc on read; skipped", seg.path.name, seg.seqs[i])
        return None

    def _write(self, seq: int, data: bytes, n_samples: int) -> bool:
        assert self.directory is not None
        rec = _pack(seq, data, n_samples)
        try:
            seg = self._segments[-1] if self._active_fd is not None else None
            if seg is None or (seg.size + len(rec) > self.segment_bytes and seg.seqs):
                seg = self._rotate(seq)
            fd = self._active_fd
            assert fd is not None
        except OSError as e:
            self._write_failed(e)
            return False
        start = seg.size
        try:
            view = memoryview(rec)
            while view:
                n = self._os_write(fd, view)
                view = view[n:]
            if self.fsync:
                os.fsync(fd)
        except OSError as e:
            self._write_failed(e)
            try:
                os.ftruncate(fd, start)  # remove the partial record so later appends stay readable
            except OSError:
                os.close(fd)  # cannot clean up: stop appending here; seg.size fences the tail off
                self._active_fd = None
            return False
        seg.seqs.append(seq)
        seg.offsets.append(start)
        seg.samples.append(n_samples)
        seg.size += len(rec)
        self._disk_bytes += len(rec)
        return True

    def _rotate(self, first_seq: int) -> _Segment:
        assert self.directory is not None
        if self._active_fd is not None:
            os.close(self._active_fd)
            self._active_fd = None
            # A fully acknowledged segment is only kept while it takes appends.
            if self._segments and self._segments[-1].last_seq <= self.acked_seq:
                self._delete_segment(self._segments[-1])
        path = self.directory / f"{first_seq:020d}.seg"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if self.fsync:
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)  # the new file's directory entry must survive a crash too
            finally:
                os.close(dfd)
        seg = _Segment(path, first_seq)
        seg.size = os.fstat(fd).st_size  # a leftover file of that name: append after it
        self._disk_bytes += seg.size
        self._segments.append(seg)
        self._active_fd = fd
        return seg

    def _write_failed(self, e: OSError) -> None:
        self.write_errors += 1
        if self.write_errors == 1 or self.write_errors % 1000 == 0:
            log.warning("spool write failed (%s; %d so far): keeping batches in memory and retrying",
                        e, self.write_errors)

    def _delete_segment(self, seg: _Segment) -> None:
        if self._segments and seg is self._segments[-1] and self._active_fd is not None:
            os.close(self._active_fd)
            self._active_fd = None
        seg.close()
        self._segments.remove(seg)
        self._disk_bytes -= seg.size
        try:
            seg.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("could not delete spool segment %s: %s", seg.path, e)

    def _enforce_cap(self) -> None:
        dropped = False
        while self.nbytes > self.max_bytes and (self._segments or len(self._mem) > 1):
            if self._segments:  # the oldest batches are on disk; memory only holds newer ones
                seg = self._segments[0]
                i = bisect.bisect_right(seg.seqs, self.acked_seq)
                self.dropped_batches += len(seg.seqs) - i
                self.dropped_samples += sum(seg.samples[i:])
                self._delete_segment(seg)
            else:
                self._drop_mem_oldest()
            dropped = True
        while self.directory is not None and self._mem.nbytes > self.max_memory_bytes and len(self._mem) > 1:
            self._drop_mem_oldest()
            dropped = True
        if dropped:
            log.warning("spool over its cap: %d batches (%d samples) dropped so far, oldest first",
                        self.dropped_batches, self.dropped_samples)
            self._save_state(force=True)

    def _drop_mem_oldest(self) -> None:
        seq, _, n = self._mem.pop()
        if seq > self.acked_seq:
            self.dropped_batches += 1
            self.dropped_samples += n

    def _save_state(self, force: bool = False) -> None:
        if self.directory is None:
            return
        now = time.monotonic()
        if not force and now - self._state_written_at < self.state_interval_s:
            return  # a stale acked_seq only means a few duplicate resends after a restart
        self._state_written_at = now
        st = {"epoch": self.epoch, "last_seq": self.last_seq, "acked_seq": self.acked_seq,
              "dropped_batches": self.dropped_batches, "dropped_samples": self.dropped_samples}
        tmp = self.directory / "state.json.tmp"
        try:
            tmp.write_text(json.dumps(st))
            if self.fsync:
                with tmp.open("rb+") as f:
                    os.fsync(f.fileno())
            os.replace(tmp, self.directory / "state.json")
        except OSError as e:
            self._write_failed(e)
