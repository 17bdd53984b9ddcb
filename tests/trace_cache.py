"""The recorded Kineto traces read and analysed once per test session, not once per test (issue 57).

Several modules read the same recordings (tests/data/captures/kineto_h100_megatron/ops_*_rank0.json.gz,
1.7-2.2 MB gzipped each) through perfd.capture.chrome_trace and perfd.commands.analyze_capture: a few
seconds of CPU each time, the same result each time. Here each result is computed by perfd's own code
the first time a session asks for it and kept on disk, pickled, keyed by what it is a function of: the
function, its arguments and the SHA-256 of the file's bytes (the path perfd writes into the result is
put back on each copy: a copy of a recording shares it). Every later call in the session (any xdist
worker) unpickles it: a fresh copy each time, so a test that changes what it got changes nothing
another test reads. ``cached`` does the same for a fixture's result computed from files.

The folder is made by the pytest process that starts the session (the xdist controller) and handed to
its workers in the environment (``PERFD_TRACE_CACHE``); it is removed when that process ends, so a
session never reads what perfd's code of another session computed. A pytester inner session inherits
its parent's. Outside pytest (no folder named) each call computes afresh. Where two workers ask for one
result at once, the second waits on a lock for the first's rather than computing it too (two cores).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # tests/gpu scripts import this where pytest may not be installed
    import pytest

    from perfd.analytics.breakdown.diagnosis import TimelineClass
    from perfd.capture.analysis import CaptureAnalysis, TraceData

ENV = "PERFD_TRACE_CACHE"
T = TypeVar("T")
_MADE: list[str] = []  # the folder this process made (and removes at its end)


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(ENV):
        folder = tempfile.mkdtemp(prefix="perfd-trace-cache-")
        os.environ[ENV] = folder
        _MADE.append(folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _MADE:
        folder = _MADE.pop()
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get(ENV) == folder:
            del os.environ[ENV]


def cached(kind: str, paths: Sequence[str | Path], args: tuple[object, ...], compute: Callable[[], T]) -> T:
    """``compute()``, once per session for ``kind`` and ``args`` over these files' bytes (a fixture's
    result that is a function of them and of the code alone): a fresh unpickled copy on every call."""
    folder = os.environ.get(ENV)
    if not folder or not Path(folder).is_dir():
        return compute()
    digests = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]
    key = hashlib.sha256(repr((kind, args, digests)).encode()).hexdigest()[:32]
    entry = Path(folder) / f"{key}.pickle"
    with open(Path(folder) / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not entry.exists():
            part = entry.with_suffix(f".{os.getpid()}.part")
            part.write_bytes(pickle.dumps(compute(), protocol=pickle.HIGHEST_PROTOCOL))
            os.replace(part, entry)
        got: T = pickle.loads(entry.read_bytes())  # a copy, the first caller's too
        return got


# The file's path enters perfd's reading of it only as ``source`` (perfd.capture.chrome_trace): a copy
# of a recording (a capture store's) shares the recording's result, its own path put back.
def read_chrome_trace(path: str | Path) -> TraceData:
    """perfd.capture.chrome_trace.read_chrome_trace, once per session."""
    from perfd.capture import chrome_trace

    data = cached("read", [path], (), lambda: chrome_trace.read_chrome_trace(path))
    return dataclasses.replace(data, source=str(path))


def analyze_chrome_trace(path: str | Path, top_n: int = 10, use_frames: bool = True) -> CaptureAnalysis:
    """perfd.capture.chrome_trace.analyze_chrome_trace, once per session."""
    from perfd.capture import chrome_trace

    a = cached("analyze", [path], (top_n, use_frames),
               lambda: chrome_trace.analyze_chrome_trace(path, top_n, use_frames))
    return dataclasses.replace(a, source=str(path))


def timeline_class(path: str, steps: int | None = None, forced: bool = False) -> TimelineClass:
    """perfd.commands.analyze_capture.timeline_class, its analysis (the cost) the session's: the one
    analyze_chrome_trace here gives (an nsys capture's is not kept)."""
    from perfd.commands import analyze_capture

    if Path(path).suffix in (".nsys-rep", ".sqlite"):
        return analyze_capture.timeline_class(path, steps, forced)
    return analyze_capture.timeline_of(Path(path).name, analyze_chrome_trace(path), steps, forced)
