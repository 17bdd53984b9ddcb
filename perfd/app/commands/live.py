"""`perfd agent`, `perfd aggregator`, `perfd record nvml`: argument parsing and start-up."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from perfd.aggregator.loops import EVENT_LOOPS
from perfd.aggregator.runtime import SWITCH_INTERVAL_S
from perfd.aggregator.state_store import DEFAULT_MAX_BYTES as DEFAULT_STATE_BYTES
from perfd.app.commands.engine import add_engine_arguments
from perfd.core import limits as L
from perfd.core.shared_thresholds import STALL_PHASE_MAX_S
from perfd.exporters.remote_write import DEFAULT_INTERVAL_S, TENANT_HEADER, Credentials, CredentialsError

if TYPE_CHECKING:
    from collections.abc import Callable

    from perfd.agent.config import AgentConfig
    from perfd.aggregator.daemon import AggregatorConfig

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


def _agent(args: argparse.Namespace, run: Callable[[AgentConfig, str | None], int] | None = None) -> int:
    """``run``: what runs the configuration made of ``args`` (run_agent unless given: tests run it in
    their own process, tests/inproc.py)."""
    from perfd.agent.config import ConfigError, apply_overrides, load_config

    try:
        cfg = apply_overrides(
            load_config(args.config), aggregator=args.aggregator, job=args.job,
            megatron_log=args.megatron_log, nvml=args.nvml, metrics_port=args.metrics_port,
            node=args.node, agent_id=args.agent_id, spool_dir=args.spool_dir, state_dir=args.state_dir,
            host=None if args.host is None else args.host == "on",
            ranks=None if args.ranks is None else "pod" if args.ranks == "pod" else args.ranks == "on",
            launch_manifest=args.launch_manifest, metrics_host=args.metrics_host,
            listen_all=args.listen_all, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
            auth_token_file=args.auth_token_file, capture_dir=args.capture_dir, job_user=args.job_user,
            mfu_alert=False if args.no_mfu_alert else None, engine=args.engine,
            engine_token_file=args.engine_token_file,
            engine_partitions=args.engine_partitions if args.engine else None,
            engine_collectives=args.engine_collectives)
        for key in ("engine_tls_ca", "engine_tls_cert", "engine_tls_key"):
            if getattr(args, key):
                setattr(cfg, key, getattr(args, key))
        cfg.finish()
    except ConfigError as exc:
        print(f"perfd agent: configuration error: {exc}", file=sys.stderr)
        return 2
    if cfg.engine_token_file:  # read when the engine starts, inside the run: checked before it
        from perfd.transport.security import SecurityConfigError, check_secret_file_mode

        try:
            check_secret_file_mode(cfg.engine_token_file, "engine token file")
        except SecurityConfigError as exc:
            print(f"perfd agent: {exc}", file=sys.stderr)
            return 2
    if run is None:
        from perfd.agent.node_agent import run_agent

        run = run_agent
    return run(cfg, args.ready_file)


def _aggregator(args: argparse.Namespace,
                run: Callable[[AggregatorConfig, str | None], int] | None = None) -> int:
    """``run``: what runs the configuration made of ``args`` (run_aggregator unless given: tests run it
    in their own process, tests/inproc.py)."""
    from perfd.aggregator.collectives import collective_configs
    from perfd.aggregator.runtime import grpc_experiments

    grpc_experiments()  # before grpc is imported (the next line): its core reads it once
    from perfd.aggregator.daemon import AggregatorConfig, run_aggregator
    run = run if run is not None else run_aggregator

    try:
        coll, coll_jobs = collective_configs(args.inter_node_link, args.inter_node_busbw_gbs or (),
                                             args.intra_node_busbw_gbs or ())
    except ValueError as exc:
        print(f"perfd aggregator: {exc}", file=sys.stderr)
        return 2
    if (args.tls_cert is None) != (args.tls_key is None) or (args.tls_client_ca and not args.tls_cert):
        print("perfd aggregator: --tls-cert and --tls-key go together; --tls-client-ca needs both",
              file=sys.stderr)
        return 2
    labels: dict[str, str] = {}
    for item in args.remote_write_label:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            print(f"perfd aggregator: --remote-write-label wants NAME=VALUE, got {item!r}", file=sys.stderr)
            return 2
        labels[name.strip()] = value
    if not 0 < args.gil_switch_ms <= 1000:
        print("perfd aggregator: --gil-switch-ms must be > 0 and at most 1000", file=sys.stderr)
        return 2
    if args.remote_write_interval <= 0:
        print("perfd aggregator: --remote-write-interval must be > 0 seconds", file=sys.stderr)
        return 2
    rw_options = (args.remote_write_tenant, args.remote_write_header, args.remote_write_bearer_token_file,
                  args.remote_write_basic_auth_user, args.remote_write_basic_auth_password_file,
                  args.remote_write_ca_file)
    if any(rw_options) and not args.remote_write:
        print("perfd aggregator: the --remote-write-* options need a --remote-write URL", file=sys.stderr)
        return 2
    if args.remote_write and importlib.util.find_spec("cramjam") is None:
        print("perfd aggregator: --remote-write needs cramjam (snappy): pip install 'perfd[remote-write]'",
              file=sys.stderr)
        return 2
    try:
        credentials = Credentials.of(*rw_options)
    except CredentialsError as exc:
        print(f"perfd aggregator: {exc}", file=sys.stderr)
        return 2
    if args.wandb_project and importlib.util.find_spec("wandb") is None:
        # Refused here, not at the first export round: the export runs every --wandb-interval and
        # would log the same ModuleNotFoundError every round for the life of the aggregator.
        print("perfd aggregator: --wandb-project needs the wandb package, which is not installed: "
              "pip install 'perfd[wandb]' (or drop --wandb-project)", file=sys.stderr)
        return 2
    wandb_dir = args.wandb_dir
    if args.wandb_project:
        # Checked here too: a directory W&B cannot write (a read-only root filesystem under a
        # relative default) failed at every export round, with a traceback each time.
        from perfd.exporters.wandb import default_directory, directory_problem

        wandb_dir = wandb_dir or default_directory(args.state_dir)
        problem = directory_problem(wandb_dir)
        if problem is not None:
            given = "" if args.wandb_dir else " (the default: --state-dir DIR/wandb, else ./perfd-wandb)"
            print(f"perfd aggregator: cannot write W&B runs under {wandb_dir}{given}: {problem}; "
                  "give a writable directory with --wandb-dir DIR", file=sys.stderr)
            return 2
    from perfd.app.commands.peak_args import check_peak_tflops

    why = check_peak_tflops(args.peak_tflops)
    if why:
        print(f"perfd aggregator: {why}", file=sys.stderr)
        return 2
    every = L.ALL_INTERFACES if args.listen_all else L.LOOPBACK
    for flag, v in (("--max-jobs-per-agent", args.max_jobs_per_agent),
                    ("--max-series-per-identity", args.max_series_per_identity),
                    ("--job-retention", args.job_retention), ("--agent-retention", args.agent_retention)):
        if v <= 0:
            print(f"perfd aggregator: {flag} must be > 0", file=sys.stderr)
            return 2
    limits = L.Limits(max_message_bytes=args.max_message_bytes, max_jobs=args.max_jobs,
                      max_jobs_per_agent=args.max_jobs_per_agent, job_retention_s=args.job_retention,
                      agent_retention_s=args.agent_retention, max_series_per_agent=args.max_series_per_agent,
                      max_series=args.max_series, max_series_per_identity=args.max_series_per_identity,
                      max_capture_steps=args.max_capture_steps,
                      capture_requests_per_job=args.capture_requests_per_job)
    from perfd.app.commands.engine import engine_config

    engine = engine_config(args, "perfd aggregator")
    if engine is not None:
        import importlib.util as iu

        if iu.find_spec("nats") is None:
            print("perfd aggregator: --engine needs nats-py: pip install 'perfd[engine]'", file=sys.stderr)
            return 2
    adv = args.engine_advertise_http
    if adv is not None and (engine is None or urlparse(adv).scheme not in ("http", "https")
                            or not urlparse(adv).netloc):
        print("perfd aggregator: --engine-advertise-http takes http(s)://HOST:PORT and needs --engine "
              f"(got {adv!r}{'' if engine is not None else ', no --engine'})", file=sys.stderr)
        return 2
    if args.engine_job is not None and (engine is None or not args.engine_job.strip()):
        print("perfd aggregator: --engine-job takes a job's name and needs --engine "
              f"(got {args.engine_job!r}{'' if engine is not None else ', no --engine'})", file=sys.stderr)
        return 2
    cfg = AggregatorConfig(collectives=coll, collectives_per_job=coll_jobs,
                           grpc_host=args.grpc_host or every, grpc_port=args.grpc_port,
                           http_host=args.http_host or every, http_port=args.http_port, gpu=args.gpu,
                           tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca,
                           auth_token_file=args.auth_token_file, identity_policy=args.identity_policy,
                           limits=limits,
                           peak_tflops=args.peak_tflops,
                           rules_files=[] if args.no_rules else args.rules,
                           rules_interval_s=args.rules_interval, state_dir=args.state_dir,
                           state_max_bytes=int(args.state_max_mib * (1 << 20)),
                           event_loop=args.event_loop, switch_interval_s=args.gil_switch_ms / 1e3,
                           per_rank_series=not args.no_rank_series,
                           export_node_series=args.export_node_series,
                           wandb_project=args.wandb_project, wandb_mode=args.wandb_mode,
                           wandb_dir=wandb_dir, wandb_interval_s=args.wandb_interval,
                           job_stale_after_s=args.job_stale_after,
                           stall_phase_max_s=args.stall_phase_max,
                           max_iterations_per_job=args.retain_iterations,
                           max_bytes_per_job=int(args.retain_mib * (1 << 20)),
                           remote_write=args.remote_write or [],
                           remote_write_interval_s=args.remote_write_interval,
                           remote_write_labels=labels, remote_write_credentials=credentials,
                           engine=engine,
                           engine_replicas=args.engine_replicas, engine_root_id=args.engine_root_id,
                           engine_advertise_http=args.engine_advertise_http, engine_job=args.engine_job)
    if args.job_stale_after is not None and args.job_stale_after <= 0:
        print("perfd aggregator: --job-stale-after must be > 0 seconds", file=sys.stderr)
        return 2
    if not args.stall_phase_max > 0:
        print("perfd aggregator: --stall-phase-max must be > 0 seconds", file=sys.stderr)
        return 2
    if not args.state_max_mib > 0:
        print("perfd aggregator: --state-max-mib must be > 0", file=sys.stderr)
        return 2
    if args.retain_iterations < 1 or not args.retain_mib > 0:
        print("perfd aggregator: --retain-iterations must be >= 1 and --retain-mib > 0", file=sys.stderr)
        return 2
    return run(cfg, args.ready_file)


def _demo(args: argparse.Namespace) -> int:
    from perfd.app.demo.run import run_demo

    return run_demo(args)


def _rules_check(args: argparse.Namespace) -> int:
    from perfd.rules.check_command import run_rules_check

    return run_rules_check(args.files)


def register(sub: SubParsers) -> None:
    a = sub.add_parser("agent", help="run the per-node agent")
    a.add_argument("--config", help="YAML config file (flags below override it)")
    a.add_argument("--aggregator", help="HOST:PORT of the aggregator's gRPC endpoint, or a comma-separated "
                   "list of aggregators sharded by job (every agent of a job picks the same one by "
                   "rendezvous hashing of the job name); omit to run locally: only the agent's own /metrics")
    a.add_argument("--job", help="job name (default: none, a node agent whose GPU series go to the job "
                   "whose processes declare PERFD_JOB on each GPU; \"default\" with a job's log or hook)")
    a.add_argument("--megatron-log", help="tail this Megatron-LM log")
    a.add_argument("--nvml", help="real | replay:FILE | off (default real)")
    a.add_argument("--host", choices=["on", "off"], help="host metrics via psutil (default on)")
    a.add_argument("--ranks", choices=["on", "off", "pod"],
                   help="each rank process's host state: CPU, run-queue wait, who else runs on its CPUs, "
                        "cgroup throttling, pressure, OOM kills (default on; collectors/ranks); pod: also "
                        "follow the processes of this agent's own pod that declare a rank (a job's sidecar, "
                        "its pod with shareProcessNamespace: true): its captures reach them")
    a.add_argument("--metrics-port", type=int, help="port of the agent's /metrics (0: any free "
                   f"port; -1: none; default {L.AGENT_METRICS_PORT})")
    a.add_argument("--ready-file", metavar="FILE",
                   help="write the port /metrics listens on here once it listens (-1: no /metrics); with "
                        "--metrics-port 0 a supervisor learns the port the agent bound")
    a.add_argument("--node", help="node name (default: host name)")
    a.add_argument("--agent-id", help="agent id, unique per agent process (default: NODE/JOB, or NODE/node "
                   "for an agent with no job: a node's DaemonSet agent and a job's sidecar differ)")
    a.add_argument("--spool-dir", help="directory of the on-disk spool (default: in memory)")
    a.add_argument("--capture-dir", metavar="DIR",
                   help="where captures are written (capture_dir: in the config file; default: "
                        "DIR/captures with --state-dir, else a folder of this user's): a job's sidecar "
                        "gives the folder its trainer mounts too (the ranks write their Kineto traces "
                        "there), the mount point itself")
    a.add_argument("--state-dir", metavar="DIR",
                   help="keep each log tail's position here, so that a restarted agent (kill -9 included) "
                        "resumes where it was instead of reading its logs again; use with --spool-dir "
                        "(default: none)")
    a.add_argument("--launch-manifest", metavar="FILE", help="watch a job started by `perfd launch`: "
                   "its job name and the megatron (its log), nccl (its Flight Recorder dumps) and hook "
                   "(its socket) collectors")
    a.add_argument("--job-user", metavar="USER",
                   help="the user (name or uid) the job runs as: only its processes are taken for the "
                        "job's ranks (step hooks, GPU processes, capture targets); default: the launch "
                        "manifest's user, else this agent's own (job_user: in the config file)")
    a.add_argument("--no-mfu-alert", action="store_true",
                   help="the job is low-MFU by design (a debugging run, a tiny model): its job info says so, "
                        "the aggregator exports perfd_job_mfu_alert_opt_out_info for it and the shipped "
                        "PerfdJobMFULow leaves it out (mfu_alert: false in the config file; perfd launch "
                        "--no-mfu-alert puts it in the launch manifest)")
    a.add_argument("--metrics-host", help=f"address of the agent's /metrics (default {L.LOOPBACK})")
    a.add_argument("--listen-all", action="store_true",
                   help="serve /metrics on every interface (0.0.0.0) unless --metrics-host is given")
    a.add_argument("--tls-ca", metavar="FILE", help="CA certificate that signed the aggregator's: "
                   "connect over TLS (files are read again at every reconnect)")
    a.add_argument("--tls-cert", metavar="FILE", help="this agent's certificate, for mutual TLS")
    a.add_argument("--tls-key", metavar="FILE", help="this agent's private key, for mutual TLS")
    a.add_argument("--auth-token-file", metavar="FILE",
                   help="file holding the shared bearer token the aggregator requires")
    add_engine_arguments(a, streams=False)
    a.set_defaults(handler=_agent)

    g = sub.add_parser("aggregator", help="run the aggregator (gRPC ingest, /metrics, JSON API)")
    g.add_argument("--grpc-host", help="address of the gRPC ingest (default 127.0.0.1; see --listen-all)")
    g.add_argument("--grpc-port", type=int, default=50051,
                   help="gRPC ingest port, agents connect here (default: %(default)s)")
    g.add_argument("--http-host", help="address of /metrics and the API (default 127.0.0.1)")
    g.add_argument("--http-port", type=int, default=9401,
                   help="port of /metrics and the JSON API (default: %(default)s)")
    g.add_argument("--listen-all", action="store_true",
                   help="listen on every interface (0.0.0.0) where no --grpc-host/--http-host is given")
    g.add_argument("--tls-cert", metavar="FILE", help="server certificate: gRPC over TLS (re-read when "
                   "it changes, no restart)")
    g.add_argument("--tls-key", metavar="FILE", help="server private key (with --tls-cert)")
    g.add_argument("--tls-client-ca", metavar="FILE", help="CA of the agents' certificates: mutual TLS, "
                   "an agent id is bound to its certificate")
    g.add_argument("--identity-policy", metavar="FILE", help="with --tls-client-ca: the agent ids and jobs "
                   "each client certificate may use (YAML; docs/reliability.md); others are refused")
    g.add_argument("--auth-token-file", metavar="FILE", help="shared bearer token: required on gRPC and "
                   "on every HTTP path but /metrics and /healthz (re-read when the file changes)")
    g.add_argument("--max-message-bytes", type=int, default=L.MAX_MESSAGE_BYTES,
                   help="largest gRPC message accepted")
    g.add_argument("--max-jobs", type=int, default=L.MAX_JOBS,
                   help="jobs held now (named by an open stream or holding data not yet pruned); a new "
                   "job at the cap prunes the one that ended first, else it is refused")
    g.add_argument("--max-jobs-per-agent", type=int, default=L.MAX_JOBS_PER_AGENT,
                   help="jobs one agent id may hold (one identity: "
                   f"{L.MAX_JOBS_PER_IDENTITY}), so that no client takes the whole cap")
    g.add_argument("--job-retention", type=float, default=L.JOB_RETENTION_S, metavar="SECONDS",
                   help="how long an ended job's data, report and incidents are kept before it is pruned")
    g.add_argument("--max-series", type=int, default=L.MAX_SERIES, help="node series held; more are refused")
    g.add_argument("--max-series-per-agent", type=int, default=L.MAX_SERIES_PER_AGENT,
                   help="node series one agent may define (default: %(default)s)")
    g.add_argument("--max-series-per-identity", type=int, default=L.MAX_SERIES_PER_IDENTITY,
                   help="node series the agents of one identity may hold together — a client certificate, "
                   "or the address of a client without credentials (not the shared token's); more are "
                   "refused, series_quota (default: %(default)s; raise it for many agents behind one "
                   "address)")
    g.add_argument("--agent-retention", type=float, default=L.AGENT_RETENTION_S, metavar="SECONDS",
                   help="an agent whose stream closed is forgotten this long after (its series released) "
                   "unless it comes back")
    g.add_argument("--max-capture-steps", type=int, default=L.MAX_CAPTURE_STEPS,
                   help="most iterations one requested capture may cover (API and webhook)")
    g.add_argument("--capture-requests-per-job", type=int, default=L.CAPTURE_REQUESTS_PER_JOB,
                   help=f"capture requests accepted per job every {L.CAPTURE_RATE_WINDOW_S:g} s "
                   "(API and webhook)")
    g.add_argument("--gpu", help="GPU name for the peak table when agents do not report one")
    g.add_argument("--peak-tflops", type=float, help="override the peak dense TFLOP/s per GPU")
    g.add_argument("--ready-file", help="write 'GRPC_PORT HTTP_PORT' here once listening")
    g.add_argument("--inter-node-link", help="network link type between nodes for the collective "
                   "bandwidth check: ib-100g, ib-200g (default: 25 GB/s per GPU), ib-400g, ib-800g")
    g.add_argument("--inter-node-busbw-gbs", action="append", metavar="[JOB=]GBS",
                   help="bus bandwidth (GB/s per GPU) the inter-node network reaches, for all jobs or "
                   "JOB (repeatable); overrides --inter-node-link")
    g.add_argument("--intra-node-busbw-gbs", action="append", metavar="[JOB=]GBS",
                   help="bus bandwidth (GB/s) of the link inside a node (default: from the GPU model, "
                   "e.g. NVLink 4 = 450)")
    g.add_argument("--no-rank-series", action="store_true",
                   help="leave per-rank series (perfd_job_rank_*) out of /metrics: bounds label "
                   "cardinality for very large jobs; the JSON API still has them")
    g.add_argument("--export-node-series", action="store_true",
                   help="also serve the agents' GPU and host series (perfd_gpu_*, perfd_host_*) on /metrics; "
                   "off by default because each agent serves them itself and a sum over both would count "
                   "every GPU twice (docs/prometheus.md); the JSON API has them either way")
    g.add_argument("--rules", action="append", metavar="FILE",
                   help="rule pack to evaluate (repeatable; default: the shipped rules/default.yaml)")
    g.add_argument("--no-rules", action="store_true", help="evaluate no rules (no automatic captures)")
    g.add_argument("--rules-interval", type=float, default=5.0, help="seconds between evaluations")
    g.add_argument("--state-dir", metavar="DIR",
                   help="keep job info, step records, events, rule and capture state in DIR (SQLite, WAL) "
                        "so that a restart, kill -9 included, loses nothing: an agent's batch is "
                        "acknowledged only once written there (default: none, state in memory only)")
    g.add_argument("--state-max-mib", type=float, default=DEFAULT_STATE_BYTES / (1 << 20), metavar="MIB",
                   help="most MiB the --state-dir holds (journal, Hellos, job info, documents; default "
                        "%(default)g): the oldest journalled batches go first, counted in /api/stats "
                        "state_store.pruned_for_bytes; a restart replays no more than this")
    g.add_argument("--event-loop", choices=EVENT_LOOPS, default=EVENT_LOOPS[0],
                   help="the gRPC ingest's event loop: uvloop (installed with perfd on Linux and macOS) "
                        "takes ~11%% less CPU per gRPC message than asyncio's own (benchmarks/README.md, "
                        "Scale); auto (default) uses it when it can be imported, else asyncio")
    g.add_argument("--gil-switch-ms", type=float, default=SWITCH_INTERVAL_S * 1e3, metavar="MS",
                   help="the interpreter's switch interval (default %(default)g ms; Python's own is 5): how "
                        "long the event loop, back from I/O, waits for a thread running analyses to give "
                        "up the interpreter's lock (perfd/aggregator/runtime.py)")
    g.add_argument("--retain-iterations", type=int, default=L.RETAIN_ITERATIONS, metavar="N",
                   help="step records kept per job: the newest N iterations (default: %(default)s)")
    g.add_argument("--retain-mib", type=float, default=L.RETAIN_BYTES / (1 << 20), metavar="MIB",
                   help="and at most this many MiB of them per job, estimated (default: %(default)g; a "
                   "1,000-rank job with per-rank timers holds ~1.3 MB an iteration); older iterations "
                   "leave first, counted in /api/stats iterations_evicted_retention[_bytes]")
    g.add_argument("--job-stale-after", type=float, metavar="SECONDS",
                   help="seconds without a step after which a job is stalled (its processes still on "
                        "their GPUs) or ended; its derived gauges then leave /metrics and rules stop "
                        "evaluating it (default: 10 of the job's median steps, at least 60 s)")
    g.add_argument("--stall-phase-max", type=float, default=STALL_PHASE_MAX_S.value, metavar="SECONDS",
                   help="how long after a job's last step record its announced checkpoint saves and "
                        "evaluations may hold a live stall back, whatever they announce (default: "
                        "%(default)g; a stopped or gone rank is never held)")
    g.add_argument("--wandb-project", help="log each job to a Weights & Biases run in this project "
                   "(needs perfd[wandb]); off without it")
    g.add_argument("--wandb-mode", default="offline", choices=["offline", "online", "disabled"],
                   help="offline (default) writes runs under --wandb-dir for `wandb sync`; online uploads")
    g.add_argument("--wandb-dir", help="directory of the W&B runs, checked writable at start (default: "
                   "DIR/wandb with --state-dir DIR, else ./perfd-wandb)")
    g.add_argument("--wandb-interval", type=float, default=10.0, help="seconds between W&B exports")
    g.add_argument("--remote-write", action="append", metavar="URL",
                   help="also push what /metrics shows to this Prometheus remote-write endpoint "
                   "(repeatable; e.g. http://prometheus:9090/api/v1/write, VictoriaMetrics "
                   "http://vm:8428/api/v1/write, Mimir .../api/v1/push): the cluster-wide view of "
                   "aggregators sharded by job (needs perfd[remote-write]; docs/scale.md)")
    g.add_argument("--remote-write-interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                   help="seconds between remote writes (default: %(default)s)")
    g.add_argument("--remote-write-label", action="append", metavar="NAME=VALUE", default=[],
                   help="label added to every series written (repeatable; default: "
                   "perfd_aggregator=HOST:GRPC_PORT, so two shards' own series stay apart)")
    g.add_argument("--remote-write-tenant", metavar="ID",
                   help=f"tenant of every series written, sent as {TENANT_HEADER} (Grafana Mimir, Cortex; "
                   "Thanos Receive with --receive.tenant-header=X-Scope-OrgID)")
    g.add_argument("--remote-write-header", action="append", metavar="NAME=VALUE", default=[],
                   help="extra header on every remote write (repeatable; e.g. THANOS-TENANT=team-a)")
    g.add_argument("--remote-write-bearer-token-file", metavar="PATH",
                   help="send 'Authorization: Bearer <first line of PATH>', read at every write")
    g.add_argument("--remote-write-basic-auth-user", metavar="USER", help="basic auth user (with "
                   "--remote-write-basic-auth-password-file)")
    g.add_argument("--remote-write-basic-auth-password-file", metavar="PATH",
                   help="basic auth password: the first line of PATH, read at every write")
    g.add_argument("--remote-write-ca-file", metavar="PATH",
                   help="verify an https:// remote-write receiver against this CA (default: the system's)")
    add_engine_arguments(g)
    g.add_argument("--engine-root-id", metavar="ID", help="with --engine: this root's id in the lease "
                   "(default: HOST:GRPC_PORT); the aggregator holding the lease leads, the others stand by")
    g.add_argument("--engine-advertise-http", metavar="URL", help="with --engine: this aggregator's HTTP "
                   "as the other roots reach it (http://POD_IP:PORT); a standby forwards its API to the "
                   "leader's, so a Service in front of both answers with the jobs")
    g.add_argument("--engine-job", metavar="NAME", help="with --engine: lead this job alone, as its own root "
                   "(a lease of its own; the engine delivers it no other job's messages), so that two large "
                   "jobs do not share one process; a root without it leads every job that has none")
    g.set_defaults(handler=_aggregator)

    d = sub.add_parser("demo", help="run aggregator + agent locally on recorded real data "
                       "and show the job report")
    d.add_argument("--speed", type=float, default=1.0, help="replay speed of the Megatron log")
    d.add_argument("--nvml", help="real | replay:FILE | off (default: the shipped recording)")
    d.add_argument("--plain", action="store_true", help="line output instead of a live table")
    d.add_argument("--keep-running", action="store_true",
                   help="leave aggregator and agent running after the report")
    d.add_argument("--keep-files", action="store_true",
                   help="keep the run's folder (log, aggregator and agent output); removed by default")
    d.set_defaults(handler=_demo)

    r = sub.add_parser("rules", help="rule packs")
    rsub = r.add_subparsers(dest="rules_cmd", required=True)
    rc = rsub.add_parser("check", help="validate the rule packs the aggregator would load (as with --rules "
                         "FILE...; none: the shipped default); every error as FILE:LINE: reason")
    rc.add_argument("files", nargs="*", help="rule packs in --rules order (a rule named like one of an "
                    "earlier pack needs 'override: true')")
    rc.set_defaults(handler=_rules_check)
