"""When each line of a launched job's log arrived: the ``<log>.times`` sidecar of `perfd launch`.

Training logs stamp their lines to the second at best (Megatron-LM: ``[2026-11-21 10:00:01]``),
and the communication share maps each collective to the iteration it ran in by time, so a step
boundary needs millisecond precision. `perfd launch` reads the job's output pipe itself; it notes
the time of every read that carried a newline, as one text line ``END_OFFSET TIME_NS``: the log's
size after that read (bytes) and the wall-clock time of the read (ns since the epoch). A line of
the log whose last byte lies at offset ``o`` (its newline at ``o``) arrived with the first read
whose END_OFFSET is > ``o``. The job prints with PYTHONUNBUFFERED=1 (set by `perfd launch`), so
arrival is the print time plus the pipe's latency (microseconds).

The sidecar is append-only and written by one process; this reader follows it as it grows and
never raises (a torn last line is read again at the next call). :func:`open_for_writing` opens the
log and its sidecar for `perfd launch`, which often runs as root: never through a link another user
planted, nor over a file that is not the launching user's own (perfd.core.privdir.open_own_file).
"""

from __future__ import annotations

import bisect
import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

SUFFIX = ".times"


def sidecar_path(log_path: str | Path) -> Path:
    return Path(str(log_path) + SUFFIX)


def format_record(end_offset: int, time_ns: int) -> bytes:
    return f"{end_offset} {time_ns}\n".encode()


def open_for_writing(log_path: Path) -> tuple[BinaryIO, BinaryIO | None, str | None]:
    """(the log, its sidecar or None, why the sidecar is None), both opened in the log's folder (made
    if missing, checked: perfd.core.privdir.open_safe_dir) and checked before either is truncated, so a
    refusal leaves both as they were. Raises UnsafeDirError (refused: a link, another user's file or
    folder) or OSError (the log cannot be written); a sidecar that merely cannot be written is None."""
    from perfd.core.privdir import UnsafeDirError, open_own_file, open_safe_dir

    log_path = Path(os.path.abspath(log_path))
    times_path = sidecar_path(log_path)
    dir_fd = open_safe_dir(log_path.parent)
    try:
        log_fd = open_own_file(dir_fd, log_path.name, str(log_path))
        why = None
        try:
            times_fd: int | None = open_own_file(dir_fd, times_path.name, str(times_path))
        except UnsafeDirError:
            os.close(log_fd)
            raise
        except OSError as exc:
            times_fd, why = None, exc.strerror or str(exc)
    finally:
        os.close(dir_fd)
    for fd in (log_fd, times_fd):
        if fd is not None:
            os.ftruncate(fd, 0)  # a new run's log, as open("wb") gave
    return os.fdopen(log_fd, "wb"), None if times_fd is None else os.fdopen(times_fd, "wb"), why


class LineTimes:
    """Follows a ``.times`` sidecar; :meth:`time_for` gives a line's arrival time in seconds."""

    def __init__(self, path: str | Path, max_records: int = 100_000) -> None:
        self.path = Path(path)
        self.max_records = max_records
        self.errors: dict[str, int] = {}
        self._pos = 0
        self._ends: list[int] = []
        self._times: list[int] = []
        self._pruned_below = 0  # lines ending before this offset lost their record

    def _count(self, key: str) -> None:
        if key not in self.errors:
            log.warning("line times %s: %s (counted; further occurrences not logged)", self.path, key)
        self.errors[key] = self.errors.get(key, 0) + 1

    def refresh(self) -> None:
        try:
            # Opened without blocking and read only as a regular file: a FIFO put at the path would
            # otherwise hold the collector until a writer came (the log tail does the same).
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    self._count("not_regular")
                    return
                os.set_blocking(fd, True)
                fh.seek(self._pos)
                data = fh.read()
        except FileNotFoundError:
            return  # not written yet (or no launch): times stay unknown
        except OSError:
            self._count("read_failed")
            return
        done = data.rfind(b"\n") + 1
        self._pos += done
        for raw in data[:done].splitlines():
            parts = raw.split()
            try:
                end, t = int(parts[0]), int(parts[1])
            except (IndexError, ValueError):
                self._count("malformed_record")
                continue
            if self._ends and end < self._ends[-1]:
                self._count("offset_went_back")  # a new log over the old sidecar: start again
                self._ends, self._times, self._pruned_below = [], [], 0
            self._ends.append(end)
            self._times.append(t)
        if len(self._ends) > self.max_records:  # old lines were read long ago
            cut = len(self._ends) - self.max_records
            self._pruned_below = self._ends[cut - 1]
            del self._ends[:cut], self._times[:cut]

    def time_for(self, newline_offset: int | None) -> float | None:
        """Arrival time (epoch seconds) of the line whose newline is at ``newline_offset``."""
        if newline_offset is None or newline_offset < self._pruned_below:
            return None
        i = bisect.bisect_right(self._ends, newline_offset)
        if i >= len(self._ends):
            self.refresh()
            i = bisect.bisect_right(self._ends, newline_offset)
            if i >= len(self._ends):
                return None
        return self._times[i] / 1e9
