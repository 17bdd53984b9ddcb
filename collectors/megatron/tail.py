"""Follow a growing log file by path, the way ``tail -F`` does, returning complete lines only.

Byte-oriented on purpose: a UTF-8 character (or a line) split across two writes must not be
decoded half-way, so bytes are buffered until their newline arrives and only then decoded
(invalid bytes replaced). Handles:

- truncation in place (``copytruncate``, ``> train.log``): the file shrinks below our offset ->
  restart from 0, drop the stale partial line (counts["truncations"]);
- rotation (``mv train.log train.log.1`` and a new ``train.log``): the path names another inode ->
  read the old file to its end first (nothing written before the rotation is lost), then open the
  new one from its start (counts["rotations"]).

Never raises: OS errors are counted in ``errors`` by kind and the call returns what it has.
Not detected: a file truncated and re-grown past our offset between two calls (its size never
looks smaller); such a rewrite is read as if appended.

Falling behind (``max_lag_bytes``): when more than that many unread bytes wait, the tail jumps to
``max_lag_bytes // 2`` before the end, drops the line it lands in, and counts what it passed over
(counts["skips"], counts["skipped_bytes"]); the caller turns that into an event. A tail far behind
a fast log would otherwise report an hour-old job as current; a gap that says so is better.

Resuming (issue 12 item 3): :meth:`LogTail.position_at` names a point in the open file by the
file's identity — device, inode and a hash of its head up to that point — and ``LogTail(...,
resume=pos)`` starts there only when the path still names that file with that head
(counts["resumed"]); a rotated or re-created log is read from its start
(counts["resume_other_file"]). The head hashed is at most HEAD_BYTES and never past the offset,
so bytes appended after the position was taken do not change it. The caller decides which offset
is safe to save (the end of the last record the aggregator acknowledged); save_position and
load_position keep it in a small JSON file written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

HEAD_BYTES = 4096  # how much of a file's head names it, beside device and inode


@dataclass(frozen=True)
class TailPosition:
    dev: int
    ino: int
    head_len: int  # bytes hashed: min(HEAD_BYTES, offset)
    head_sha256: str
    offset: int  # where reading resumes: the first byte after the last line consumed


def _head_hash(fh: BinaryIO, n: int) -> str | None:
    """sha256 of the first ``n`` bytes, or None when the file holds fewer."""
    fh.seek(0)
    head = fh.read(n)
    return hashlib.sha256(head).hexdigest() if len(head) == n else None


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
        pos = TailPosition(**{k: raw[k] for k in ("dev", "ino", "head_len", "head_sha256", "offset")})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    ints = (pos.dev, pos.ino, pos.head_len, pos.offset)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
        return None
    if not isinstance(pos.head_sha256, str) or pos.head_len > min(HEAD_BYTES, pos.offset):
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
        handed over without one: cut at a rotation, or over-long); see perfd.linetimes."""
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
        n = min(HEAD_BYTES, offset)
        try:
            pos = self._fh.tell()
            digest = _head_hash(self._fh, n)
            self._fh.seek(pos)
        except OSError:
            self._error("read_failed")
            return None
        if digest is None:
            return None
        return TailPosition(self._id[0], self._id[1], n, digest, offset)

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                self._error("close_failed")
        self._fh = None
        self._id = None

    # ---------------------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def _error(self, key: str) -> None:
        self.errors[key] = self.errors.get(key, 0) + 1

    def _open(self, at_end: bool, quiet: bool = False) -> bool:
        """Open the path; ``quiet``: failure is not counted (the constructor's early try)."""
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            if not quiet:
                self._error("missing")
            return False
        except OSError:
            if not quiet:
                self._error("open_failed")
            return False
        try:
            st = os.fstat(fh.fileno())
            if at_end:
                fh.seek(0, os.SEEK_END)
        except OSError:
            fh.close()
            self._error("open_failed")
            return False
        self._fh, self._id = fh, (st.st_dev, st.st_ino)
        return True

    def _resume(self, pos: TailPosition) -> None:
        """Seek to ``pos`` if the open file is the one it names; else read this file anew."""
        assert self._fh is not None and self._id is not None
        try:
            size = os.fstat(self._fh.fileno()).st_size
            same = (
                self._id == (pos.dev, pos.ino)
                and size >= pos.offset
                and _head_hash(self._fh, pos.head_len) == pos.head_sha256
            )
            self._fh.seek(pos.offset if same else 0)
        except OSError:
            self._error("resume_failed")
            return
        self._count("resumed" if same else "resume_other_file")

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
            # Rotated: finish the old file first, then switch to the new one.
            budget -= self._drain(out, budget)
            if budget <= 0:
                return  # more of the old file may remain; next call goes on with it
            if self._partial:
                # The old file is finished: its unterminated last line will never be completed.
                out.append(self._partial)
                self._offsets.append(None)
                self._partial = b""
                self._count("partial_at_rotation")
            self.close()
            self._count("rotations")
            if not self._open(at_end=False):
                return
        elif self._fh is not None:
            try:
                size = os.fstat(self._fh.fileno()).st_size
                pos = self._fh.tell()
            except OSError:
                self._error("stat_failed")
                return
            if size < pos:
                self._count("truncations")
                if self._partial:
                    self._count("partial_dropped")
                    self._partial = b""
                self._fh.seek(0)
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
        self._drain(out, budget)

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
