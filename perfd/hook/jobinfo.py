"""What the step hook tells the agent about the job (``wire.KIND_JOB``): world size, parallel sizes
and training dtype, so that a job no log describes still has a layout and a peak for its MFU.

Sizes come from, in order: what the script named (``StepHook(layout={"tp": 2, ...})``), a device
mesh (``StepHook(mesh=...)``: a ``torch.distributed.device_mesh.DeviceMesh`` whose dimension names
say tp, pp, cp, ep, dp, or torchtitan's dp_replicate × dp_shard), and for the world size
``torch.distributed`` once initialised, else ``$WORLD_SIZE``. A size none of them gives stays
absent: never assumed to be 1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Protocol, runtime_checkable

from perfd.hook import wire
from perfd.hook.trace import can_trace

LAYOUT_KEYS = ("world_size", "tp", "pp", "dp", "cp", "ep")
# Device-mesh dimension names -> perfd's layout key. A data-parallel size split in two (HSDP:
# replicate × shard) multiplies back into dp.
_MESH_NAMES: dict[str, str] = {
    "tp": "tp", "tensor": "tp", "pp": "pp", "pipeline": "pp", "cp": "cp", "context": "cp",
    "ep": "ep", "expert": "ep", "dp": "dp", "data": "dp", "dp_replicate": "dp", "dp_shard": "dp",
    "fsdp": "dp", "ddp": "dp", "replicate": "dp", "shard": "dp",
}


class _MeshTensor(Protocol):
    @property
    def shape(self) -> Sequence[int]: ...


@runtime_checkable
class DeviceMesh(Protocol):
    """What the hook reads of a torch DeviceMesh: its dimensions' names and sizes (the shape of its
    tensor of ranks)."""

    @property
    def mesh_dim_names(self) -> Sequence[str] | None: ...

    @property
    def mesh(self) -> _MeshTensor: ...


def check_layout(layout: Mapping[str, int] | None) -> dict[str, int]:
    """The named sizes, validated at construction (a typo is an error there, not a silent drop)."""
    out: dict[str, int] = {}
    for key, value in (layout or {}).items():
        if key not in LAYOUT_KEYS:
            raise ValueError(f"layout: unknown key {key!r}; known: {list(LAYOUT_KEYS)}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"layout: {key} must be a positive int, got {value!r}")
        out[key] = value
    return out


def mesh_sizes(mesh: object) -> dict[str, int]:
    """Layout sizes a device mesh names (unknown dimension names are left out); {} for anything
    that is not a mesh with names."""
    try:
        if not isinstance(mesh, DeviceMesh):  # inside: reading an attribute may raise
            return {}
        names = tuple(mesh.mesh_dim_names or ())
        shape = tuple(int(x) for x in mesh.mesh.shape)
    except Exception:
        return {}
    out: dict[str, int] = {}
    for name, size in zip(names, shape, strict=False):
        key = _MESH_NAMES.get(str(name).lower())
        if key is not None:
            out[key] = out.get(key, 1) * size
    if names and len(names) == len(shape):
        total = 1
        for size in shape:
            total *= size
        out["world_size"] = total
    return out


def _world_size() -> int | None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:
        pass
    text = os.environ.get("WORLD_SIZE", "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def job_msg(rank: int, pid: int, dtype: str | None, layout: Mapping[str, int], mesh: DeviceMesh | None,
            flags: int = 0) -> wire.JobMsg:
    """The job record for this rank: named sizes win over the mesh, the mesh over the runtime;
    ``flags``: wire.JOB_FLAG_* (what the process can do for a capture)."""
    sizes: dict[str, int] = {**(mesh_sizes(mesh) if mesh is not None else {}), **layout}
    if "world_size" not in sizes:
        world = _world_size()
        if world is not None:
            sizes["world_size"] = world
    return wire.JobMsg(rank, pid, dtype=dtype, flags=flags, **{k: sizes.get(k) for k in LAYOUT_KEYS})


def hook_flags(timed_on_cuda: bool = False) -> int:
    """The job record's flags (wire.JOB_FLAG_*): whether this process polls the Kineto daemon itself
    (KINETO_USE_DAEMON set, as libkineto reads it), whether the hook can open a trace in it, and
    whether it has CUDA (``timed_on_cuda``: the hook times steps with CUDA events, so it has; else
    torch says, when it is imported; never imported here)."""
    flags = 0
    if os.environ.get("KINETO_USE_DAEMON", "").strip().lower() not in ("", "0", "false"):
        flags |= wire.JOB_FLAG_KINETO_DAEMON
    torch = sys.modules.get("torch")
    if can_trace(torch):
        flags |= wire.JOB_FLAG_CAN_TRACE
    flags |= wire.JOB_FLAG_CUDA if timed_on_cuda else cuda_flag(torch)
    return flags


def cuda_flag(torch: ModuleType | None) -> int:
    """JOB_FLAG_CUDA or JOB_FLAG_NO_CUDA as the process' torch says (0 without torch, or if it
    cannot say)."""
    if torch is None:
        return 0
    try:
        return wire.JOB_FLAG_CUDA if torch.cuda.is_available() else wire.JOB_FLAG_NO_CUDA
    except Exception:
        return 0


def current_device(torch: ModuleType | None) -> tuple[int, str | None]:
    """(index, UUID) of the CUDA device this thread uses, (-1, None) where none is known. Never
    initializes CUDA (a job that has not yet used it has no device to name): torch's own, or the one
    a job imported. The UUID as NVML spells it ("GPU-..."): torch gives the bare one."""
    torch = torch or sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return -1, None
        index = int(torch.cuda.current_device())
        uuid = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:
        return -1, None
    if not uuid:
        return index, None
    return index, uuid if uuid[:4].upper() in ("GPU-", "MIG-") else f"GPU-{uuid}"


def env_rank() -> int | None:
    """The global rank the launcher set before the process started (torchrun, SLURM, Open MPI,
    MPICH/PMI), None without one."""
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        try:
            return int(os.environ[var])
        except (KeyError, ValueError):
            continue
    return None


def dist_rank() -> int:
    """The rank ``torch.distributed`` gives once its process group is initialised (a distributed job
    has, by its first step: the model is wrapped before the loop), else 0: a single process."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return 0


def module_version(module: object) -> str | None:
    """A module's ``__version__`` where it has a text one (a trainer's, for the job record), else None."""
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) and version else None
