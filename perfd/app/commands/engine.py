"""The distributed path's command-line: the engine flags every role shares (``perfd agent``,
``perfd aggregator``, ``perfd shard``), ``perfd shard`` itself, and ``perfd engine serve`` (one local
nats-server with JetStream, for trying the path on one machine: production runs NATS from its own
chart or packages)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from perfd.core import limits as L
from perfd.engine.subjects import (
    ACK_WAIT_S,
    COLLECTIVES_FOLDED_AT,
    DEFAULT_PARTITIONS,
    LEASE_TTL_S,
    EngineConfig,
)

if TYPE_CHECKING:
    from perfd.engine.shard import Shard
    from perfd.exporters.httpd import HttpServer

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_engine_arguments(p: argparse.ArgumentParser, streams: bool = True) -> None:
    """``streams``: the role may create the streams (shards, roots): it takes --engine-replicas and
    the engine's timers (--engine-lease-ttl, --engine-ack-wait), which an agent has no use for."""
    g = p.add_argument_group("distributed path (NATS JetStream; pip install 'perfd[engine]')")
    g.add_argument("--engine", metavar="URLS", help="the engine's servers, nats://HOST:PORT[,...]")
    g.add_argument("--engine-token-file", metavar="FILE", help="the engine's token (a file: not in ps)")
    g.add_argument("--engine-tls-ca", metavar="FILE", help="CA of the engine's certificates: TLS")
    g.add_argument("--engine-tls-cert", metavar="FILE",
                   help="this process's client certificate, for a server that verifies clients (mutual "
                   "TLS); with --engine-tls-key and --engine-tls-ca")
    g.add_argument("--engine-tls-key", metavar="FILE", help="the key of --engine-tls-cert")
    g.add_argument("--engine-partitions", type=int, default=DEFAULT_PARTITIONS, metavar="N",
                   help="partitions of the node stream (the same on every agent, shard and root)")
    if streams:
        g.add_argument("--engine-replicas", type=int, default=1, choices=(1, 3),
                       help="replicas of the streams and leases: 3 on a three-server cluster")
        g.add_argument("--engine-lease-ttl", type=float, default=LEASE_TTL_S, metavar="SECONDS",
                       help="a shard's or root's lease expires this long after its last renewal (each "
                       "renewed every third of it); the same on every shard and root")
        g.add_argument("--engine-ack-wait", type=float, default=ACK_WAIT_S, metavar="SECONDS",
                       help="a node message a shard has not acknowledged this long is delivered again "
                       "(one held for its windows is released 3 s, or half of it, before); the same on "
                       "every shard and root")
    else:
        g.add_argument("--engine-collectives", choices=COLLECTIVES_FOLDED_AT, default=None,
                       help="where a job's collective operations are folded into per-window figures when "
                       "its ranks' step records come from this node (the step hook): here, or at the "
                       f"shard holding the node (every operation sent; a shard of an older perfd) "
                       f"(default: {COLLECTIVES_FOLDED_AT[0]})")


def read_token(path: str, flag: str, prog: str) -> str:
    """The token in the file ``flag`` names; SystemExit(2) with a reason when it is unreadable, empty,
    or open to other users (perfd.transport.security.check_secret_file_mode)."""
    from perfd.transport.security import SecurityConfigError, check_secret_file_mode

    try:
        check_secret_file_mode(path, f"{flag} file")
    except SecurityConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{prog}: cannot read {flag}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if not token:
        print(f"{prog}: {flag} {path} is empty", file=sys.stderr)
        raise SystemExit(2)
    return token


