"""How a job's environment asks PyTorch's Flight Recorder for what perfd reads: the variables, the
FIFO and dump file stems, and the framework defaults perfd sets first.

Shared by `perfd launch` (which sets the environment up) and collectors/nccl (which triggers and
reads the dumps where it points): a plain module below both, so neither imports the other.
"""

from __future__ import annotations

from pathlib import Path

PIPE_STEM = "frp_"
DUMP_STEM = "fr_dump_"


# Flight Recorder variables a framework fills from its own defaults once a dump path is in the
# environment (Megatron-LM core 0.20, megatron/training/initialize.py, sets each one not already
# set). perfd sets them first, to what perfd's collection needs, unless the user set them:
# name -> (perfd's value or None for the buffer size, why).
FRAMEWORK_DEFAULTS: dict[str, tuple[str | None, str]] = {
    "TORCH_INCLUDE_ONLY_ACTIVE": ("0", "Megatron-LM defaults it to 1: each dump then holds only the "
                                       "collectives in flight, and completed ones never reach perfd"),
    "TORCH_NCCL_TRACE_BUFFER_SIZE": (None, "Megatron-LM sets 2000 under this (older) name"),
    "TORCH_FR_BUFFER_SIZE": (None, "the current name of the ring size; both names set alike"),
    "TORCH_NCCL_DUMP_ON_TIMEOUT": ("1", "a NCCL watchdog timeout dumps the ring: the hang's evidence"),
    "TORCH_INCLUDE_STACK_TRACE": ("1", "hang reports name the Python frame that issued the collective"),
    "TORCH_NCCL_EXTRA_DUMP_ON_EXEC": ("0", "no extra dumps on exceptions beyond the ones perfd asks for"),
}


def framework_defaults(buffer_entries: int, user_env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The FRAMEWORK_DEFAULTS perfd sets (those the user did not set), and a note for each: what
    was set and why, or which user value was kept."""
    env: dict[str, str] = {}
    notes: list[str] = []
    for name, (value, why) in FRAMEWORK_DEFAULTS.items():
        want = str(buffer_entries) if value is None else value
        if name in user_env:
            notes.append(f"kept {name}={user_env[name]} from the environment (perfd would set {want}: {why})")
        else:
            env[name] = want
            notes.append(f"set {name}={want}: {why}")
    return env, notes


def env_for_flight_recorder(directory: str | Path, buffer_entries: int = 2000,
                            timing: bool = False) -> dict[str, str]:
    """Environment for the training job so that perfd can trigger and read Flight Recorder dumps.

    Sets both the current and the older variable names (torch renamed them across 2.5-2.8; unknown
    names are ignored). The buffer size is set explicitly because the pipe is only created when it
    is > 0 in the environment, whatever the built-in default.

    ``timing`` (``TORCH_NCCL_ENABLE_TIMING=1``) is opt-in: it fills ``duration_ms`` by recording a
    CUDA start event before every collective, and with ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (Megatron's
    setting for TP/SP overlap) that extra event can serialize communication behind compute and
    break the overlap (https://github.com/pytorch/pytorch/issues/143890). Never switch it on
    silently for Megatron jobs, and measure its cost on the job before leaving it on.
    """
    if buffer_entries <= 0:
        raise ValueError("buffer_entries must be > 0 (0 disables Flight Recorder and the pipe)")
    d = str(directory).rstrip("/")
    pipe, dump = f"{d}/{PIPE_STEM}", f"{d}/{DUMP_STEM}"
    env = {
        "TORCH_FR_BUFFER_SIZE": str(buffer_entries),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(buffer_entries),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": pipe,
        "TORCH_FR_DEBUG_INFO_PIPE_FILE": pipe,
        "TORCH_FR_DUMP_TEMP_FILE": dump,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump,
    }
    if timing:
        env["TORCH_NCCL_ENABLE_TIMING"] = "1"
    return env
