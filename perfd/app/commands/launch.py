"""`perfd launch [options] -- CMD ...`: argument parsing; the work is in perfd/app/launcher.py."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


def _launch(args: argparse.Namespace) -> int:
    import sys

    from perfd.app.commands.ncu import time_budget
    from perfd.app.launcher import LaunchOptions, run_launch
    from perfd.capture.ncu_exec import NcuOptions
    from perfd.core.jobname import job_name_problem

    ncu_ranks = None
    if args.ncu is not None:
        try:
            ncu_ranks = sorted({int(x) for x in args.ncu.split(",") if x.strip()})
        except ValueError:
            ncu_ranks = []
        if not ncu_ranks or any(r < 0 for r in ncu_ranks):
            print(f"perfd launch: --ncu {args.ncu!r}: comma-separated ranks", file=sys.stderr)
            return 2
    problem = job_name_problem(args.job)
    if problem:
        print(f"perfd launch: --job {problem}", file=sys.stderr)
        return 2
    return run_launch(LaunchOptions(
        command=list(args.cmd), job=args.job, agent_socket=args.agent_socket,
        flight_recorder=args.flight_recorder, fr_timing=args.fr_timing, fr_buffer=args.fr_buffer,
        kineto=args.kineto, nsys_session=args.nsys, nsys_trace=args.nsys_trace, log=args.log,
        manifest=args.manifest, run_dir=args.run_dir, wandb_run_id=args.wandb_run_id,
        mfu_alert=not args.no_mfu_alert,
        ncu_ranks=ncu_ranks, ncu_capture_dir=args.capture_dir,
        ncu_options=NcuOptions(args.launch_count, args.kernel_filter, args.clock_control,
                               time_budget(args, args.launch_count), launch_skip=args.launch_skip)))


def register(sub: SubParsers) -> None:
    p = sub.add_parser(
        "launch", help="run a training command with the environment perfd needs (Flight Recorder, "
        "Kineto daemon mode, nsys session, step hook socket), tee its output to a log",
        description="Runs CMD (an argument list, never a shell string), copies its output to the "
        "terminal and to --log, passes SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 to its process "
        "group and exits with its status (128+N when killed by signal N). Writes a JSON manifest "
        "for `perfd agent --launch-manifest FILE`.")
    p.add_argument("--job", default="default", help="job name (PERFD_JOB; default: %(default)s)")
    p.add_argument("--agent-socket", help="the step hook's socket, where the agent's hook collector "
                   "listens (PERFD_HOOK_SOCKET; default: $PERFD_HOOK_SOCKET or this user's private "
                   "$XDG_RUNTIME_DIR/perfd/hook.sock, else $TMPDIR/perfd-<uid>/hook.sock)")
    p.add_argument("--flight-recorder", metavar="DIR", help="set up PyTorch Flight Recorder dumps in "
                   "DIR (dump FIFOs <DIR>/frp_<rank>.pipe, dumps <DIR>/fr_dump_<rank>)")
    p.add_argument("--fr-timing", action="store_true", help="also TORCH_NCCL_ENABLE_TIMING=1 (collective "
                   "durations, needed for the communication share). Opt-in: with "
                   "CUDA_DEVICE_MAX_CONNECTIONS=1 it can break compute/communication overlap "
                   "(PyTorch issue 143890); measure its cost first")
    p.add_argument("--fr-buffer", type=int, default=2000, help="Flight Recorder ring entries "
                   "(default: %(default)s); dump more often than the ring takes to wrap")
    p.add_argument("--wandb-run-id", metavar="ID|auto",
                   help="the W&B run the training script logs to: exported as WANDB_RUN_ID (with "
                        "WANDB_RESUME=allow) so its wandb.init uses it, and the aggregator's W&B export "
                        "(--wandb-project) attaches to the same run; auto picks a new id. A WANDB_RUN_ID "
                        "already in the job's environment is used as is (default: none)")
    p.add_argument("--no-mfu-alert", action="store_true",
                   help="the job is low-MFU by design (a debugging run, a tiny model): the manifest says so, "
                        "and the agent that reads it exports the job's opt-out, which the shipped "
                        "PerfdJobMFULow alert leaves out (docs/prometheus.md)")
    p.add_argument("--kineto", action="store_true", help="Kineto daemon mode (KINETO_USE_DAEMON=1, a "
                   "1 s config poll) so perfd can trace the running job on demand")
    p.add_argument("--nsys", metavar="SESSION", help="run under `nsys launch --session-new=SESSION` "
                   "(nsys from $PERFD_NSYS, PATH or the known install path)")
    p.add_argument("--nsys-trace", default="cuda,nvtx,osrt", help="nsys --trace (default: %(default)s)")
    p.add_argument("--ncu", metavar="RANKS", help="run a one-process command under Nsight Compute with "
                   "profiling off when its rank (RANK, else 0) is one of RANKS (comma-separated); an ncu "
                   "capture then profiles one step within the budgets below (torchrun: use "
                   "$(perfd ncu-prefix ...) after torchrun --no-python)")
    from perfd.app.commands.ncu import add_budget_arguments

    add_budget_arguments(p, prefix="ncu-")
    p.add_argument("--log", help="copy of the command's output (default: <run dir>/output.log); never "
                   "written through a link nor over a file not yours, nor in a folder of another user")
    p.add_argument("--manifest", help="launch manifest (default: <run dir>/launch.json)")
    p.add_argument("--run-dir", help="directory for the log, manifest and Kineto config: yours, writable "
                   "by nobody else (default: this user's private ~/.local/state/perfd/launcher/<job>)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS ...]")
    p.set_defaults(handler=_launch)
