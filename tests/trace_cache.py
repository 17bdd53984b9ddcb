"""The recorded Kineto traces read and analysed once per test session, not once per test.

Several modules read the same recordings (tests/data/captures/kineto_h100_megatron/ops_*_rank0.json.gz,
1.7-2.2 MB gzipped each) through perfd.capture.chrome_trace and perfd.app.commands.analyze_capture: a few
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

``perfd_cli`` runs perfd's CLI in this process with perfd.capture.chrome_trace's reading and analysis
through the session's results (``session_traces``: the same for a test's own call of the CLI's main):
for the tests of what a command concludes from a trace (the ncu commands read and analyse their
capture's trace, 5-10 s of CPU a run, the same each time), not of the process it runs in (exit by exec,
signals, a shell's quoting: those keep a subprocess).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import logging
import os
import pickle
import shutil
import subprocess
import tempfile
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # tests/gpu scripts import this where pytest may not be installed
    import pytest

    from perfd.analytics.breakdown.device_breakdown import CaptureAnalysis
    from perfd.analytics.breakdown.diagnosis import TimelineClass
    from perfd.capture.analysis import TraceData

ENV = "PERFD_TRACE_CACHE"
T = TypeVar("T")
_Read = Callable[[str | Path], "TraceData"]
_Analyze = Callable[[str | Path, int, bool], "CaptureAnalysis"]
_MADE: list[str] = []  # the folder this process made (and removes at its end)
# perfd.capture.chrome_trace's own read_chrome_trace and analyze_chrome_trace, taken before perfd_cli
# puts the session's in their place: what computes each result (never the stand-ins, calling themselves)
_PERFD: list[tuple[_Read, _Analyze]] = []


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
def _perfd() -> tuple[_Read, _Analyze]:
    if not _PERFD:
        from perfd.capture import chrome_trace

        _PERFD.append((chrome_trace.read_chrome_trace, chrome_trace.analyze_chrome_trace))
    return _PERFD[0]


# The traces the session's read_chrome_trace handed out in this process, each by its id, with the file
# it read (weakly: a trace is tens of MB): the session's analyze_trace knows them as that file's.
_HANDED: weakref.WeakValueDictionary[int, TraceData] = weakref.WeakValueDictionary()
_HANDED_FROM: dict[int, str | Path] = {}


def read_chrome_trace(path: str | Path) -> TraceData:
    """perfd.capture.chrome_trace.read_chrome_trace, once per session."""
    data = cached("read", [path], (), lambda: _perfd()[0](path))
    data = dataclasses.replace(data, source=str(path))
    _HANDED[id(data)], _HANDED_FROM[id(data)] = data, path
    return data


def _analyze_trace(perfd_analyze: Callable[[TraceData, int, bool], CaptureAnalysis]
                   ) -> Callable[[TraceData, int, bool], CaptureAnalysis]:
    """perfd.capture.analysis.analyze_trace: of a trace the session's read_chrome_trace handed out (the
    commands analyse what they read, unchanged), the session's analysis of its file; of any other, perfd's."""
    def analyze_trace(data: TraceData, top_n: int = 10, use_frames: bool = True) -> CaptureAnalysis:
        if _HANDED.get(id(data)) is data:
            return analyze_chrome_trace(_HANDED_FROM[id(data)], top_n, use_frames)
        return perfd_analyze(data, top_n, use_frames)
    return analyze_trace


def analyze_chrome_trace(path: str | Path, top_n: int = 10, use_frames: bool = True) -> CaptureAnalysis:
    """perfd.capture.chrome_trace.analyze_chrome_trace, once per session."""
    a = cached("analyze", [path], (top_n, use_frames), lambda: _perfd()[1](path, top_n, use_frames))
    return dataclasses.replace(a, source=str(path))


@contextlib.contextmanager
def session_traces() -> Iterator[None]:
    """perfd.capture.chrome_trace's read_chrome_trace and analyze_chrome_trace, and analysis.analyze_trace
    of what the former read, as the session's, for perfd's code that looks them up at its call (the
    commands import them where they use them)."""
    import pytest

    from perfd.capture import analysis, chrome_trace

    _perfd()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(chrome_trace, "read_chrome_trace", read_chrome_trace)
        mp.setattr(chrome_trace, "analyze_chrome_trace", analyze_chrome_trace)
        mp.setattr(analysis, "analyze_trace", _analyze_trace(analysis.analyze_trace))
        yield


def perfd_cli(*args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``perfd ARGS`` run in this process with ``env`` added to the environment, the traces it reads
    the session's: its exit status, stdout and stderr as a subprocess's would be."""
    import pytest

    from perfd.app.cli import main

    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers = list(root.handlers)
    with session_traces(), pytest.MonkeyPatch.context() as mp, \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        for k, v in env.items():
            mp.setenv(k, v)
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's refusals
            code = exc.code if isinstance(exc.code, int) else 1
        finally:  # a handler main's logging set up would outlive the streams it writes to
            for h in [h for h in root.handlers if h not in handlers]:
                root.removeHandler(h)
    return subprocess.CompletedProcess([str(a) for a in args], code, out.getvalue(), err.getvalue())


def timeline_class(path: str, steps: int | None = None, forced: bool = False) -> TimelineClass:
    """perfd.app.commands.analyze_capture.timeline_class, its analysis (the cost) the session's: the one
    analyze_chrome_trace here gives (an nsys capture's is not kept)."""
    from perfd.app.commands import analyze_capture

    if Path(path).suffix in (".nsys-rep", ".sqlite"):
        return analyze_capture.timeline_class(path, steps, forced)
    return analyze_capture.timeline_of(Path(path).name, analyze_chrome_trace(path), steps, forced)
