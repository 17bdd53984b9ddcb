"""How an offline command refuses what it was given: the checks of a log path and a GPU name, and the one
line a refusal prints (exit status 2). Every `perfd analyze ...` reads them here, below the commands."""

from __future__ import annotations

import sys


def refuse(message: str) -> int:
    """One line on stderr, exit status 2: how every refused input ends."""
    print(f"perfd: {message}", file=sys.stderr)
    return 2


def check_gpu(gpu: str | None, peak_override: float | None) -> str | None:
    """Why ``--gpu`` cannot be used (one line naming the closest known names and, for a short name
    like "H100", the variants it could mean), or None when it is known or an override makes the
    table unnecessary."""
    from perfd.analytics.steps.gpus import gpu_suggestions, lookup_gpu

    if gpu is None or peak_override is not None or lookup_gpu(gpu) is not None:
        return None
    closest, variants = gpu_suggestions(gpu)
    msg = f"unknown GPU {gpu!r} (--gpu takes the name NVML reports)"
    if variants:
        msg += f"; it could mean: {', '.join(repr(v) for v in variants)}"
    others = [c for c in closest if c not in variants]
    if others:
        msg += f"; closest known: {', '.join(repr(c) for c in others)}"
    return msg + "; or give --peak-tflops"


def check_log(path: str) -> str | None:
    """Why the log cannot be read (a directory, missing, not a file), or None."""
    from perfd.core.logfiles import LogFileError, check_log_path

    if path == "-":
        return None
    try:
        check_log_path(path)
    except LogFileError as exc:
        return str(exc)
    return None
