"""Capture artifacts on disk under a size quota: one folder and one JSON manifest per capture.

Layout: ``<root>/<capture id>/manifest.json`` plus the capture's artifacts (traces, reports,
exports) in the same folder. The manifest (docs/design.md §5 "Capture") holds::

    id, job, ranks, tool, mode, steps {start, count[, kineto {iterations_per_step, start, roundup,
    count}]} or window {start_ms, duration_ms},
    status ok | failed | timeout | skipped | running, reason,
    artifacts [{name, path, bytes, kind, rank, pid, pruned}],
    analysis {rank: CaptureAnalysis JSON},
    timings {requested_at, started_at, first_event_at, trace_ready_at, finished_at} (epoch s),
    latency_s (requested → started), args, context, pids {rank: pid}

The quota counts artifact bytes (manifests are small and always kept). Before a capture starts,
:meth:`CaptureStore.check_quota` refuses when the store is already at its quota; after it finishes,
:meth:`CaptureStore.prune` deletes the artifacts of the oldest finished captures (their manifests
stay, the artifacts marked ``pruned``) until the total is within the quota again.

The root is a private directory (:mod:`perfd.core.privdir`): owned by the agent's user, mode 0700, not a
symbolic link, made race-free; another user's folder is refused. Pruning works through directory
descriptors and never follows a link: a capture folder that is a link, or a link inside one, is
removed as a link (what it points to is left alone).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NotRequired, Required, TypedDict, cast

from perfd.core.privdir import open_private_dir, private_dir, rmtree_at

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STATUSES = ("running", "ok", "failed", "timeout", "skipped")
_ID_RE = re.compile(r"^c[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class CaptureStoreError(ValueError):
    pass


class Timings(TypedDict, total=False):
    """When each stage of a capture happened (epoch s; None: not yet, or never)."""

    requested_at: Required[float]
    started_at: float | None
    first_event_at: float | None
    trace_ready_at: float | None
    finished_at: float | None
    range_closed_at: float  # a hook range's last rank closed it (ncu)


class Artifact(TypedDict):
    name: str
    path: str
    bytes: int
    kind: str  # kineto_trace, nsys_report, nsys_sqlite, ncu_report, ncu_<page>_csv
    rank: int | None
    pid: int | None
    pruned: bool  # deleted to keep the store within its quota (the entry stays)


class KinetoSpan(TypedDict):
    """What a Kineto on-demand config asked for, in Kineto's iterations (optimizer steps it counts)."""

    iterations_per_step: int  # in one training step (perfd.core.model.kineto_iterations_per_step)
    start: int | None  # PROFILE_START_ITERATION (None: the next one)
    roundup: int  # PROFILE_START_ITERATION_ROUNDUP
    count: int  # ACTIVITIES_ITERATIONS


class StepSpan(TypedDict):
    start: int | None  # None: the next iteration
    count: int
    # A Kineto capture of a job whose framework says how many iterations Kineto counts in a training
    # step: the span in Kineto's units as the config asked (start and count above are training steps)
    kineto: NotRequired[KinetoSpan]


class Manifest(TypedDict, total=False):
    """A capture's manifest (the module docstring). The keys after the required ones are given when it
    is made (:meth:`CaptureStore.new_capture`), then set by the tool that runs it, where they apply."""

    id: Required[str]
    job: Required[str]
    ranks: Required[list[int]]
    tool: Required[str]
    status: Required[str]  # one of STATUSES
    reason: Required[str | None]
    artifacts: Required[list[Artifact]]
    # rank (nsys: session) -> its analysis as JSON ({"error": ...} when it failed), in each tool's shape:
    # read whole by the capture's events and by people, never by key here
    analysis: Required[dict[str, dict[str, Any]]]
    timings: Required[Timings]
    latency_s: Required[float | None]  # requested -> started
    dir: Required[str]
    pids: dict[str, int]  # rank -> its process
    args: dict[str, str]  # the command's arguments, as sent
    context: dict[str, str]  # why it was asked for (the rule, when it fired)
    ignored_args: list[str]
    command_id: str
    steps: StepSpan
    mode: str  # how it ran: range, session, on-demand, hook trace
    traced_by: str
    config: str  # the Kineto config handed out
    answered_at: dict[str, float]  # rank -> when its process took the config
    ncu: dict[str, dict[str, object]]  # rank -> its NcuTarget JSON
    range: dict[str, dict[str, object]]  # rank -> its hook range's last state, step and time
    range_overran: bool
    range_held_s: float
    sessions: list[str]  # nsys sessions
    scope: str
    latency_from_firing_s: float  # the rule's firing -> started
    pruned_at: float


