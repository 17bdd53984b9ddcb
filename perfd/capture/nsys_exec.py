"""nsys captures of running jobs (docs/design.md §3 "Captures"): no profiler attaches to a running process,
so the job starts under nsys in one of three ways, and perfd drives it from there.

1. **Interactive session** — the job (or each rank) starts under
   ``nsys launch --session-new=NAME --trace=cuda,nvtx,osrt CMD...``
   (:func:`nsys_launch_argv`); nothing is recorded until ``nsys start --session=NAME -o OUT``, and
   ``nsys stop --session=NAME`` writes ``OUT.nsys-rep``. Windows can repeat. A session covers every
   process started under it: one session per rank (:func:`session_name` with the rank) makes
   per-rank captures possible; a job-wide session captures all of its ranks at once.
2. **Step-aligned ranges in a per-rank session** (what ``perfd nsys-prefix`` prints, the default) —
   each rank starts under its own session (``perfd nsys-exec``: ``nsys launch
   --session-new=perfd-<job>-r<RANK>``); a capture runs ``nsys start --session=S -c cudaProfilerApi
   --capture-range-end=stop -o OUT`` (:meth:`NsysExecutor.start_range`), then the perfd step hook
   calls ``cudaProfilerStart()``/``Stop()`` at the step boundaries the agent asks for
   (``collectors.hook`` ``request_profile``). nsys writes ``OUT.nsys-rep`` when the range closes and
   the session waits for the next ``start``: step-aligned, repeatable, reported at once.
3. **Range profile** (``perfd nsys-prefix --mode profile``) —
   ``nsys profile -c cudaProfilerApi --capture-range-end=repeat -o BASE ...``
   (:func:`nsys_range_argv`; ``BASE`` holds ``%q{RANK}``) with the same hook ranges. Measured on nsys
   2025.3.1 (tests/gpu/nsys_range_timing.sh, docs/evidence/README.md): a ``repeat`` range's report is
   written only when the process exits, so a capture in this mode ends when the job does; mode 2
   does not have that limit.

In modes 2 and 3 nsys flushes the range's trace inside ``cudaProfilerStop``: the captured rank's
thread waited 2.6–3.1 s there for a 2 s range of ~700 kernels (the same measurement), so the rank
loses that time once per capture (and the ranks that wait on it in a collective with it).

Every nsys call is an argument list with a timeout, never a shell string. After a capture the report
is exported to SQLite and analysed (:func:`perfd.capture.nsys_sqlite.analyze_nsys`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from perfd.capture.binaries import NsysNotFoundError, find_nsys

DEFAULT_TRACE = "cuda,nvtx,osrt"
_SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_REPORT_RE = r"^{stem}(?:\.(\d+))?\.(?:nsys-rep|qdrep)$"

Runner = Callable[..., "subprocess.CompletedProcess[str]"]

__all__ = ["NsysError", "NsysExecutor", "nsys_launch_argv",
           "nsys_range_argv", "range_reports", "rank_session_prefix", "session_name", "wait_stable"]


class NsysError(RuntimeError):
    pass


_BASE_MAX = 40  # characters of a job's session base (perfd-<base>-r<rank> within _SESSION_RE's 64)
_HASHED = re.compile(r".*-[0-9a-f]{10}")  # what a base with its name's hash looks like


def _session_base(job: str) -> str:
    """The job's part of its session names and ncu target paths: letters, digits, _ . - only (so
    also one shell word). A name that is not such a word already, or is longer than 40 characters,
    or looks like a hashed base, keeps a hash of itself: ``team/a``, ``team a`` and ``team_a`` (and
    names sharing their first 40 characters) are three sessions, not one."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "_", job).strip("._-") or "job"
    if clean == job and len(job) <= _BASE_MAX and not _HASHED.fullmatch(job):
        return job
    digest = hashlib.blake2b(job.encode(), digest_size=5).hexdigest()
    return f"{clean[:_BASE_MAX - len(digest) - 1].rstrip('._-') or 'job'}-{digest}"


