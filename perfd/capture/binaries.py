"""Where a capture tool's binary is: one lookup for nsys and ncu (each module names its tool, its
environment variable, the install locations it knows and its error type)."""

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