def safe_name(text: str, limit: int = 64) -> str:
    """A file-name-safe spelling of ``text`` (job names come from configs and commands)."""
    out = _SAFE.sub("_", text).strip("._")[:limit]
    return out or "_"


def _now() -> float:
    return time.time()


class CaptureStore:
    """Thread-safe: captures run in worker threads and the API lists them from another."""

    def __init__(self, root: str | Path, quota_bytes: int, clock: Callable[[], float] = _now) -> None:
        if quota_bytes <= 0:
            raise ValueError("quota_bytes must be > 0")
        # Checked (ours, 0700, no link) before anything is resolved or written under it.
        self.root = private_dir(root).resolve()
        self.quota_bytes = int(quota_bytes)
        self.clock = clock
        self._lock = threading.RLock()
        self.prune_refusals = 0  # prunes refused because the root no longer passed its checks

    # -- paths --------------------------------------------------------------------------------
    def capture_dir(self, capture_id: str) -> Path:
        if not _ID_RE.match(capture_id):
            raise CaptureStoreError(f"not a capture id: {capture_id!r}")
        return self.root / capture_id

    def inside(self, path: str | Path) -> Path:
        """``path`` resolved, if it lies under the store root; CaptureStoreError otherwise."""
        p = Path(path)
        resolved = (p if p.is_absolute() else self.root / p).resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise CaptureStoreError(f"{path} is outside the capture store {self.root}")
        return resolved

    # -- quota --------------------------------------------------------------------------------
    def used_bytes(self) -> int:
        """Bytes of every file in the store except manifests (what the quota counts)."""
        total = 0
        with self._lock:
            for dirpath, _dirs, files in os.walk(self.root):
                for f in files:
                    if f == MANIFEST:
                        continue
                    with contextlib.suppress(OSError):
                        total += os.lstat(os.path.join(dirpath, f)).st_size
        return total

    def check_quota(self, estimate_bytes: int = 0) -> str | None:
        """None when a capture may start, else the reason it may not."""
        used = self.used_bytes()
        if used + max(0, estimate_bytes) > self.quota_bytes or used >= self.quota_bytes:
            return (f"quota: capture store {self.root} holds {used} bytes of its "
                    f"{self.quota_bytes}-byte quota"
                    + (f" (+{estimate_bytes} expected)" if estimate_bytes else ""))
        return None

    # -- manifests ----------------------------------------------------------------------------
    def new_capture(self, job: str, ranks: Iterable[int], tool: str, *, pids: dict[str, int] | None = None,
                    args: dict[str, str] | None = None, context: dict[str, str] | None = None,
                    ignored_args: list[str] | None = None, command_id: str | None = None,
                    steps: StepSpan | None = None) -> Manifest:
        """Create the folder and a ``running`` manifest; returns the manifest (the keywords given
        are its keys of the same names)."""
        with self._lock:
            for _ in range(10):
                cid = time.strftime("c%Y%m%d-%H%M%S-", time.gmtime(self.clock())) + secrets.token_hex(3)
                d = self.root / cid
                try:
                    d.mkdir()
                    break
                except FileExistsError:
                    continue
            else:
                raise CaptureStoreError("could not allocate a capture id")
            manifest: Manifest = {
                "id": cid, "job": job, "ranks": sorted(set(ranks)), "tool": tool, "status": "running",
                "reason": None, "artifacts": [], "analysis": {},
                "timings": {"requested_at": self.clock(), "started_at": None, "first_event_at": None,
                            "trace_ready_at": None, "finished_at": None},
                "latency_s": None, "dir": str(d),
            }
            if pids is not None:
                manifest["pids"] = pids
            if args is not None:
                manifest["args"] = args
            if context is not None:
                manifest["context"] = context
            if ignored_args is not None:
                manifest["ignored_args"] = ignored_args
            if command_id is not None:
                manifest["command_id"] = command_id
            if steps is not None:
                manifest["steps"] = steps
            self.write(manifest)
            return manifest

    def write(self, manifest: Manifest) -> None:
        """Write a manifest atomically (a reader never sees half of one)."""
        d = self.capture_dir(str(manifest["id"]))
        tmp = d / f".{MANIFEST}.{os.getpid()}.{threading.get_ident()}.tmp"
        with self._lock:
            tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str))
            tmp.replace(d / MANIFEST)

    def read(self, capture_id: str) -> Manifest:
        data = json.loads((self.capture_dir(capture_id) / MANIFEST).read_text())
        if not isinstance(data, dict):
            raise CaptureStoreError(f"{capture_id}: manifest is not an object")
        return cast(Manifest, data)  # the store's own file, as :meth:`write` wrote it

    def add_artifact(self, manifest: Manifest, path: str | Path, kind: str,
                     rank: int | None = None, pid: int | None = None) -> Artifact:
        """Record a file (it must lie under the store) in the manifest (not written yet)."""
        p = self.inside(path)
        entry: Artifact = {"name": p.name, "path": str(p), "bytes": p.stat().st_size if p.exists() else 0,
                 "kind": kind, "rank": rank, "pid": pid, "pruned": False}
        arts = manifest.setdefault("artifacts", [])
        arts[:] = [a for a in arts if a.get("path") != entry["path"]] + [entry]
        return entry

    def finish(self, manifest: Manifest, status: str, reason: str | None = None) -> Manifest:
        """Set the final status, refresh artifact sizes, write, and prune to the quota."""
        if status not in STATUSES or status == "running":
            raise ValueError(f"final status must be one of ok, failed, timeout, skipped; not {status!r}")
        manifest["status"] = status
        manifest["reason"] = reason
        manifest["timings"]["finished_at"] = self.clock()
        for a in manifest.get("artifacts", []):
            with contextlib.suppress(OSError):
                if not a.get("pruned"):
                    a["bytes"] = Path(a["path"]).stat().st_size
        self.write(manifest)
        self.prune()
        with contextlib.suppress(CaptureStoreError, OSError, ValueError):
            return self.read(str(manifest["id"]))  # prune may have marked its artifacts
        return manifest

    def prune(self) -> list[str]:
        """Delete artifacts of the oldest finished captures until the store fits its quota.

        Manifests are kept (artifacts marked ``pruned``); running captures are never touched.
        Returns the ids whose artifacts were deleted.
        """
        pruned: list[str] = []
        with self._lock:
            used = self.used_bytes()
            if used <= self.quota_bytes:
                return pruned
            finished = [m for m in self.list() if m.get("status") != "running"]
            finished.sort(key=lambda m: ((m.get("timings") or {}).get("finished_at") or 0.0, m["id"]))
            try:
                root_fd = open_private_dir(self.root, create=False)  # the root checked again, then held
            except OSError as exc:  # swapped or gone since start-up: delete nothing, say why
                self.prune_refusals += 1
                log.error("capture store %s: not pruned: %s", self.root, exc)
                return pruned
            try:
                for m in finished:
                    if used <= self.quota_bytes:
                        break
                    freed = _empty_capture_dir(root_fd, str(m["id"]))
                    if not freed:
                        continue
                    for a in m.get("artifacts", []):
                        a["pruned"] = True
                    m["pruned_at"] = self.clock()
                    self.write(m)
                    used -= freed
                    pruned.append(m["id"])
            finally:
                os.close(root_fd)
        return pruned


    def list(self, job: str | None = None, limit: int | None = None) -> list[Manifest]:
        """Manifests, newest first (by requested time)."""
        out = []
        with self._lock:
            for d in self.root.iterdir():
                if not _ID_RE.match(d.name) or d.is_symlink():
                    continue  # a link is no capture folder of ours: not read, not pruned
                try:
                    m = self.read(d.name)
                except (OSError, ValueError):
                    continue
                if job is None or m.get("job") == job:
                    out.append(m)
        out.sort(key=lambda m: (m.get("timings") or {}).get("requested_at") or 0.0, reverse=True)
        return out[:limit] if limit is not None else out

def _empty_capture_dir(root_fd: int, capture_id: str) -> int:
    """Delete everything in one capture folder but its manifest; bytes freed. The folder is opened
    through the root's descriptor without following a link: a link is refused, not entered."""
    try:
        fd = os.open(capture_id, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
    except OSError:
        return 0  # gone, or a link or file where a folder should be: nothing of ours to free
    freed = 0
    try:
        for entry in sorted(os.scandir(fd), key=lambda e: e.name):
            if entry.name == MANIFEST or entry.name.startswith(f".{MANIFEST}"):
                continue
            with contextlib.suppress(OSError):
                st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                freed += rmtree_at(fd, entry.name) if stat.S_ISDIR(st.st_mode) else st.st_size
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    return freed