# A word no shell splits or expands, also unquoted under $(...), where the shell splits on white space
# and expands globs but removes no quotes: a value with anything else travels as hex (FLAG-hex), so
# ``regex:.*gemm.*`` never becomes the file names of the current folder.
SHELL_WORD = re.compile(r"[A-Za-z0-9_.,:=/+@%-]+")
HEX_SUFFIX = "-hex"


def shell_arg(flag: str, value: str) -> list[str]:
    """``[flag, value]`` when ``value`` is one safe shell word, else ``[flag-hex, hex(value)]``."""
    if SHELL_WORD.fullmatch(value):
        return [flag, value]
    return [flag + HEX_SUFFIX, value.encode().hex()]


def from_hex(text: str, flag: str) -> str:
    """A ``FLAG-hex`` value back to its text (ValueError naming the flag)."""
    try:
        return bytes.fromhex(text).decode()
    except ValueError:
        raise ValueError(f"{flag}{HEX_SUFFIX} {text[:40]!r}: not hex of UTF-8 text") from None


def session_from_base(base: str, rank: int | None = None) -> str:
    """The session name of a base :func:`session_name` made (``nsys-exec --session-base``)."""
    return _check_session(f"perfd-{base}" if rank is None else f"perfd-{base}-r{int(rank)}")


def session_name(job: str, rank: int | None = None) -> str:
    """The session name perfd uses for a job (``perfd-<job>``) or one rank (``perfd-<job>-r<rank>``)."""
    base = _session_base(job)
    return f"perfd-{base}" if rank is None else f"perfd-{base}-r{int(rank)}"


def _check_session(name: str) -> str:
    if not _SESSION_RE.match(name):
        raise ValueError(f"bad nsys session name {name!r} (letters, digits, _ . -; at most 64)")
    return name


def nsys_launch_argv(nsys: str, session: str, cmd: Sequence[str], trace: str = DEFAULT_TRACE,
                     extra: Sequence[str] = ()) -> list[str]:
    """``nsys launch`` for an interactive session: records nothing until ``nsys start``."""
    if not cmd:
        raise ValueError("no command to launch")
    # --sample and --cpuctxsw are refused by `launch` since nsys 2021.5 (seen on 2025.3: "The
    # sample switch can be set on the profile and start commands"): they go on `start` instead.
    return [nsys, "launch", f"--session-new={_check_session(session)}", f"--trace={trace}",
            *extra, *cmd]


