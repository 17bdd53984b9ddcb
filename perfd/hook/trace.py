"""A Kineto trace opened by the step hook in its own process, when the agent asks.

Why: Kineto on demand needs the job started with ``KINETO_USE_DAEMON=1`` (docs/design.md §3
"Captures"); a job that runs the hook but was started without it could not be captured at all. The
hook owns the step boundaries, so it can open the same trace itself: torch's Kineto profiler (CPU
ops and CUDA activity, the Chrome trace ``perfd.capture.chrome_trace`` reads; it needs the CPU ops:
perfd charges each kernel to the op that launched it), ``ProfilerStep#N`` around each traced step
(the analysis counts the steps by them), ``distributedInfo.rank`` set to the hook's rank.

How it keeps the hook's contract (docs/design.md §4):
- torch.profiler's own stop synchronizes the device (``torch.cuda.synchronize()`` in
  ``autograd.profiler.profile.__exit__`` when it profiles CUDA); this one never does. It profiles
  through ``torch.autograd.profiler.profile`` with no ``use_device`` and adds the CUDA activity
  itself, and it disables the profiler only once the last traced step's end marker (a CUDA event
  recorded at its ``step_end()``) has completed, checked with ``query()`` at later step
  boundaries: every kernel of the traced steps is in the trace, and nothing waits for the GPU.
- Enable and disable run on the training thread at step boundaries (the profiler's state is the
  thread's); the file is written on a short-lived thread (``perfd-hook-trace``), never in the loop.
- Bounded: at most HOOK_MAX_STEPS steps (perfd.hook.profile refuses more); at each traced step's
  begin the trace checks how long it has run and how much the process's resident memory grew since
  it began (``/proc/self/statm``, one ``pread`` of an open descriptor), and past HOOK_TRACE_MAX_S or
  HOOK_TRACE_RSS_GROWTH_MAX that step is its last (what was traced is kept). A written file larger
  than HOOK_TRACE_MAX_BYTES is deleted and the request fails.

Where (:class:`TraceFolder`): the hook's own private folder, never a path from the request (one
request once had a job write its trace, 0644, into a 0777 folder of the requester's choosing):
``$PERFD_HOOK_TRACE_DIR`` if the job sets it, else ``<state dir>/hook-traces``
(:func:`perfd.core.privdir.user_dir`), made and checked by :func:`perfd.core.privdir.open_private_dir` (0700,
ours, no ancestor another user could swap). The file is made exclusively there as ``.NAME.tmp``,
mode 0600, written, then hard-linked to ``NAME.json`` (never overwriting), and reported to the agent
in a ``wire.TraceWritten`` record; the agent takes it only if it is a plain file of the sender's
uid in a folder of that uid closed to others (perfd.capture.hook_trace), and deletes it once copied.
A hook keeps at most HOOK_TRACE_FILES_KEPT of its own traces there (older ones deleted): an agent
that never took them cannot fill the disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from perfd.core.limits import (
    HOOK_TRACE_FILES_KEPT,
    HOOK_TRACE_MAX_BYTES,
    HOOK_TRACE_MAX_S,
    HOOK_TRACE_RSS_GROWTH_MAX,
)
from perfd.core.privdir import UnsafeDirError, open_private_dir, user_dir

if TYPE_CHECKING:
    from perfd.hook.timing import Marker

# Step boundaries after the last traced step at which the trace is stopped even if its end marker
# has not completed (a marker that never completes must not leave the profiler on for the job).
DRAIN_BOUNDARIES_MAX = 64
TRACE_DIR_ENV = "PERFD_HOOK_TRACE_DIR"


class TraceTooLarge(RuntimeError):
    """A written trace past HOOK_TRACE_MAX_BYTES (deleted)."""


class TraceFolder:
    """The hook's private folder for its traces (see the module): where, checked, and which of its
    files it keeps. Thread-safe (the writer thread adds, the training thread checks)."""

    def __init__(self, path: str | None = None, kept: int = HOOK_TRACE_FILES_KEPT) -> None:
        self.path = path or os.environ.get(TRACE_DIR_ENV) or str(user_dir("hook-traces"))
        self.kept = kept
        self._files: deque[str] = deque()  # names this hook wrote there, oldest first
        self._lock = threading.Lock()

    def check(self) -> str | None:
        """Why no trace can be written there (None: it can): made if missing, 0700 and ours."""
        try:
            os.close(open_private_dir(self.path))
        except (UnsafeDirError, OSError) as exc:
            return f"no private folder for traces at {self.path}: {exc}"
        return None

    def write(self, name: str, save: Callable[[str], None], max_bytes: int = HOOK_TRACE_MAX_BYTES) -> str:
        """``save(path)`` into ``.NAME.tmp`` (0600, made exclusively), then ``NAME.json``; its path.
        Raises OSError (or ``save``'s error, or TraceTooLarge) with nothing left behind."""
        dfd = open_private_dir(self.path)
        tmp, final = f".{name}.tmp", f"{name}.json"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd)
            os.close(fd)
            try:
                save(os.path.join(self.path, tmp))  # a folder only this user (or root) can change
                st = os.stat(tmp, dir_fd=dfd, follow_symlinks=False)
                if st.st_size > max_bytes:
                    raise TraceTooLarge(f"the trace is {st.st_size} bytes, more than {max_bytes}: deleted")
                os.chmod(tmp, 0o600, dir_fd=dfd)  # were it made anew by save(): 0600 all the same
                os.link(tmp, final, src_dir_fd=dfd, dst_dir_fd=dfd)  # fails if the name exists
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
            self._keep(dfd, final)
        finally:
            os.close(dfd)
        return os.path.join(self.path, final)

    def _keep(self, dfd: int, name: str) -> None:
        with self._lock:
            self._files.append(name)
            while len(self._files) > self.kept:
                with contextlib.suppress(OSError):
                    os.unlink(self._files.popleft(), dir_fd=dfd)


