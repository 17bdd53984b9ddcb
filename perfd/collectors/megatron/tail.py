"""Follow a growing log file by path, the way ``tail -F`` does, returning complete lines only.

Byte-oriented on purpose: a UTF-8 character (or a line) split across two writes must not be
decoded half-way, so bytes are buffered until their newline arrives and only then decoded
(invalid bytes replaced). Handles:

- truncation in place (``copytruncate``, ``> train.log``), told by content, not by size alone: the
  file is shorter than our offset, *or* its head (the first HEAD_BYTES we read, kept) is no longer
  the same — so a file truncated and grown past our offset between two calls is seen too
  (counts["truncations"]). logrotate's ``copytruncate`` first copies the file to ``<name>.1``: when
  that copy starts with our head and reaches our offset, its unread part (what was written between
  our last read and the truncation) is read first, our partial line continued
  (counts["rotated_tail_reads"]); then the truncated file from its start. Without such a copy the
  unread part is lost, and counted: counts["truncations_unread"] (times) and
  counts["unread_bytes"] (at least that many: what we had seen and not read yet);
- rotation (``mv train.log train.log.1`` and a new ``train.log``): the path names another inode ->
  read the old file to its end first (nothing written before the rotation is lost), then open the
  new one from its start (counts["rotations"]).

- a rewrite in place that keeps the head (a job restarted with ``> train.log`` writes the same
  start-up block again, and may grow past our offset before the next poll): the last TAIL_BYTES we
  read before our position must still be there; when they are not, it is a truncation
  (counts["rewrites"] too) and the new run is read from its start, what was unread of the old one
  counted as above;
- two rotations between two reads: what can be known is counted — a rotated copy (``<name>.1`` or
  ``.2``) written since our last read that is not our file is a whole generation never read
  (counts["missed_generations"], its size added to counts["unread_bytes"]); a copy that is our
  file tells exactly how much of it we had not read. What no copy shows cannot be known
  (counts["unread_unknown"]): the counts are then a lower bound;
- a path that is not a regular file (a FIFO, a device, a directory) is never opened for reading —
  a FIFO would block the collector until a writer came — and is refused, counted once per file
  (errors["not_regular"]).

Never raises: OS errors are counted in ``errors`` by kind and the call returns what it has.
Only ``<name>.1`` is read from (logrotate's name; a ``dateext`` or already-compressed copy is not
read: counted as unread).

Falling behind (``max_lag_bytes``): when more than that many unread bytes wait, the tail jumps to
``max_lag_bytes // 2`` before the end, drops the line it lands in, and counts what it passed over
(counts["skips"], counts["skipped_bytes"]); the caller turns that into an event. A tail far behind
a fast log would otherwise report an hour-old job as current; a gap that says so is better.

Resuming: :meth:`LogTail.position_at` names a point in the open file by the
file's identity — device, inode, a hash of its head up to that point and of the bytes just before
it — and ``LogTail(..., resume=pos)`` starts there only when the path still names that file with
that content (counts["resumed"]): a job restarted with the same start-up block, its log rewritten
from the start, is a new run and is read from its start (an older check, device, inode and
head, resumed in the middle of the new run's lines). When the path names another file (rotated or
truncated while the agent was down), ``<name>.1`` is read from the position when it is the file the
position names (the same content: a renamed file or copytruncate's copy), then the new log from its
start (counts["resumed"] and counts["resumed_rotated"]); else the log is read from its start and
counts["resume_other_file"] says the old file's unread rest could not be read. The bytes hashed are
never past the offset, so bytes appended after the position was taken do not change them. The
caller decides which offset is safe to save (the end of the last record the aggregator
acknowledged); save_position and load_position keep it in a small JSON file written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

HEAD_BYTES = 4096  # how much of a file's head names it, beside device and inode
# The bytes just before the position that must still be there for the file to be the one we read
# (a new run that rewrote the file with the same start-up block differs here: its iteration lines,
# their timestamps and values are not the old run's).
TAIL_BYTES = 256
ROTATED_SUFFIX = ".1"  # where logrotate (copytruncate or rename) puts the newest old log
OLDER_SUFFIX = ".2"  # looked at, never read: what two rotations between two reads took


@dataclass(frozen=True)
class TailPosition:
    dev: int
    ino: int
    head_len: int  # bytes hashed: min(HEAD_BYTES, offset)
    head_sha256: str
    offset: int  # where reading resumes: the first byte after the last line consumed
    tail_len: int = 0  # bytes hashed just before the offset: min(TAIL_BYTES, offset); 0: not checked
    tail_sha256: str = ""


def _head_hash(fh: BinaryIO, n: int) -> str | None:
    """sha256 of the first ``n`` bytes, or None when the file holds fewer."""
    fh.seek(0)
    head = fh.read(n)
    return hashlib.sha256(head).hexdigest() if len(head) == n else None


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _matches(fd: int, size: int, pos: TailPosition) -> bool:
    """Whether the open file ``fd`` (``size`` bytes) is the one ``pos`` names by content: it reaches
    the offset, starts with the head and holds the same bytes just before the offset."""
    if size < pos.offset:
        return False
    head = os.pread(fd, pos.head_len, 0)
    if len(head) != pos.head_len or _sha(head) != pos.head_sha256:
        return False
    return not pos.tail_len or _sha(os.pread(fd, pos.tail_len, pos.offset - pos.tail_len)) == pos.tail_sha256


def _open_regular(path: Path) -> tuple[BinaryIO, os.stat_result] | None:
    """The file at ``path`` opened for reading when it is a regular file; None when it is something
    else (a FIFO: opened without blocking, then closed). OSError when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st
    except BaseException:
        try:
            os.close(fd)
        except OSError:
            pass
        raise


