"""`perfd agent`, `perfd aggregator`, `perfd record nvml`: argument parsing and start-up."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


def _agent(args: argparse.Namespace) -> int:
    from perfd.agent.config import ConfigError, apply_overrides, load_config
    from perfd.agent.main import run_agent

    try:
        cfg = apply_overrides(
            load_config(args.config), aggregator=args.aggregator, job=args.job,
            megatron_log=args.megatron_log, nvml=args.nvml, metrics_port=args.metrics_port,
            node=args.node, agent_id=args.agent_id, spool_dir=args.spool_dir,
            host=None if args.host is None else args.host == "on",
            launch_manifest=args.launch_manifest)
    except ConfigError as exc:
        print(f"perfd agent: configuration error: {exc}", file=sys.stderr)
        return 2
    return run_agent(cfg)


def _aggregator(args: argparse.Namespace) -> int:
    from perfd.aggregator.collectives import collective_configs
    from perfd.aggregator.main import AggregatorConfig, run_aggregator

    try:
        coll, coll_jobs = collective_configs(args.inter_node_link, args.inter_node_busbw_gbs or (),
                                             args.intra_node_busbw_gbs or ())
    except ValueError as exc:
        print(f"perfd aggregator: {exc}", file=sys.stderr)
        return 2
    cfg = AggregatorConfig(collectives=coll, collectives_per_job=coll_jobs,
                           grpc_host=args.grpc_host, grpc_port=args.grpc_port,
                           http_host=args.http_host, http_port=args.http_port, gpu=args.gpu,
                           peak_tflops=args.peak_tflops,
                           rules_files=[] if args.no_rules else args.rules,
                           rules_interval_s=args.rules_interval,
                           per_rank_series=not args.no_rank_series,
                           export_node_series=args.export_node_series,
                           wandb_project=args.wandb_project, wandb_mode=args.wandb_mode,
                           wandb_dir=args.wandb_dir, wandb_interval_s=args.wandb_interval)
    return run_aggregator(cfg, ready_file=args.ready_file)


def _demo(args: argparse.Namespace) -> int:
    from perfd.demo.run import run_demo

    return run_demo(args)


def _rules_check(args: argparse.Namespace) -> int:
    from perfd.rules.cli import run_rules_check

    return run_rules_check(args.files)


def register(sub: SubParsers) -> None:
    a = sub.add_parser("agent", help="run the per-node agent")
    a.add_argument("--config", help="YAML config file (flags below override it)")
    a.add_argument("--aggregator", help="HOST:PORT of the aggregator's gRPC endpoint "
                   "(omit to run locally: only the agent's own /metrics)")
    a.add_argument("--job", help="job name")
    a.add_argument("--megatron-log", help="tail this Megatron-LM log")
    a.add_argument("--nvml", help="real | replay:FILE | off (default real)")
    a.add_argument("--host", choices=["on", "off"], help="host metrics via psutil (default on)")
    a.add_argument("--metrics-port", type=int, help="port of the agent's /metrics (0: any free "
                   "port; -1: none; default 9400)")
    a.add_argument("--node", help="node name (default: host name)")
    a.add_argument("--agent-id", help="agent id (default: node name)")
    a.add_argument("--spool-dir", help="directory of the on-disk spool (default: in memory)")
    a.add_argument("--launch-manifest", metavar="FILE", help="watch a job started by `perfd launch`: "
                   "its job name and the megatron (its log), nccl (its Flight Recorder dumps) and hook "
                   "(its socket) collectors")
    a.set_defaults(handler=_agent)

    g = sub.add_parser("aggregator", help="run the aggregator (gRPC ingest, /metrics, JSON API)")
    g.add_argument("--grpc-host", default="0.0.0.0", help="address the gRPC ingest listens on")
    g.add_argument("--grpc-port", type=int, default=50051, help="gRPC ingest port (agents connect here)")
    g.add_argument("--http-host", default="0.0.0.0", help="address /metrics and the JSON API listen on")
    g.add_argument("--http-port", type=int, default=9401, help="port of /metrics and the JSON API")
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
    g.add_argument("--wandb-project", help="log each job to a Weights & Biases run in this project "
                   "(needs perfd[wandb]); off without it")
    g.add_argument("--wandb-mode", default="offline", choices=["offline", "online", "disabled"],
                   help="offline (default) writes runs under --wandb-dir for `wandb sync`; online uploads")
    g.add_argument("--wandb-dir", help="directory of the W&B runs (default: ./perfd-wandb)")
    g.add_argument("--wandb-interval", type=float, default=10.0, help="seconds between W&B exports")
    g.set_defaults(handler=_aggregator)

    d = sub.add_parser("demo", help="run aggregator + agent locally on recorded real data "
                       "and show the job report")
    d.add_argument("--speed", type=float, default=1.0, help="replay speed of the Megatron log")
    d.add_argument("--nvml", help="real | replay:FILE | off (default: the shipped recording)")
    d.add_argument("--plain", action="store_true", help="line output instead of a live table")
    d.add_argument("--keep-running", action="store_true",
                   help="leave aggregator and agent running after the report")
    d.set_defaults(handler=_demo)

    r = sub.add_parser("rules", help="rule packs")
    rsub = r.add_subparsers(dest="rules_cmd", required=True)
    rc = rsub.add_parser("check", help="validate rule packs; every error as FILE:LINE: reason")
    rc.add_argument("files", nargs="+")
    rc.set_defaults(handler=_rules_check)