class _Rss:
    """The process's resident memory, read from an open ``/proc/self/statm`` (one pread)."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self.fd: int | None = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = None

    def bytes(self) -> int | None:
        if self.fd is None:
            return None
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) * self.page
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class _KinetoResult(Protocol):
    """What the profiler leaves (torch's ``_ProfilerResult``): written as a Chrome trace."""

    def save(self, path: str, /) -> None: ...


class _Profile(Protocol):
    """An entered ``torch.autograd.profiler.profile``: what :meth:`KinetoTrace.stop` does with it."""

    kineto_results: _KinetoResult | None

    def __exit__(self, typ: None, value: None, tb: None, /) -> object: ...


def can_trace(torch: ModuleType | None) -> bool:
    """Whether this process can open a Kineto trace itself (torch with its Kineto profiler)."""
    try:
        return bool(torch is not None and torch.autograd.kineto_available())
    except Exception:
        return False


class KinetoTrace:
    """One trace: ``start()`` at the first traced step's begin, ``step(n)`` at each traced step's
    begin, ``end_step()`` at its end, ``stop()`` once the GPU has finished the last one, then
    ``write()`` off the training thread."""

    def __init__(self, torch: ModuleType, folder: TraceFolder, name: str, rank: int, stack: bool, cuda: bool,
                 on_budget: Callable[[int], None] | None = None, max_s: float = HOOK_TRACE_MAX_S,
                 max_rss_growth: int = HOOK_TRACE_RSS_GROWTH_MAX) -> None:
        self.torch, self.folder, self.name, self.rank = torch, folder, name, rank
        self.stack, self.cuda = stack, cuda
        self._prof: _Profile | None = None
        self._step_fn: AbstractContextManager[object] | None = None  # the step's record_function
        self.result: _KinetoResult | None = None
        self.drain: Marker | None = None  # the end marker of the last traced step, while the GPU finishes it
        self.drain_boundaries = 0
        self.last_step = -1  # the last step traced (the statuses name it)
        self.written: str | None = None  # where the file is, once written
        # The budget (see the module): ``on_budget(step)`` makes that step the last one traced.
        self.on_budget, self.max_s, self.max_rss_growth = on_budget, max_s, max_rss_growth
        self.cut: str | None = None  # why the trace ended before its last step, if it did
        self.steps = 0  # steps begun under the trace
        self._t0 = 0.0
        self._rss: _Rss | None = None
        self._rss0: int | None = None

    def start(self) -> None:
        torch = self.torch
        self._t0 = time.monotonic()
        self._rss = _Rss()
        self._rss0 = self._rss.bytes()
        ap = torch.autograd.profiler
        prof = ap.profile(use_kineto=True, record_shapes=self.stack, with_stack=self.stack)
        if self.cuda:
            cuda = torch.profiler.ProfilerActivity.CUDA
            if cuda in torch.autograd._supported_activities():
                prof.kineto_activities.add(cuda)
        prof.__enter__()
        self._prof = prof
        try:  # the rank the trace names (perfd.capture.chrome_trace reads distributedInfo.rank)
            info: dict[str, object] = {"rank": self.rank}
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                info.update(backend=dist.get_backend(), rank=dist.get_rank(),
                            world_size=dist.get_world_size())
            torch.autograd._add_metadata_json("distributedInfo", json.dumps(info))
        except Exception:
            pass  # a trace without the metadata is still a trace

    def step(self, n: int) -> None:
        """A traced step begins: its ``ProfilerStep#n`` range (the analysis counts steps by it). Past
        the budget, the hook is told that this step is the last (``on_budget``)."""
        self.end_step()
        self.steps += 1
        if self.steps > 1 and self.cut is None and self.on_budget is not None:  # the first: just begun
            over = self._over_budget()
            if over is not None:
                self.cut = over
                self.on_budget(n)
        fn = self.torch.autograd.profiler.record_function(f"ProfilerStep#{n}")
        fn.__enter__()
        self._step_fn = fn

    def end_step(self) -> None:
        fn, self._step_fn = self._step_fn, None
        if fn is not None:
            fn.__exit__(None, None, None)

    def drained(self) -> bool:
        """Whether the GPU has finished the traced steps (always, without a marker). Counts the
        boundaries it is asked at: past DRAIN_BOUNDARIES_MAX, True whatever the marker says."""
        self.drain_boundaries += 1
        m = self.drain
        return m is None or self.drain_boundaries > DRAIN_BOUNDARIES_MAX or bool(m.query())

    def _over_budget(self) -> str | None:
        ran = time.monotonic() - self._t0
        if ran > self.max_s:
            return f"ran {ran:.0f} s, more than {self.max_s:.0f} s"
        now = self._rss.bytes() if self._rss is not None else None
        if now is not None and self._rss0 is not None and now - self._rss0 > self.max_rss_growth:
            return f"the process's memory grew {(now - self._rss0) >> 20} MiB, more than " \
                   f"{self.max_rss_growth >> 20} MiB"
        return None

    def stop(self) -> None:
        """Disable the profiler (training thread). No device synchronization: see the module."""
        if self._rss is not None:
            self._rss.close()
        self.end_step()
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.__exit__(None, None, None)
            self.result = prof.kineto_results

    def abort(self) -> None:
        """Stop without keeping anything (a failure half-way, a cancel)."""
        try:
            self.stop()
        finally:
            self.result = None

    def write(self) -> None:
        """Write the trace into the hook's folder (any thread): raises OSError, TraceTooLarge or the
        profiler's error, leaving nothing behind."""
        result = self.result
        if result is None:
            raise RuntimeError("nothing was traced")
        self.written = self.folder.write(self.name, result.save)
        self.result = None

    def write_async(self, done: Callable[[BaseException | None], None]) -> threading.Thread:
        """``write()`` on its own daemon thread; ``done(error or None)`` when it is over."""
        def run() -> None:
            try:
                self.write()
            except BaseException as exc:  # reported as the request's failure, never raised
                done(exc)
                return
            done(None)

        t = threading.Thread(target=run, name="perfd-hook-trace", daemon=True)
        t.start()
        return t
