"""Agent configuration: a YAML file, then command-line overrides. Errors name the key."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from perfd.core import limits as L
from perfd.core.jobname import job_name_problem
from perfd.core.procinfo import user_id
from perfd.engine.subjects import COLLECTIVES_FOLDED_AT, DEFAULT_PARTITIONS
from perfd.transport.shard_routing import pick_aggregator


class ConfigError(ValueError):
    """A configuration problem, with the file and key it came from."""


# The job name of job-level data (a log, a hook socket) when no --job names it.
DEFAULT_JOB = "default"
# Collectors that read one job's own data. An agent running any of them serves a job (DEFAULT_JOB
# when not named); an agent running none (NVML, host, k8s, dcgm: a node DaemonSet) serves no job,
# and its GPU series belong to the job whose processes run on each GPU (docs/prometheus.md).
JOB_COLLECTORS = frozenset({"megatron", "sglang", "nccl", "hook"})
# The role part of a node agent's id (one that serves no job).
NODE_ROLE = "node"


@dataclass
class AgentConfig:
    agent_id: str = ""
    node: str = ""
    job: str = ""  # "": a node agent (no job-level collector), else the job it serves
    # The user the job runs as (a name or a uid): only its processes are the job's ranks (step hooks,
    # GPU processes declaring a rank, capture targets). None: the launch manifest's, else this agent's
    # own user (docs/security.md, "Whose processes are the job's").
    job_user: str | int | None = None
    aggregator: str | None = None  # host:port; None = local only (own /metrics, no streaming)
    # The distributed path instead of an aggregator (perfd.engine): the engine's servers
    # (nats://HOST:PORT, comma-separated), its token (a file), its CA, the partitions of its streams.
    engine: str | None = None
    engine_token_file: str | None = None
    engine_tls_ca: str | None = None
    engine_tls_cert: str | None = None  # a client certificate and its key: mutual TLS to the engine
    engine_tls_key: str | None = None
    engine_partitions: int = DEFAULT_PARTITIONS
    engine_collectives: str = COLLECTIVES_FOLDED_AT[0]  # where a hook job's operations are folded
    metrics_port: int | None = L.AGENT_METRICS_PORT  # None = no HTTP endpoint; 0 = ephemeral (tests)
    metrics_host: str = L.LOOPBACK  # loopback unless told (--metrics-host, --listen-all)
    spool_dir: str | None = None  # None = in memory (lost on restart; fine for demos and tests)
    # Where collectors' checkpoints are kept (a log tail's position): a restarted agent resumes
    # there instead of reading its logs again. Pair it with spool_dir (what was read but not yet
    # acknowledged is in the spool).
    state_dir: str | None = None
    spool_max_bytes: int = 256 * 1024 * 1024
    batch_interval_s: float = 0.5
    # Node samples forwarded to the aggregator: each series' newest value at most this often
    # (perfd.agent.reduce); every sample stays on the agent's /metrics. 0: every sample.
    aggregator_sample_interval_s: float = 2.0
    collectors: dict[str, dict[str, object]] = field(default_factory=dict)
    # Captures asked for by the aggregator (needs `aggregator`): where artifacts go, their quota,
    # and whether to serve the Kineto on-demand protocol (off where dynolog already does).
    captures: bool = True
    capture_dir: str | None = None  # default: capture_root()
    capture_quota_bytes: int = 2 * 1024**3
    kineto_daemon: bool = True
    # Serve Kineto on a file socket in this folder (the jobs set KINETO_IPC_SOCKET_DIR to it) rather
    # than the abstract name "dynolog", which is one per network namespace (a node, or a pod).
    kineto_socket_dir: str | None = None
    # Security (perfd.transport.security): the CA that signed the aggregator's certificate (TLS),
    # this agent's certificate and key (mutual TLS), and the shared bearer token.
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    auth_token_file: str | None = None
    # False: the jobs this agent describes opted out of the MFU alert (PerfdJobMFULow); the opt-out
    # travels in their job info (perfd.core.model.JobInfo.mfu_alert). --no-mfu-alert, or a launch manifest's.
    mfu_alert: bool = True

    @property
    def job_uid(self) -> int | None:
        """The uid whose processes are the job's: ``job_user``, else this agent's own when it serves a
        job; None for a node agent (no job: each GPU process is shown with the job it declares)."""
        uid = user_id(self.job_user)
        if uid is not None:
            return uid
        return os.geteuid() if self.job else None

    def capture_root(self) -> str | None:
        """``capture_dir``, else ``<state_dir>/captures``; None: the per-user default
        (perfd.capture.nsys_exec.default_capture_root). Never a shared /tmp name."""
        if self.capture_dir:
            return self.capture_dir
        return os.path.join(self.state_dir, "captures") if self.state_dir else None

    def finish(self) -> AgentConfig:
        """Fill defaults that depend on the machine, then validate."""
        if not self.node:
            self.node = socket.gethostname()
        if self.job and (problem := job_name_problem(self.job)):
            raise ConfigError(f"job {problem}")  # a config file's job: "" there is a node agent's
        if not self.job and set(self.collectors) & JOB_COLLECTORS:
            self.job = DEFAULT_JOB
        if not self.agent_id:
            # Stable across restarts (the aggregator's dedupe and the spool's sequence numbers line
            # up after an agent restart) and distinct for the two agents a node usually runs: the
            # node DaemonSet's ("<node>/node") and a job's sidecar ("<node>/<job>"). Two agents
            # with one id supersede each other's streams on the aggregator.
            self.agent_id = f"{self.node}/{self.job or NODE_ROLE}"
        if self.batch_interval_s <= 0:
            raise ConfigError(f"batch_interval_s must be > 0, got {self.batch_interval_s}")
        if self.spool_max_bytes < 1024 * 1024:
            raise ConfigError(f"spool_max_bytes must be at least 1 MiB, got {self.spool_max_bytes}")
        if self.aggregator is not None and "," in self.aggregator:
            # Several aggregators, sharded by job: every agent of the job picks the same one.
            try:
                # A node agent has no job to shard by: every node agent picks the DEFAULT_JOB shard.
                self.aggregator = pick_aggregator(self.job or DEFAULT_JOB, self.aggregator.split(","))
            except ValueError as exc:
                raise ConfigError(f"aggregator: {exc}") from exc
        if self.aggregator is not None:
            host, sep, port = self.aggregator.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(f"aggregator must be HOST:PORT, got {self.aggregator!r}")
        if self.engine is not None:
            if self.aggregator is not None:
                raise ConfigError("engine and aggregator: one or the other (the engine's shards and root "
                                  "stand for the aggregator)")
            urls = [u.strip() for u in self.engine.split(",") if u.strip()]
            bad = [u for u in urls if not u.startswith(("nats://", "tls://"))]
            if not urls or bad:
                raise ConfigError(f"engine must be nats://HOST:PORT[,...], got {self.engine!r}")
            if self.engine_partitions < 1:
                raise ConfigError(f"engine_partitions must be >= 1, got {self.engine_partitions}")
        if (self.engine_tls_cert is None) != (self.engine_tls_key is None):
            raise ConfigError("engine_tls_cert and engine_tls_key go together")
        if self.engine_tls_cert is not None and self.engine_tls_ca is None:
            raise ConfigError("engine_tls_cert needs engine_tls_ca (the CA that signed the engine's "
                              "certificates)")
        if self.engine_collectives not in COLLECTIVES_FOLDED_AT:
            raise ConfigError(f"engine_collectives must be one of {', '.join(COLLECTIVES_FOLDED_AT)}, got "
                              f"{self.engine_collectives!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert and tls_key go together")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ConfigError("tls_cert needs tls_ca (the CA that signed the aggregator's certificate)")
        for name, cfg in self.collectors.items():
            if not isinstance(cfg, dict):
                raise ConfigError(f"collectors.{name} must be a mapping, got {type(cfg).__name__}")
        try:
            user_id(self.job_user)
        except ValueError as exc:
            raise ConfigError(f"job_user: {exc}") from None
        return self


_TOP_KEYS = {f for f in AgentConfig.__dataclass_fields__}
_OPTIONAL_KEYS = ("aggregator", "engine", "engine_token_file", "engine_tls_ca", "engine_tls_cert",
                  "engine_tls_key", "metrics_port", "spool_dir", "state_dir", "capture_dir", "tls_ca",
                  "tls_cert", "tls_key", "auth_token_file", "kineto_socket_dir", "job_user")


def load_config(path: str | os.PathLike[str] | None) -> AgentConfig:
    """Read a YAML config file (or return defaults). Unknown keys are errors, not ignored."""
    cfg = AgentConfig()
    if path is None:
        return cfg
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if data is None:
        return cfg
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{p}: unknown keys {sorted(unknown)}; known: {sorted(_TOP_KEYS)}")
    for key, value in data.items():
        expected = type(getattr(cfg, key))
        if value is not None and key not in _OPTIONAL_KEYS and \
                not isinstance(value, expected) and not (expected is float and isinstance(value, int)):
            raise ConfigError(f"{p}: {key} must be {expected.__name__}, got {type(value).__name__}")
        setattr(cfg, key, value)
    return cfg


def apply_overrides(cfg: AgentConfig, *, aggregator: str | None = None, job: str | None = None,
                    megatron_log: str | None = None, nvml: str | None = None,
                    metrics_port: int | None = None, node: str | None = None,
                    agent_id: str | None = None, spool_dir: str | None = None, state_dir: str | None = None,
                    host: bool | None = None, launch_manifest: str | None = None,
                    ranks: bool | str | None = None,
                    metrics_host: str | None = None, listen_all: bool = False,
                    tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
                    auth_token_file: str | None = None, capture_dir: str | None = None,
                    job_user: str | None = None, mfu_alert: bool | None = None,
                    engine: str | None = None, engine_token_file: str | None = None,
                    engine_partitions: int | None = None, engine_collectives: str | None = None
                    ) -> AgentConfig:
    """Command-line flags win over the file (so a job can be watched without a config file).

    ``launch_manifest``: a `perfd launch` manifest; its job name (unless ``job`` is given) and the
    collectors that read what the launch set up (megatron on its log, nccl on its Flight Recorder
    dumps, hook on its socket). Its paths win over the file's; the file's other keys (intervals,
    thresholds) stay.
    """
    if job_user is not None:
        cfg.job_user = job_user
    if launch_manifest is not None:
        _apply_manifest(cfg, launch_manifest)
    if mfu_alert is not None:
        cfg.mfu_alert = mfu_alert
    if aggregator is not None:
        cfg.aggregator = aggregator or None
    if engine is not None:
        cfg.engine = engine or None
    if engine_token_file is not None:
        cfg.engine_token_file = engine_token_file
    if engine_partitions is not None:
        cfg.engine_partitions = engine_partitions
    if engine_collectives is not None:
        cfg.engine_collectives = engine_collectives
    if job is not None:
        problem = job_name_problem(job)
        if problem:
            raise ConfigError(f"--job {problem}")
        if launch_manifest is not None and job != cfg.job and "hook" in cfg.collectors:
            # the job renamed here: the launch's processes still declare the launch's name
            cfg.collectors["hook"].update(require_declared_job=False, refuse_other_jobs=False)
        cfg.job = job
        if launch_manifest is None:
            # An agent told its job listens for that job's step hooks (where a hook of this user sends
            # by default, or the config's socket): a hooked script beside `perfd agent --job X` once
            # found no socket, and its hook said nothing.
            cfg.collectors.setdefault("hook", {})
    if node is not None:
        cfg.node = node
    if agent_id is not None:
        cfg.agent_id = agent_id
    if spool_dir is not None:
        cfg.spool_dir = spool_dir
    if state_dir is not None:
        cfg.state_dir = state_dir
    if metrics_host is not None:
        cfg.metrics_host = metrics_host
    elif listen_all:
        cfg.metrics_host = "0.0.0.0"
    for key, val in (("tls_ca", tls_ca), ("tls_cert", tls_cert), ("tls_key", tls_key),
                     ("auth_token_file", auth_token_file), ("capture_dir", capture_dir)):
        if val is not None:
            setattr(cfg, key, val)
    if metrics_port is not None:
        cfg.metrics_port = metrics_port if metrics_port >= 0 else None
    if megatron_log is not None:
        cfg.collectors.setdefault("megatron", {})["path"] = megatron_log
    if nvml is not None:
        if nvml == "off":
            cfg.collectors.pop("nvml", None)
        elif nvml == "real" or nvml.startswith("replay:"):
            cfg.collectors.setdefault("nvml", {})["source"] = nvml
        else:
            raise ConfigError(f"--nvml must be real, replay:FILE or off, got {nvml!r}")
    elif "nvml" not in cfg.collectors:
        cfg.collectors["nvml"] = {"source": "real"}
    if host is not None:
        if host:
            cfg.collectors.setdefault("host", {})
        else:
            cfg.collectors.pop("host", None)
    elif "host" not in cfg.collectors:
        cfg.collectors["host"] = {}
    # The job's rank processes (collectors/ranks): on by default, like host; cheap with none to follow.
    # "pod": also those of the agent's own pod (a job's sidecar: collectors/ranks, pod).
    if ranks is not None:
        if ranks:
            cfg.collectors.setdefault("ranks", {})
            if ranks == "pod":
                cfg.collectors["ranks"]["pod"] = True
        else:
            cfg.collectors.pop("ranks", None)
    elif "ranks" not in cfg.collectors:
        cfg.collectors["ranks"] = {}
    return cfg.finish()


def _apply_manifest(cfg: AgentConfig, path: str) -> None:
    from perfd.core.manifest import load_manifest

    try:
        m = load_manifest(path)
    except ValueError as exc:
        raise ConfigError(f"--launch-manifest: {exc}") from exc
    problem = job_name_problem(m["job"])
    if problem:
        raise ConfigError(f"--launch-manifest {path}: its job {problem}")
    cfg.job = m["job"]
    uid = m.get("uid")
    if isinstance(uid, int) and not isinstance(uid, bool) and uid >= 0 and cfg.job_user is None:
        cfg.job_user = uid  # the launching user (a config's job_user, or --job-user, wins)
    if m.get("mfu_alert") is False:
        cfg.mfu_alert = False  # perfd launch --no-mfu-alert: the job's own opt-out
    for name, conf in m["collectors"].items():
        if not isinstance(conf, dict):
            raise ConfigError(f"--launch-manifest {path}: collectors.{name} must be a mapping")
        _deep_merge(cfg.collectors.setdefault(name, {}), conf)
    if "hook" in cfg.collectors:  # the launch's processes carry PERFD_JOB: a hooked process without it
        cfg.collectors["hook"].setdefault("require_declared_job", True)  # is no part of this job


def _deep_merge(into: dict[str, object], new: dict[str, object]) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(old := into.get(k), dict):
            _deep_merge(old, v)
        else:
            into[k] = v
