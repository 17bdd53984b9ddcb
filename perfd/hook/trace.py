"""A Kineto trace opened by the step hook in its own process, when the agent asks (issue 44 item 4).

Why: Kineto on demand needs the job started with ``KINETO_USE_DAEMON=1`` (DESIGN.md §3
"Captures"); a job that runs the hook but was started without it could not be captured at all. The
hook owns the step boundaries, so it can open the same trace itself: torch's Kineto profiler (CPU
ops and CUDA activity, the Chrome trace ``perfd.capture.chrome_trace`` reads; it needs the CPU ops:
perfd charges each kernel to the op that launched it), ``ProfilerStep#N`` around each traced step
(the analysis counts the steps by them), ``distributedInfo.rank`` set to the hook's rank.

How it keeps the hook's contract (DESIGN.md §4):
- torch.profiler's own stop synchronizes the device (``torch.cuda.synchronize()`` in
  ``autograd.profiler.profile.__exit__`` when it profiles CUDA); this one never does. It profiles
  through ``torch.autograd.profiler.profile`` with no ``use_device`` and adds the CUDA activity
  itself, and it disables the profiler only once the last traced step's end marker (a CUDA event
  recorded at its ``step_end()``) has completed, checked with ``query()`` at later step
  boundaries: every kernel of the traced steps is in the trace, and nothing waits for the GPU.
- Enable and disable run on the training thread at step boundaries (the profiler's state is the
  thread's); the file is written on a short-lived thread (``perfd-hook-trace``), never in the loop.
- The file: a temporary file made exclusively in the folder the agent named, then hard-linked to
  the name asked for, which must not exist (a request can never overwrite a file), ``*.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

# Step boundaries after the last traced step at which the trace is stopped even if its end marker
# has not completed (a marker that never completes must not leave the profiler on for the job).
DRAIN_BOUNDARIES_MAX = 64


def can_trace(torch: Any) -> bool:
    """Whether this process can open a Kineto trace itself (torch with its Kineto profiler)."""
    try:
        return bool(torch is not None and torch.autograd.kineto_available())
    except Exception:
        return False


def check_path(path: str) -> str | None:
    """Why the hook refuses to write a trace at ``path`` (None: it may): absolute, ``*.json``, its
    folder there, no file of that name yet."""
    if not os.path.isabs(path) or not path.endswith(".json") or "\0" in path:
        return "not an absolute *.json path"
    if not os.path.isdir(os.path.dirname(path)):
        return "its folder does not exist here"
    if os.path.lexists(path):
        return "a file of that name exists"
    return None


class KinetoTrace:
    """One trace: ``start()`` at the first traced step's begin, ``step(n)`` at each traced step's
    begin, ``end_step()`` at its end, ``stop()`` once the GPU has finished the last one, then
    ``write()`` off the training thread."""

    def __init__(self, torch: Any, path: str, rank: int, stack: bool, cuda: bool) -> None:
        self.torch, self.path, self.rank, self.stack, self.cuda = torch, path, rank, stack, cuda
        self._prof: Any = None
        self._step_fn: Any = None
        self.result: Any = None
        self.drain: Any = None  # the end marker of the last traced step, while the GPU finishes it
        self.drain_boundaries = 0
        self.last_step = -1  # the last step traced (the statuses name it)

    def start(self) -> None:
        torch = self.torch
        ap = torch.autograd.profiler
        prof = ap.profile(use_kineto=True, record_shapes=self.stack, with_stack=self.stack)
        if self.cuda:
            cuda = torch.profiler.ProfilerActivity.CUDA
            if cuda in torch.autograd._supported_activities():
                prof.kineto_activities.add(cuda)
        prof.__enter__()
        self._prof = prof
        try:  # the rank the trace names (perfd.capture.chrome_trace reads distributedInfo.rank)
            info: dict[str, Any] = {"rank": self.rank}
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                info.update(backend=dist.get_backend(), rank=dist.get_rank(),
                            world_size=dist.get_world_size())
            torch.autograd._add_metadata_json("distributedInfo", json.dumps(info))
        except Exception:
            pass  # a trace without the metadata is still a trace

    def step(self, n: int) -> None:
        """A traced step begins: its ``ProfilerStep#n`` range (the analysis counts steps by it)."""
        self.end_step()
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

    def stop(self) -> None:
        """Disable the profiler (training thread). No device synchronization: see the module."""
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
        """Write the trace at ``path`` (any thread): raises OSError or the profiler's error."""
        result = self.result
        if result is None:
            raise RuntimeError("nothing was traced")
        folder = os.path.dirname(self.path)
        fd, tmp = tempfile.mkstemp(prefix=".perfd-trace-", suffix=".json.tmp", dir=folder)
        os.close(fd)
        try:
            result.save(tmp)
            os.link(tmp, self.path)  # fails if the name exists: never overwrite
        finally:
            os.unlink(tmp)
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
