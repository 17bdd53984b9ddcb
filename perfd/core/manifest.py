"""The `perfd launch` manifest: one JSON file saying what a launch set up, read by the agent
(``perfd agent --launch-manifest``: its ``job`` and ``collectors``) and by collectors/ranks (the
launched process: ``pid`` while ``status`` is running).

Written by perfd.app.launcher (``manifest_data`` fills the keys), read here: a plain module below both
the launcher and the collectors, so a collector never imports the launcher.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

MANIFEST_VERSION = 1
# The manifest's ``status``: rewritten from running to exited (with the exit code) when the job ends.
STATUS_RUNNING = "running"
STATUS_EXITED = "exited"


class FlightRecorderSetup(TypedDict):
    """Where the launched job's Flight Recorder dumps (perfd.core.flight_recorder_env)."""

    dir: str
    pipe_prefix: str
    dump_prefix: str
    timing: bool
    buffer_entries: int


class LaunchManifest(TypedDict):
    """What ``perfd launch`` writes (perfd.app.launcher.manifest_data)."""

    version: int
    job: str
    status: str  # STATUS_RUNNING, STATUS_EXITED (or "starting", before the child exists)
    pid: int | None  # the launched process
    uid: int  # the job's user
    launcher_pid: int
    started: float
    ended: float | None
    exit_code: int | None
    command: list[str]
    cwd: str
    env: dict[str, str]  # what perfd added to the environment
    env_keys: list[str]
    log: str
    run_dir: str
    flight_recorder: FlightRecorderSetup | None
    hook_socket: str
    kineto: dict[str, str | None] | None  # its KINETO_CONFIG
    nsys: dict[str, str] | None  # binary, session, trace
    ncu: dict[str, object] | None  # binary, ranks and the NcuOptions they run under
    notes: list[str]
    collectors: dict[str, dict[str, object]]  # collector -> the config the agent merges into its own
    wandb_run_id: str | None
    mfu_alert: bool


def write_manifest(path: Path, data: Mapping[str, object]) -> None:
    """Atomically (temporary file + rename): a reader never sees half a manifest."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def load_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a launch manifest; ValueError (with the reason) when it is unusable."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ValueError(f"{p}: cannot read: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        raise ValueError(f"{p}: not a perfd launch manifest (version {MANIFEST_VERSION})")
    if not isinstance(data.get("collectors"), dict) or not isinstance(data.get("job"), str):
        raise ValueError(f"{p}: manifest without 'job' or 'collectors'")
    return data
