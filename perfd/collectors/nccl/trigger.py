"""Make running ranks dump their Flight Recorder ring, without touching the training code.

With ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<dir>/frp_`` in its environment, each rank's
ProcessGroupNCCL monitor thread creates the FIFO ``<dir>/frp_<rank>.pipe`` (rank = global rank of
the default group) and polls it, non-blocking, about once a second. Any byte written to it makes the
rank write its ring to ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` (older name
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, default ``/tmp/nccl_trace_rank_``). torch writes that file in
place (truncate, then write), not via a temporary file and a rename, so a reader can see a partial
dump: :class:`DumpReader` only accepts a file whose pickle loads completely and retries otherwise.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from perfd.collectors.nccl.flight_recorder import (
    MAX_DUMP_BYTES,
    DumpError,
    FlightRecorderDump,
    load_dump_bytes,
    parse_dump,
)


def trigger_dump(pipe_path: str | Path) -> str:
    """Ask one rank for a dump by writing a byte to its FIFO. Never blocks, never raises.

    Returns a status to count: ``sent``; ``no_reader`` (ENXIO: the FIFO exists but no process has
    it open - the rank has exited or not started); ``missing``; ``not_fifo`` (refused: writing into
    a regular file would corrupt it); ``busy`` (EAGAIN: the pipe is full, a request is already
    queued); ``error:<errno name>``.
    """
    path = os.fspath(pipe_path)
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"error:{errno.errorcode.get(exc.errno or 0, exc.errno)}"
    if not stat.S_ISFIFO(st.st_mode):
        return "not_fifo"
    try:
        # O_NONBLOCK: open fails with ENXIO instead of waiting for a reader; O_NOFOLLOW: the agent
        # may run with more rights than the job, never follow a link planted in the directory.
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return "no_reader"
        if exc.errno == errno.ENOENT:
            return "missing"
        return f"error:{errno.errorcode.get(exc.errno or 0, exc.errno)}"
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):  # replaced between stat and open
            return "not_fifo"
        os.write(fd, b"1")
        return "sent"
    except BlockingIOError:
        return "busy"
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            return "no_reader"
        return f"error:{errno.errorcode.get(exc.errno or 0, exc.errno)}"
    finally:
        os.close(fd)


def _ranked_files(prefix: str, suffix: str) -> dict[int, str]:
    """Files named ``<prefix><rank><suffix>`` -> {rank: path}."""
    directory, stem = os.path.split(prefix)
    out: dict[int, str] = {}
    try:
        entries = list(os.scandir(directory or "."))
    except OSError:
        return out
    for e in entries:
        name = e.name
        if not name.startswith(stem) or not name.endswith(suffix):
            continue
        middle = name[len(stem):len(name) - len(suffix)] if suffix else name[len(stem):]
        if middle.isdigit():
            out[int(middle)] = os.path.join(directory, name)
    return out


def find_pipes(pipe_prefix: str) -> dict[int, str]:
    """The FIFOs the ranks on this node created: ``<pipe_prefix><rank>.pipe``."""
    return _ranked_files(pipe_prefix, ".pipe")


@dataclass
class _Seen:
    key: tuple[int, int, int]  # (inode, size, mtime_ns) of the version last handled
    failures: int = 0


class DumpReader:
    """Reads ``<dump_prefix><rank>`` files each time they change, complete pickles only.

    ``read_new_dumps()`` returns the dumps written since the last call. A file that does not load
    (still being written) is retried at the next call (``counts["partial_retry"]``); the same
    unchanged bytes failing twice are given up (``corrupt``) until the file changes. A refused
    pickle (a global outside the allow-list) is never retried (``refused_global``). With
    ``read_existing=False``, dumps already present at construction (an earlier job) are skipped.
    """

    def __init__(self, dump_prefix: str | Path, job: str = "", read_existing: bool = False,
                 max_bytes: int = MAX_DUMP_BYTES) -> None:
        self.prefix = os.fspath(dump_prefix)
        self.job = job
        self.max_bytes = max_bytes
        self.counts: dict[str, int] = {}
        self._seen: dict[str, _Seen] = {}
        if not read_existing:
            for path in _ranked_files(self.prefix, "").values():
                key = self._stat_key(path)
                if key is not None:
                    self._seen[path] = _Seen(key)

    def _c(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    @staticmethod
    def _stat_key(path: str) -> tuple[int, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def read_new_dumps(self) -> list[FlightRecorderDump]:
        out: list[FlightRecorderDump] = []
        for rank, path in sorted(_ranked_files(self.prefix, "").items()):
            dump = self._read_one(rank, path)
            if dump is not None:
                out.append(dump)
        return out

    def _read_one(self, rank: int, path: str) -> FlightRecorderDump | None:
        key = self._stat_key(path)
        if key is None:
            return None
        seen = self._seen.get(path)
        if seen is not None and seen.key == key and seen.failures != 1:
            return None  # handled already (read, or given up on these exact bytes)
        if key[1] > self.max_bytes:
            self._c("too_large")
            self._seen[path] = _Seen(key, failures=2)
            return None
        try:
            with open(path, "rb") as fh:
                data = fh.read(self.max_bytes + 1)
        except OSError:
            self._c("read_failed")
            return None
        if self._stat_key(path) != key:
            self._c("partial_retry")  # still being written
            return None
        try:
            raw = load_dump_bytes(data)
        except DumpError as exc:
            if exc.reason == "refused_global":
                self._c("refused_global")
                self._seen[path] = _Seen(key, failures=2)
                return None
            failures = seen.failures + 1 if seen is not None and seen.key == key else 1
            self._seen[path] = _Seen(key, failures=failures)
            self._c("partial_retry" if failures == 1 else "corrupt")
            return None
        self._seen[path] = _Seen(key)
        self._c("dumps")
        return parse_dump(raw, rank, self.job, path=path)