def engine_config(args: argparse.Namespace, prog: str) -> EngineConfig | None:
    """The config the flags give, None without --engine; SystemExit(2) with a reason when they are wrong."""
    if not getattr(args, "engine", None):
        return None
    urls = tuple(u.strip() for u in args.engine.split(",") if u.strip())
    bad = [u for u in urls if not u.startswith(("nats://", "tls://"))]
    if not urls or bad:
        print(f"{prog}: --engine wants nats://HOST:PORT[,...], got {args.engine!r}", file=sys.stderr)
        raise SystemExit(2)
    if args.engine_partitions < 1:
        print(f"{prog}: --engine-partitions must be >= 1", file=sys.stderr)
        raise SystemExit(2)
    # (an agent's parser has neither: it leases nothing and acknowledges no node message)
    lease_ttl = getattr(args, "engine_lease_ttl", LEASE_TTL_S)
    ack_wait = getattr(args, "engine_ack_wait", ACK_WAIT_S)
    for flag, value in (("--engine-lease-ttl", lease_ttl), ("--engine-ack-wait", ack_wait)):
        if not 0 < value < math.inf:  # (0 is the engine's own default: a lease that never expires)
            print(f"{prog}: {flag} must be > 0 seconds", file=sys.stderr)
            raise SystemExit(2)
    problem = engine_tls_problem(args.engine_tls_ca, args.engine_tls_cert, args.engine_tls_key)
    if problem:
        print(f"{prog}: {problem}", file=sys.stderr)
        raise SystemExit(2)
    token = None
    if args.engine_token_file:
        token = read_token(args.engine_token_file, "--engine-token-file", prog)
    return EngineConfig(urls, token=token, tls_ca=args.engine_tls_ca, tls_cert=args.engine_tls_cert,
                        tls_key=args.engine_tls_key, partitions=args.engine_partitions,
                        lease_ttl_s=lease_ttl, ack_wait_s=ack_wait)


def engine_tls_problem(ca: str | None, cert: str | None, key: str | None) -> str | None:
    """Why the engine's TLS files do not go together (None when they do): a client certificate comes
    with its key, and both with the CA that verifies the servers (the engine's client makes its TLS
    context from the CA: a certificate without one would be dropped unsaid)."""
    if (cert is None) != (key is None):
        return "--engine-tls-cert and --engine-tls-key go together"
    if cert is not None and ca is None:
        return "--engine-tls-cert needs --engine-tls-ca (the CA that signed the engine's certificates)"
    return None


def _nats_missing(prog: str) -> bool:
    import importlib.util

    if importlib.util.find_spec("nats") is None:
        print(f"{prog}: the distributed path needs nats-py: pip install 'perfd[engine]'", file=sys.stderr)
        return True
    return False


def make_shard(cfg: EngineConfig, shard_id: str, replicas: int = 1, comm_summaries: bool = False) -> Shard:
    """A shard with the collective window fold and the communication summaries wired in: the engine
    imports nothing of the analytics (tests/test_layering.py), so the command, which sees every layer,
    hands them to it."""
    from perfd.analytics.collectives.comm_summary import summarize
    from perfd.analytics.collectives.shardfold import ShardCollectives
    from perfd.engine.shard import Shard
    from perfd.engine.shard_comm import ShardComm

    comm = ShardComm(summarize, L.COMM_RECENT_WINDOWS, L.COMM_ITERATIONS_OUT) if comm_summaries else None
    return Shard(cfg, shard_id, replicas=replicas, collectives=ShardCollectives(), comm=comm)