def save_position(path: str | Path, pos: TailPosition) -> None:
    """Write atomically (temp file, fsync, rename): a kill -9 leaves the old or the new one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        json.dump(asdict(pos), fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_position(path: str | Path) -> TailPosition | None:
    """The saved position, or None when there is none or it is unreadable (read from the start)."""
    try:
        raw = json.loads(Path(path).read_text())
        pos = TailPosition(**{k: raw[k] for k in ("dev", "ino", "head_len", "head_sha256", "offset")},
                           **{k: raw[k] for k in ("tail_len", "tail_sha256") if k in raw})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    ints = (pos.dev, pos.ino, pos.head_len, pos.offset, pos.tail_len)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
        return None
    if not isinstance(pos.head_sha256, str) or pos.head_len > min(HEAD_BYTES, pos.offset):
        return None
    if not isinstance(pos.tail_sha256, str) or pos.tail_len > min(TAIL_BYTES, pos.offset):
        return None
    return pos


class LogTail:
    def __init__(
        self,
        path: str | Path,
        from_start: bool = True,
        max_line_bytes: int = 1 << 20,
        resume: TailPosition | None = None,
        max_lag_bytes: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.from_start = from_start
        self.max_line_bytes = max_line_bytes
        self.max_lag_bytes = max_lag_bytes
        self._skip_partial = False  # after a skip: the line landed in is dropped up to its newline
        self.errors: dict[str, int] = {}  # reason -> count (missing, open_failed, read_failed, ...)
        self.counts: dict[str, int] = {}  # lines, bytes, truncations, rotations, partial_*
        self._fh: BinaryIO | None = None
        self._id: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._partial = b""
        self._offsets: list[int | None] = []  # per line of the current read_lines_at call
        # The open file's first bytes as we read them (at most HEAD_BYTES): a truncation is told
        # by these changing, even when the file has grown past our offset again.
        self._head = b""
        self._tail = b""  # the last TAIL_BYTES read, ending at the open file's position
        self._seen_size = 0  # the open file's size at our last look (unread bytes are counted)
        self._last_look = time.time()  # wall time of our last read (a rotated copy newer is unseen)
        self._refused: set[tuple[int, int]] = set()  # non-regular files refused (counted once each)
        self._reading_copy = False  # the open file is <name>.1, read before the path's file
        # Open now, not at the first read: a rotation between the two must not hide the file we
        # were asked to follow. from_start=False skips what is there now; a file that does not
        # exist yet is opened at the first read and read from its start.
        self._open(at_end=not from_start, quiet=True)
        if resume is not None and self._fh is not None:
            self._resume(resume)

    # ---------------------------------------------------------------------------------------

    def read_lines(self, max_bytes: int = 1 << 20) -> list[str]:
        """New complete lines (without their newline), reading at most ``max_bytes`` this call."""
        return [line for line, _ in self.read_lines_at(max_bytes)]

    def read_lines_at(self, max_bytes: int = 1 << 20) -> list[tuple[str, int | None]]:
        """As :meth:`read_lines`, each line with the file offset of its newline (None for a line
        handed over without one: cut at a rotation, or over-long); see perfd.core.linetimes."""
        out: list[bytes] = []
        self._offsets = []
        try:
            self._read(out, max(1, max_bytes))
        except Exception as exc:  # never raise into the agent: count it
            self._error(f"unexpected:{type(exc).__name__}")
        self._count("lines", len(out))
        offsets = self._offsets + [None] * (len(out) - len(self._offsets))
        return [(b.decode("utf-8", "replace"), o) for b, o in zip(out, offsets, strict=False)]

    def position_at(self, offset: int) -> TailPosition | None:
        """The open file's identity with ``offset`` (e.g. one past a line's newline offset from
        :meth:`read_lines_at`); None when no file is open or it is shorter than its head."""
        if self._fh is None or self._id is None or offset < 0:
            return None
        n, t = min(HEAD_BYTES, offset), min(TAIL_BYTES, offset)
        try:
            pos = self._fh.tell()
            digest = _head_hash(self._fh, n)
            self._fh.seek(pos)
            tail = os.pread(self._fh.fileno(), t, offset - t)
        except OSError:
            self._error("read_failed")
            return None
        if digest is None or len(tail) != t:
            return None
        return TailPosition(self._id[0], self._id[1], n, digest, offset, t, _sha(tail))

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                self._error("close_failed")
        self._fh = None
        self._id = None
        self._head = b""
        self._tail = b""
        self._reading_copy = False

    # ---------------------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def _error(self, key: str) -> None:
        self.errors[key] = self.errors.get(key, 0) + 1

    def _open(self, at_end: bool, quiet: bool = False) -> bool:
        """Open the path; ``quiet``: failure is not counted (the constructor's early try)."""
        try:
            got = _open_regular(self.path)
        except FileNotFoundError:
            if not quiet:
                self._error("missing")
            return False
        except OSError:
            if not quiet:
                self._error("open_failed")
            return False
        if got is None:
            self._not_regular(self.path)
            return False
        fh, st = got
        try:
            if at_end:
                fh.seek(0, os.SEEK_END)
        except OSError:
            fh.close()
            self._error("open_failed")
            return False
        self._fh, self._id = fh, (st.st_dev, st.st_ino)
        self._head, self._seen_size, self._reading_copy = b"", st.st_size, False
        self._note_head()
        self._note_tail()
        return True

    def _not_regular(self, path: Path) -> None:
        """Refused: not a regular file. Counted once per file (a collector polls twice a second)."""
        try:
            st = os.stat(path)
        except OSError:
            return
        if (st.st_dev, st.st_ino) not in self._refused:
            self._refused.add((st.st_dev, st.st_ino))
            self._error("not_regular")
            if len(self._refused) > 1000:  # bounded: a path replaced by a new FIFO over and over
                self._refused.clear()

    def _note_tail(self) -> None:
        """The last TAIL_BYTES before the open file's position, read back (after a seek)."""
        if self._fh is None:
            return
        try:
            pos = self._fh.tell()
            self._tail = os.pread(self._fh.fileno(), min(TAIL_BYTES, pos), max(0, pos - TAIL_BYTES))
        except OSError:
            self._error("read_failed")
            self._tail = b""

    def _tail_changed(self, pos: int) -> bool:
        """The bytes we read just before ``pos`` are no longer there: the file was rewritten."""
        if not self._tail or self._fh is None:
            return False
        try:
            return os.pread(self._fh.fileno(), len(self._tail), pos - len(self._tail)) != self._tail
        except OSError:
            self._error("read_failed")
            return False

    def _mark(self, offset: int) -> TailPosition | None:
        """The open file as we read it up to ``offset`` (its head and the bytes before ``offset``
        that we read), to recognise a copy of it; None before anything was read."""
        if not self._head or self._id is None:
            return None
        return TailPosition(self._id[0], self._id[1], len(self._head), _sha(self._head), offset,
                            len(self._tail), _sha(self._tail))

    def _note_head(self) -> None:
        """Keep the open file's head up to where we are (cheap: only while it is < HEAD_BYTES)."""
        if self._fh is None or len(self._head) >= HEAD_BYTES:
            return
        try:
            n = min(HEAD_BYTES, self._fh.tell())
            if n > len(self._head):
                self._head = os.pread(self._fh.fileno(), n, 0)
        except OSError:
            self._error("read_failed")

    def _head_changed(self) -> bool:
        if not self._head or self._fh is None:
            return False
        try:
            return os.pread(self._fh.fileno(), len(self._head), 0) != self._head
        except OSError:
            self._error("read_failed")
            return False

    def _open_copy(self, mark: TailPosition | None) -> bool:
        """Open ``<name>.1`` at ``mark.offset`` when it is the file we were reading (its content as
        ``mark`` names it). It then is the open file until its end, the path's file after it."""
        if mark is None or mark.head_len <= 0:
            return False  # nothing read yet: no head to know the copy by (and nothing unread in it)
        copy = self.path.with_name(self.path.name + ROTATED_SUFFIX)
        try:
            got = _open_regular(copy)
        except OSError:
            return False
        if got is None:
            self._not_regular(copy)
            return False
        fh, st = got
        try:
            if not _matches(fh.fileno(), st.st_size, mark):
                fh.close()
                return False
            fh.seek(mark.offset)
            head = os.pread(fh.fileno(), mark.head_len, 0)
        except OSError:
            fh.close()
            self._error("read_failed")
            return False
        self.close()
        self._fh, self._id = fh, (st.st_dev, st.st_ino)
        self._head, self._seen_size, self._reading_copy = head, st.st_size, True
        self._note_head()
        self._note_tail()
        return True

    def _missed(self, ours: TailPosition | None, skip: set[tuple[int, int]]) -> tuple[int, int, int | None]:
        """What two rotations between two reads took, as far as the rotated copies show it:
        (whole generations never read, their bytes, our own file's unread rest when a copy of it is
        found — None: not known). A copy written since our last read that is neither ours (``ours``
        by content, or one of ``skip`` by device and inode) is a generation never read."""
        gens = size = 0
        rest: int | None = None
        for suffix in (ROTATED_SUFFIX, OLDER_SUFFIX):
            copy = self.path.with_name(self.path.name + suffix)
            try:
                st = os.stat(copy)
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in skip:
                    continue
                mine = False
                if ours is not None:
                    got = _open_regular(copy)
                    if got is not None:
                        with got[0] as fh:
                            mine = _matches(fh.fileno(), st.st_size, ours)
            except OSError:
                continue
            if mine and ours is not None:
                rest = st.st_size - ours.offset
            elif st.st_mtime >= self._last_look:
                gens, size = gens + 1, size + st.st_size
        return gens, size, rest

    def _resume(self, pos: TailPosition) -> None:
        """Seek to ``pos`` if the open file is the one it names; else read its unread rest from
        ``<name>.1`` when that is the file, then this one anew."""
        assert self._fh is not None and self._id is not None
        try:
            size = os.fstat(self._fh.fileno()).st_size
            same = self._id == (pos.dev, pos.ino) and _matches(self._fh.fileno(), size, pos)
            self._fh.seek(pos.offset if same else 0)
        except OSError:
            self._error("resume_failed")
            return
        if same:
            self._note_head()
            self._note_tail()
            self._count("resumed")
        elif self._open_copy(pos):
            self._count("resumed")
            self._count("resumed_rotated")
        else:
            self._count("resume_other_file")

    def _path_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None  # between a rotation's rename and the new file's creation: keep the old
        except OSError:
            self._error("stat_failed")
            return None
        return st.st_dev, st.st_ino

    def _read(self, out: list[bytes], budget: int) -> None:
        if self._fh is None and not self._open(at_end=False):
            return
        path_id = self._path_id()
        if path_id is not None and path_id != self._id:
            # Rotated (or reading copytruncate's copy): finish the old file first, then switch to
            # the path's file.
            budget -= self._drain(out, budget)
            if budget <= 0:
                return  # more of the old file may remain; next call goes on with it
            if self._partial:
                # The old file is finished: its unterminated last line will never be completed.
                out.append(self._partial)
                self._offsets.append(None)
                self._partial = b""
                self._count("partial_at_rotation")
            if not self._reading_copy:
                self._count("rotations")
                ids = {i for i in (self._id, path_id) if i is not None}
                gens, size, _rest = self._missed(None, ids)
                if gens:  # rotated twice since our last read: a generation we never opened
                    self._count("missed_generations", gens)
                    self._count("unread_bytes", size)
                    self._count("unread_unknown")
            else:
                self._count("rotated_tail_done")
            self.close()
            if not self._open(at_end=False):
                return
        elif self._fh is not None:
            try:
                size = os.fstat(self._fh.fileno()).st_size
                pos = self._fh.tell()
            except OSError:
                self._error("stat_failed")
                return
            rewritten = size >= pos and not self._head_changed() and self._tail_changed(pos)
            if rewritten or size < pos or self._head_changed():
                if rewritten:
                    self._count("rewrites")  # the same head: a new run writing the same start-up block
                self._truncated(pos)
                if self._reading_copy:
                    self._read(out, budget)  # the copy's unread part, then the path's file
                    return
            elif self.max_lag_bytes is not None and size - pos > self.max_lag_bytes:
                to = size - self.max_lag_bytes // 2
                try:
                    self._fh.seek(to)
                except OSError:
                    self._error("seek_failed")
                    return
                self._count("skips")
                self._count("skipped_bytes", to - pos + len(self._partial))
                self._partial = b""
                self._skip_partial = True
                self._note_tail()
        if self._fh is not None:
            self._drain(out, budget)
            self._note_head()
            self._last_look = time.time()
            try:
                self._seen_size = os.fstat(self._fh.fileno()).st_size
            except OSError:
                self._error("stat_failed")

    def _truncated(self, pos: int) -> None:
        """The open file was truncated (and may have grown again): go on in logrotate's copy when
        it holds our unread part, else count that part as lost and read the file from its start."""
        assert self._fh is not None
        self._count("truncations")
        unread = max(0, self._seen_size - pos)  # what we saw there and had not read: at least that
        mark = self._mark(pos)
        if self._open_copy(mark):
            self._count("rotated_tail_reads")  # the partial line goes on in the copy
            return
        gens, size, rest = self._missed(mark, set())
        self._count("truncations_unread")
        # Our unread rest exactly when a copy of our file shows it (two copytruncates: in .2), else
        # at least what we had seen there; plus every generation rotated through meanwhile.
        self._count("unread_bytes", (rest if rest is not None else unread) + size)
        if gens:  # truncated twice since our last read: the first copy is gone or shifted away
            self._count("missed_generations", gens)
        if rest is None:  # what was written between our last look and the truncation: not known
            self._count("unread_unknown")
        if self._partial:
            self._count("partial_dropped")
            self._partial = b""
        self._fh.seek(0)
        self._head, self._tail, self._seen_size = b"", b"", 0

    def _drain(self, out: list[bytes], budget: int) -> int:
        """Read up to ``budget`` bytes from the open file into complete lines; bytes read."""
        if self._fh is None:
            return 0
        try:
            base = self._fh.tell() - len(self._partial)  # where the pending partial line starts
            data = self._fh.read(budget)
        except OSError:
            self._error("read_failed")
            return 0
        if not data:
            return 0
        self._count("bytes", len(data))
        self._tail = (self._tail + data[-TAIL_BYTES:])[-TAIL_BYTES:]
        if self._skip_partial:  # landed mid-line after a skip: that line's head is gone
            nl = data.find(b"\n")
            if nl < 0:
                self._count("skipped_bytes", len(data))
                return len(data)
            self._count("skipped_bytes", nl + 1)
            base += nl + 1
            data = data[nl + 1:]
            self._skip_partial = False
        parts = (self._partial + data).split(b"\n")
        self._partial = parts.pop()
        for part in parts:
            base += len(part)
            self._offsets.append(base)  # the newline's offset
            base += 1
        out.extend(parts)
        if len(self._partial) > self.max_line_bytes:
            # A "line" this long is not a log line; hand it over rather than grow without bound.
            out.append(self._partial)
            self._offsets.append(None)
            self._partial = b""
            self._count("partial_overlong")
        return len(data)
