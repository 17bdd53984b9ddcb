"""The hook collector's configuration (agent YAML ``collectors.hook``): where its socket is, who may send,
its queue's bounds, and whose records it takes (by the job each sender declares)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from perfd.collectors.config_values import as_int
from perfd.core.limits import HOOK_QUEUE_MAX, HOOK_QUEUE_MAX_BYTES
from perfd.core.procinfo import user_id
from perfd.hook import wire


@dataclass
class HookConfig:
    socket_path: str = field(default_factory=wire.default_socket_path)
    job: str = ""
    mode: int = 0o660  # who may send: the job must run as the agent's user or group (else 0o666)
    rcvbuf_bytes: int = 1 << 20
    max_records_per_collect: int = 100_000
    max_queued: int = HOOK_QUEUE_MAX  # received, not yet collected; beyond: oldest dropped, counted
    max_queued_bytes: int = HOOK_QUEUE_MAX_BYTES  # ... and their bytes
    include_warmup: bool = True
    job_user: int | None = None  # the uid whose processes are the job's (None: the agent's own)
    # Whose records are the job's by what each sender's environment declares (PERFD_JOB): with
    # refuse_other_jobs a process declaring another job is refused (an agent serving a named job);
    # with require_declared_job one declaring none too (a perfd launch's agent: a hooked script run
    # without the launch once had its steps merged into the launched job's run).
    refuse_other_jobs: bool = False
    require_declared_job: bool = False

    @classmethod
    def from_dict(cls, cfg: Mapping[str, object]) -> HookConfig:
        known = {"socket_path", "job", "mode", "rcvbuf_bytes", "max_records_per_collect", "max_queued",
                 "max_queued_bytes", "include_warmup", "job_user", "refuse_other_jobs",
                 "require_declared_job"}
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"hook: unknown config key(s) {sorted(unknown)}; known: {sorted(known)}")
        mode = cfg.get("mode", 0o660)
        if isinstance(mode, str):
            mode = int(mode, 8)
        if not isinstance(mode, int) or not 0 <= mode <= 0o777:
            raise ValueError(f"hook: mode must be an octal permission like 0660, not {mode!r}")
        out = cls(socket_path=str(cfg.get("socket_path", wire.socket_path_from_env())),
                  job=str(cfg.get("job", "")), mode=mode,
                  rcvbuf_bytes=as_int(cfg.get("rcvbuf_bytes", 1 << 20)),
                  max_records_per_collect=as_int(cfg.get("max_records_per_collect", 100_000)),
                  max_queued=as_int(cfg.get("max_queued", HOOK_QUEUE_MAX)),
                  max_queued_bytes=as_int(cfg.get("max_queued_bytes", HOOK_QUEUE_MAX_BYTES)),
                  include_warmup=bool(cfg.get("include_warmup", True)),
                  job_user=user_id(cfg.get("job_user")),
                  refuse_other_jobs=bool(cfg.get("refuse_other_jobs", False)),
                  require_declared_job=bool(cfg.get("require_declared_job", False)))
        if min(out.rcvbuf_bytes, out.max_records_per_collect, out.max_queued, out.max_queued_bytes) <= 0:
            raise ValueError("hook: rcvbuf_bytes, max_records_per_collect, max_queued and max_queued_bytes "
                             "must be > 0")
        return out