def nsys_range_argv(nsys: str, output_base: str | Path, cmd: Sequence[str], trace: str = DEFAULT_TRACE,
                    repeat: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """``nsys profile`` that records only between cudaProfilerStart/Stop, every time (one report per
    range: ``<base>.1.nsys-rep``, ...). Put ``%q{RANK}`` in ``output_base`` when nsys wraps each rank."""
    if not cmd:
        raise ValueError("no command to profile")
    if repeat is not None and repeat < 1:
        raise ValueError("repeat must be >= 1")
    end = "repeat" if repeat is None else f"repeat:{repeat}"
    return [nsys, "profile", "-c", "cudaProfilerApi", f"--capture-range-end={end}", f"--trace={trace}",
            "--sample=none", "--cpuctxsw=none", "--force-overwrite=true", "-o", str(output_base), *extra,
            *cmd]


def rank_session_prefix(job: str, trace: str = DEFAULT_TRACE,
                        perfd: Sequence[str] | None = None) -> list[str]:
    """What goes between ``torchrun --no-python`` and ``python train.py`` so that each rank runs under
    its own nsys session ``perfd-<job>-r<RANK>`` (``perfd nsys-exec`` reads ``RANK`` from torchrun's
    environment and becomes ``nsys launch``). ``perfd``: how to run perfd (default: this Python with
    ``-m perfd.app.cli``, which works wherever perfd is importable)."""
    import sys

    head = list(perfd) if perfd is not None else [sys.executable, "-m", "perfd.app.cli"]
    # The job's session base, not its name: the same sessions, and one word for $(...).
    return [*head, "nsys-exec", "--session-base", _session_base(job), *shell_arg("--trace", trace), "--"]


def rank_session_argv(nsys: str, job: str, rank: int, cmd: Sequence[str],
                      trace: str = DEFAULT_TRACE, base: str | None = None) -> list[str]:
    """``nsys launch`` of one rank in its own session (what ``perfd nsys-exec`` runs); ``base``: the
    session base nsys-prefix printed (then ``job`` is not read)."""
    session = session_from_base(base, rank) if base is not None else session_name(job, rank)
    return nsys_launch_argv(nsys, session, cmd, trace=trace)


def unsafe_for_shell(word: str) -> bool:
    """Whether the shell would split or expand ``word`` printed for $(...): white space, a glob."""
    return any(c.isspace() or c in "*?[" for c in word)


RANGE_SUBDIR = "nsys-ranges"  # under the agent's capture directory


def default_capture_root() -> Path:
    """The agent's capture directory when neither ``capture_dir`` nor ``--state-dir`` is configured:
    per user (``~/.local/state/perfd/captures``, :func:`perfd.core.privdir.user_dir`), never a shared
    ``/tmp`` name that another user could make first."""
    from perfd.core.privdir import user_dir

    return user_dir("captures")


def rank_range_prefix(nsys: str, job: str, capture_root: str | Path | None = None,
                      trace: str = DEFAULT_TRACE) -> list[str]:
    """What goes between ``torchrun --no-python`` and ``python train.py`` so that each rank runs
    under its own range profile, writing where the agent on this node looks for it
    (``<capture dir>/nsys-ranges/perfd-<job>/rank<RANK>``; nsys expands ``%q{RANK}``). A rule or
    ``perfd capture --tool nsys`` then records only the targeted ranks, at step boundaries set by
    the step hook."""
    root = Path(capture_root) if capture_root is not None else default_capture_root()
    base = root / RANGE_SUBDIR / session_name(job) / "rank%q{RANK}"
    return nsys_range_argv(nsys, str(base), ["CMD"], trace=trace)[:-1]


def range_reports(output_base: str | Path, since: float | None = None) -> dict[int, Path]:
    """Reports of a range profile with this output base (``BASE.nsys-rep`` is index 0,
    ``BASE.N.nsys-rep`` index N), only those modified at or after ``since`` (epoch s) when given."""
    base = Path(output_base)
    if not base.parent.is_dir():
        return {}
    rx = re.compile(_REPORT_RE.format(stem=re.escape(base.name)))
    found: dict[int, Path] = {}
    for p in base.parent.iterdir():
        m = rx.match(p.name)
        if not m:
            continue
        if since is not None:
            try:
                if p.stat().st_mtime < since:
                    continue
            except OSError:
                continue
        found[int(m.group(1) or 0)] = p
    return found


def wait_stable(paths: Callable[[], Sequence[Path]], timeout_s: float, settle_s: float = 1.0,
                poll_s: float = 0.2, stop: Callable[[], bool] | None = None) -> list[Path] | None:
    """Wait until ``paths()`` is non-empty and every file's size stayed the same for ``settle_s``.
    Returns the files, or None at the timeout (or when ``stop()`` says so)."""
    deadline = time.monotonic() + timeout_s
    last: dict[Path, int] = {}
    stable_since: float | None = None
    while True:
        now = time.monotonic()
        current: dict[Path, int] = {}
        for p in paths():
            with contextlib.suppress(OSError):
                current[p] = p.stat().st_size
        if current and current == last and all(v > 0 for v in current.values()):
            if stable_since is None:
                stable_since = now
            if now - stable_since >= settle_s:
                return sorted(current)
        else:
            stable_since = None
        last = current
        if now >= deadline or (stop is not None and stop()):
            return None
        time.sleep(poll_s)


class NsysExecutor:
    """Runs nsys commands for captures. ``nsys``: the binary (default :func:`find_nsys`, looked up
    when first needed so that an agent without nsys still starts; :meth:`available` says why not)."""

    def __init__(self, nsys: str | None = None, timeout_s: float = 60.0, export_timeout_s: float = 900.0,
                 range_dir: str | Path | None = None, runner: Runner | None = None,
                 env: dict[str, str] | None = None) -> None:
        self._nsys = nsys
        self.timeout_s = timeout_s
        self.export_timeout_s = export_timeout_s
        self.range_dir = Path(range_dir) if range_dir is not None else None
        self.runner: Runner = runner or subprocess.run
        self.env = env

    @property
    def nsys(self) -> str:
        if self._nsys is None:
            self._nsys = find_nsys()
        return self._nsys

    def available(self) -> str | None:
        """None when nsys can be run, else the reason."""
        try:
            self.nsys  # noqa: B018 - resolves the binary
        except NsysNotFoundError as exc:
            return str(exc)
        return None

    def _run(self, args: list[str], timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [self.nsys, *args]
        try:
            res = self.runner(cmd, capture_output=True, text=True, timeout=timeout_s or self.timeout_s,
                              check=False, env=self.env)
        except subprocess.TimeoutExpired as exc:
            raise NsysError(f"{' '.join(cmd)}: no answer within {exc.timeout:.0f} s") from exc
        except OSError as exc:
            raise NsysError(f"{' '.join(cmd)}: {exc}") from exc
        if res.returncode != 0:
            tail = ((res.stderr or "") + (res.stdout or "")).strip()[-1500:]
            raise NsysError(f"{' '.join(cmd)} exited {res.returncode}: {tail}")
        return res

    # -- interactive sessions -----------------------------------------------------------------
    def sessions(self) -> list[str]:
        """Names of the nsys sessions of this user (``nsys sessions list``: a header row, then one row
        per session whose last column is its name)."""
        res = self._run(["sessions", "list"])
        return [ln.split()[-1] for ln in res.stdout.splitlines()
                if len(ln.split()) >= 2 and "NAME" not in ln.split()]

    def start(self, session: str, output: str | Path) -> float:
        """``nsys start --session=S -o OUT``; returns the time (epoch s) it returned (collection on)."""
        self._run(["start", f"--session={_check_session(session)}", "--sample=none", "--cpuctxsw=none",
                   "-o", str(output),
                   "--force-overwrite=true"])
        return time.time()

    def start_range(self, session: str, output: str | Path) -> float:
        """``nsys start --session=S -c cudaProfilerApi --capture-range-end=stop -o OUT``: the session
        records from the process's next ``cudaProfilerStart`` to its ``cudaProfilerStop``, writes
        ``OUT.nsys-rep`` then, and waits for the next start (measured on nsys 2025.3.1)."""
        self._run(["start", f"--session={_check_session(session)}", "-c", "cudaProfilerApi",
                   "--capture-range-end=stop", "--sample=none", "--cpuctxsw=none", "-o", str(output),
                   "--force-overwrite=true"])
        return time.time()

    def stop(self, session: str, output: str | Path, timeout_s: float | None = None) -> Path:
        """``nsys stop --session=S``, then wait for ``OUT.nsys-rep`` to be complete."""
        self._run(["stop", f"--session={_check_session(session)}"], timeout_s)
        rep = report_path(output)
        got = wait_stable(lambda: [rep] if rep.exists() else [], timeout_s or self.timeout_s, settle_s=0.5)
        if got is None:
            raise NsysError(f"nsys stop --session={session} returned but {rep} did not appear")
        return rep

    def run_window(self, sessions: Sequence[str], out_dir: Path, window_s: float,
                   wait: Callable[[float], object], on_started: Callable[[float], None],
                   stop_timeout_s: float) -> tuple[dict[str, Path], list[str]]:
        """One capture window on several sessions: start each (``-o out_dir/<session>``), call
        ``on_started(time)``, ``wait(window_s)``, stop each. Returns ({session: report}, errors).
        A failed start cancels the sessions already started and raises NsysError. Starts and stops
        run side by side: ``nsys stop`` returns only once its report is written (seconds for a
        busy rank), so stopping one session after another gave the later ranks longer windows
        (measured on Megatron-LM PP=2: 3.5 s and 13.8 s for a 3 s window)."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, min(len(sessions), 16)),
                                thread_name_prefix="perfd-nsys") as pool:
            starts = {s: pool.submit(self.start, s, out_dir / s) for s in sessions}
            started = [s for s, f in starts.items() if f.exception() is None]
            failed = [f.exception() for f in starts.values() if f.exception() is not None]
            if failed:
                for s in started:
                    self.cancel(s)
                raise failed[0]  # type: ignore[misc]
            on_started(time.time())
            wait(window_s)
            stops = {s: pool.submit(self.stop, s, out_dir / s, stop_timeout_s) for s in started}
            reports: dict[str, Path] = {}
            errors: list[str] = []
            for s, f in stops.items():
                exc = f.exception()
                if exc is None:
                    reports[s] = f.result()
                elif isinstance(exc, NsysError):
                    errors.append(str(exc))
                else:
                    raise exc
        return reports, errors

    def cancel(self, session: str) -> None:
        """``nsys cancel --session=S`` (a window that must not be kept); errors are ignored."""
        with contextlib.suppress(NsysError, NsysNotFoundError):
            self._run(["cancel", f"--session={_check_session(session)}"])

    # -- step-aligned ranges ------------------------------------------------------------------
    def range_base(self, job: str, rank: int) -> Path | None:
        """Where rank ``rank`` of ``job`` writes its range reports (``<range_dir>/<job>/rank<r>``)."""
        if self.range_dir is None:
            return None
        return self.range_dir / session_name(job) / f"rank{int(rank)}"

    # -- analysis -----------------------------------------------------------------------------
    def export(self, report: str | Path) -> Path:
        """Export a report to SQLite next to it: the SQLite file."""
        from perfd.capture.nsys_sqlite import export_sqlite

        rep = Path(report)
        return export_sqlite(rep, rep.with_suffix(".sqlite"), nsys=self.nsys, timeout_s=self.export_timeout_s)


def report_path(output: str | Path) -> Path:
    """The report nsys writes for ``-o OUTPUT`` (it adds ``.nsys-rep`` unless already there)."""
    p = Path(output)
    return p if p.suffix in (".nsys-rep", ".qdrep") else p.with_name(p.name + ".nsys-rep")


def nsys_range_env(range_dir: str | Path, job: str) -> dict[str, str]:
    """Directory for a job's range reports, created; use with :func:`nsys_range_argv` as
    ``<dir>/rank%q{RANK}``."""
    d = Path(range_dir) / session_name(job)
    d.mkdir(parents=True, exist_ok=True)
    return {"PERFD_NSYS_RANGE_DIR": str(d)}


def first_event_epoch(sqlite_path: str | Path) -> float | None:
    """Wall time (epoch s) of the first kernel in an nsys export, when the export says when its
    session started (``TARGET_INFO_SESSION_START_TIME.utcEpochNs``; event times are ns from it)."""
    import sqlite3

    p = Path(sqlite_path)
    if not p.is_file():
        return None
    try:
        con = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        base = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        first = con.execute("SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        if base and first and base[0] is not None and first[0] is not None:
            return (int(base[0]) + int(first[0])) / 1e9
    except sqlite3.Error:
        return None
    finally:
        con.close()
    return None


def nsys_version(nsys: str | None = None, timeout_s: float = 30.0) -> str | None:
    """``nsys --version`` (first line), or None when it cannot be run."""
    try:
        exe = nsys or find_nsys()
        res = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=timeout_s,
                             check=False, env=dict(os.environ))
    except (OSError, subprocess.TimeoutExpired, NsysNotFoundError):
        return None
    return (res.stdout or res.stderr).strip().splitlines()[0] if (res.stdout or res.stderr).strip() else None