def _shard(args: argparse.Namespace) -> int:

    cfg = engine_config(args, "perfd shard")
    if cfg is None:
        print("perfd shard: --engine is required", file=sys.stderr)
        return 2
    if _nats_missing("perfd shard"):
        return 2
    from perfd.aggregator.runtime import tune_gc

    shard = make_shard(cfg, args.id or f"{socket.gethostname()}-{int(time.time())}", args.engine_replicas,
                       args.comm_summaries)
    try:
        http = _shard_metrics(shard, args.metrics_host, args.metrics_port)
    except OSError as exc:
        print(f"perfd shard: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # The aggregator's collector settings: a shard folding its nodes' operations makes a tuple a
        # rank an operation and holds its ranks' timelines, and Python's default thresholds walked
        # them for ~15% of its CPU (benchmarks.shard_fold_bench --default-gc against without)
        tune_gc()
        task = asyncio.create_task(shard.run(stop))
        while not task.done():
            await asyncio.wait({task}, timeout=args.stats_interval)
            if args.stats_file:  # whole or not at all: written beside, then renamed
                tmp = Path(args.stats_file + ".tmp")
                windows = shard.windows.stats.__dict__ if shard.windows is not None else {}
                comm = shard.comm.stats.__dict__ if shard.comm is not None else {}
                tmp.write_text(json.dumps({"id": shard.id, **shard.stats.to_json(), "windows": windows,
                                           "comm": comm}))
                tmp.replace(args.stats_file)
        task.result()

    try:
        asyncio.run(main())
    except Exception as exc:  # no server, refused credentials: said, exit 1
        where = ",".join(cfg.servers)
        print(f"perfd shard: the engine at {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if http is not None:
            http.stop()
    return 0


def _shard_metrics(shard: Shard, host: str, port: int | None) -> HttpServer | None:
    """The shard's /metrics (and /healthz) on ``host:port``, the agent's server and handler (None: no
    --metrics-port, the default). The address is printed: with port 0 it is the one way to learn it."""
    if port is None:
        return None
    from prometheus_client import CollectorRegistry

    from perfd.agent.agent_http import MetricsHandler
    from perfd.exporters import httpd
    from perfd.exporters.engine_metrics import ShardMetrics

    reg = CollectorRegistry(auto_describe=False)
    reg.register(ShardMetrics(lambda: shard.stats, shard.comm.stats if shard.comm is not None else None))
    try:
        http = httpd.HttpServer(host, port, MetricsHandler, reg, api_threads=1, name="shard-http")
    except OSError as exc:
        raise httpd.bind_error(exc, host, port, "/metrics", "--metrics-port N", "--metrics-host") from exc
    http.start()
    print(f"perfd shard: listening on http://{host}:{http.port}/metrics", flush=True)
    return http


def _serve(args: argparse.Namespace) -> int:
    from perfd.engine.natsd import NatsCluster, NatsUnavailable

    prog = "perfd engine serve"
    token = read_token(args.token_file, "--token-file", prog) if args.token_file else None
    # Blocked before anything starts, so that sigwait below receives them (unblocked, SIGTERM's
    # default action would end this process and leave its servers running).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    base = Path(args.dir)
    try:
        # The folder is made private (0700, ours) there; another user's, a link or a shared one refused
        cluster = NatsCluster(base, size=args.servers, token=token).start()
    except (NatsUnavailable, OSError) as exc:  # privdir's UnsafeDirError is an OSError
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(f"perfd engine serve: {','.join(cluster.urls)} (JetStream in {base}); Ctrl-C stops it", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


def register(sub: SubParsers) -> None:
    s = sub.add_parser("shard", help="reduce a large job's node messages between the engine and its root")
    s.add_argument("--id", help="this shard's id, unique and stable across its restarts (default: host-time)")
    s.add_argument("--stats-file", metavar="FILE", help="write the shard's counters here (JSON) as it runs")
    s.add_argument("--comm-summaries", action="store_true",
                   help="send the job's root a summary of each partition's window figures (those the agents "
                        "folded) in place of the rows: the root's analysis reads the shares from them (the "
                        "medians within 1%%, per-rank shares the top ranks only); give every shard of an "
                        "engine the same (docs/scale.md)")
    s.add_argument("--stats-interval", type=float, default=2.0, metavar="SECONDS",
                   help="seconds between writes of --stats-file")
    s.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve the shard's counters on /metrics at this port (0: any free port, printed; "
                        "default: no /metrics)")
    s.add_argument("--metrics-host", default=L.LOOPBACK,
                   help=f"address of the shard's /metrics (default {L.LOOPBACK}: this machine only)")
    add_engine_arguments(s)
    s.set_defaults(handler=_shard)
    e = sub.add_parser("engine", help="the distributed path's engine, locally")
    esub = e.add_subparsers(dest="engine_command", required=True)
    v = esub.add_parser("serve", help="run nats-server with JetStream here (trying the path on one machine)")
    v.add_argument("--dir", default="perfd-engine",
                   help="the engine's own folder (made 0700; not one others may write in): its JetStream "
                   "store, config and logs")
    v.add_argument("--servers", type=int, default=1, choices=(1, 3), help="one server, or a cluster of three")
    v.add_argument("--token-file", metavar="FILE",
                   help="require this token of every client (given to nats-server in its environment, "
                   "written in no file)")
    v.set_defaults(handler=_serve)
