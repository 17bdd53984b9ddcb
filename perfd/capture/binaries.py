"""Where a capture tool's binary is: one lookup for nsys and ncu (each names its tool, its environment
variable, the install locations it knows and its error type). nsys's naming is here, beside the lookup:
both the executor (perfd.capture.nsys_exec, which a rank's `perfd nsys-exec` wrapper runs) and the
SQLite reader (perfd.capture.nsys_sqlite, which loads the timeline analysis) need it, and a wrapper that
only starts nsys must not load the analysis (0.1-0.2 s of CPU at every rank's start). ncu's is in
perfd.capture.ncu_exec, which loads no analysis."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path


def find_binary(name: str, env_var: str, known: Sequence[str], install: str, looked_for: str,
                error: type[Exception]) -> str:
    """``$env_var`` (it must be an executable file), else ``name`` on PATH, else the first executable
    of ``known`` (best first). Raises ``error`` saying how to fix it (``install``: what to install)."""
    env = os.environ.get(env_var)
    if env:
        if Path(env).is_file() and os.access(env, os.X_OK):
            return env
        raise error(f"{env_var}={env} is not an executable file")
    on_path = shutil.which(name)
    if on_path:
        return on_path
    for path in known:
        if Path(path).is_file() and os.access(path, os.X_OK):
            return path
    raise error(f"{name} not found: set {env_var}, put {name} on PATH, or install {install} "
                f"(looked for {looked_for})")


# Where nsys lives on the GPU test machines (not on PATH there; docs/design.md §3).
NSYS_FALLBACK = "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys"


class NsysNotFoundError(RuntimeError):
    pass


def find_nsys() -> str:
    """The nsys binary: $PERFD_NSYS, else ``nsys`` on PATH, else the known install location."""
    return find_binary("nsys", "PERFD_NSYS", [NSYS_FALLBACK], "Nsight Systems", NSYS_FALLBACK,
                       NsysNotFoundError)
