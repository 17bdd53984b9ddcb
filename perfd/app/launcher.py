"""`perfd launch`: run a training command with the environment perfd needs, and watch it.

``perfd launch [--job NAME] [--flight-recorder DIR] [--fr-timing] [--kineto] [--nsys SESSION]
[--ncu RANKS] [--agent-socket PATH] [--log FILE] [--manifest FILE] -- CMD ...``

- The command is an argument list, never a shell string.
- Environment added to the inherited one (and listed in the manifest):
  ``PERFD_JOB``, ``PERFD_LAUNCH_MANIFEST``, ``PERFD_HOOK_SOCKET`` (where the optional step hook
  sends, :mod:`perfd.hook`), ``PYTHONUNBUFFERED=1`` unless already set (log lines reach the agent
  as they are printed, not when a 8 KiB buffer fills);
  with ``--flight-recorder DIR``: the FIFO and dump paths of PyTorch's Flight Recorder
  (:func:`perfd.core.flight_recorder_env.env_for_flight_recorder`); ``--fr-timing`` adds
  ``TORCH_NCCL_ENABLE_TIMING=1`` (fills ``duration_ms``, which the communication share needs).
  Timing is opt-in: it records a CUDA event before every collective, and under
  ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (Megatron's setting for TP/SP overlap) that can serialize
  communication behind compute (https://github.com/pytorch/pytorch/issues/143890). Measure its cost on the job
  (``tests/gpu/verify_nccl_live.py`` does, paired runs) before leaving it on;
  with ``--kineto``: ``KINETO_USE_DAEMON=1`` and ``KINETO_CONFIG`` naming a base config that makes
  PyTorch ask perfd's Kineto daemon for a trace config every second, and ``TEARDOWN_CUPTI=1`` unless
  the environment sets it (CUPTI let go after each trace: :data:`perfd.capture.kineto_daemon.TEARDOWN_ENV`)
  (:func:`perfd.capture.kineto_daemon.kineto_env`).
- A torchtitan command (``-m torchtitan.train`` or its ``train.py``, under torchrun or python) is
  read with the ``torchtitan`` log collector instead of Megatron-LM's. torchtitan sets the Flight
  Recorder's dump file and ring size itself, over the environment (its ``--comm.save_traces_folder``
  ``comm_traces`` under its dump folder, prefix ``rank_``, ``--comm.trace_buf_size`` 20000): with
  ``--flight-recorder`` perfd appends ``--comm.*`` flags that point them where perfd reads, unless the
  command already sets them (then a note says the dumps go elsewhere).
- ``--nsys SESSION`` wraps the command in ``nsys launch --session-new=SESSION ...``
  (:func:`perfd.capture.nsys_exec.nsys_launch_argv`; nsys from ``$PERFD_NSYS``, ``PATH`` or the
  known install path; a clear error when it is missing).
- ``--ncu RANKS`` runs a one-process command under ``perfd ncu-exec`` (:mod:`perfd.capture.ncu_exec`):
  when its rank (RANK, else 0) is one of RANKS it starts under Nsight Compute with profiling off, its
  kernel and time budgets from ``--ncu-launch-count``, ``--ncu-kernel-filter``, ``--ncu-clock-control``
  and ``--ncu-time-budget``; an ncu capture (rule or ``perfd capture --tool ncu``) then profiles one
  step. A torchrun command is refused: wrapping torchrun would put every rank under ncu, so the
  chosen ranks go under ncu with ``$(perfd ncu-prefix ...)`` after ``torchrun --no-python``.
- The command's stdout and stderr (one pipe, so their interleaving is kept) are copied to this
  terminal and to ``--log`` (default ``<run dir>/output.log``) as they arrive, byte for byte,
  partial lines included: the agent's log collectors tail that file. Beside it,
  ``<log>.times`` (:mod:`perfd.core.linetimes`) says when each line arrived, to the microsecond: the
  agent takes an iteration's end time from there rather than from the log's one-second stamps.
  Both are opened without following a link and reused only when they are this user's own regular
  files, in a folder of root's or this user's (sticky if others may write in it); ``--run-dir`` and
  ``--manifest``'s folder must be this user's and closed to others (refused before the job starts).
- SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are passed to the command's process group
  (the command runs in a session of its own, so Ctrl-C reaches it once, through perfd).
- The exit status is the command's; 128 + N when it was killed by signal N; 127 when it could not
  be started (not found), 126 when not executable, 2 for a usage error (e.g. nsys missing).
- A JSON manifest (``--manifest``, default ``<run dir>/launch.json``) says what was set up: job,
  pid, the variables set, the log, the dump directory, and the collector configuration an agent
  needs (``perfd agent --launch-manifest FILE``). It is rewritten with the exit status at the end.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from perfd.core import linetimes
from perfd.core.flight_recorder_env import (
    DUMP_STEM,
    FRAMEWORK_DEFAULTS,
    env_for_flight_recorder,
    framework_defaults,
)
from perfd.core.manifest import (
    MANIFEST_VERSION,
    STATUS_EXITED,
    STATUS_RUNNING,
    LaunchManifest,
    write_manifest,
)

if TYPE_CHECKING:
    from perfd.capture.ncu_exec import NcuOptions

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                     signal.SIGUSR2)
FR_TIMING_NOTE = ("TORCH_NCCL_ENABLE_TIMING=1 records a CUDA event before every collective; with "
                  "CUDA_DEVICE_MAX_CONNECTIONS=1 it can serialize communication behind compute "
                  "(PyTorch issue 143890): measure its cost before leaving it on")


# The command line of a torchtitan run, and the flags it takes for the Flight Recorder
# (torchtitan 0.2.2 and 0.3.0, distributed/utils.py init_distributed: it overrides the variables
# TORCH_FR_BUFFER_SIZE and TORCH_FR_DUMP_TEMP_FILE = os.path.join(dump_folder, folder) + prefix; an
# absolute folder stays absolute under os.path.join).
TORCHTITAN_ENTRIES = ("torchtitan.train", "torchtitan/train.py")
TITAN_FR_FLAGS = ("--comm.save_traces_folder", "--comm.save_traces_file_prefix", "--comm.trace_buf_size")


class LaunchError(Exception):
    """A problem found before the command starts (exit status 2)."""


@dataclass
class LaunchOptions:
    command: list[str]
    job: str = "default"
    agent_socket: str | None = None  # the hook's socket (PERFD_HOOK_SOCKET)
    flight_recorder: str | None = None  # dump directory; None: Flight Recorder not set up
    fr_timing: bool = False
    fr_buffer: int = 2000
    kineto: bool = False
    nsys_session: str | None = None
    nsys_trace: str = "cuda,nvtx,osrt"
    ncu_ranks: list[int] | None = None  # ranks that run under ncu (perfd ncu-exec)
    ncu_options: NcuOptions | None = None  # their defaults when None
    ncu_capture_dir: str | None = None  # the agent's capture_dir (where it finds the ranks under ncu)
    log: str | None = None
    manifest: str | None = None
    run_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra variables (tests, wrappers)
    wandb_run_id: str | None = None  # "auto": perfd picks one; None: the job's own WANDB_RUN_ID, if any
    mfu_alert: bool = True  # False: the job opts out of the MFU alert (the manifest says so to the agent)


@dataclass
class LaunchPlan:
    argv: list[str]
    env_set: dict[str, str]  # what perfd adds to the inherited environment
    run_dir: Path
    log_path: Path
    manifest_path: Path
    hook_socket: str
    fr_dir: Path | None = None
    fr_buffer: int = 2000
    nsys: dict[str, str] | None = None
    ncu: dict[str, object] | None = None
    notes: list[str] = field(default_factory=list)
    wandb_run_id: str | None = None
    log_collector: str = "megatron"  # the collector that reads the command's log

    def collectors(self, job: str) -> dict[str, dict[str, Any]]:
        """The agent collectors that read what this launch sets up (``perfd agent --launch-manifest``)."""
        times = str(linetimes.sidecar_path(self.log_path))
        log = {"path": str(self.log_path), "line_times": times}
        out: dict[str, dict[str, Any]] = {self.log_collector: log, "hook": {"socket_path": self.hook_socket},
                                          # the launched process tree: its ranks' host evidence
                                          "ranks": {"launch_manifest": str(self.manifest_path.resolve())}}
        if self.wandb_run_id and self.log_collector == "megatron":
            out["megatron"]["wandb_run_id"] = self.wandb_run_id
        if self.fr_dir is not None:
            out["nccl"] = {"flight_recorder": {"pipe_prefix": str(self.fr_dir / "frp_"),
                                               "dump_prefix": str(self.fr_dir / "fr_dump_"),
                                               "buffer_entries": self.fr_buffer}}
        return out


def is_torchtitan(cmd: Sequence[str]) -> bool:
    """Whether the command runs torchtitan's trainer (directly, under torchrun or python -m)."""
    module, script = TORCHTITAN_ENTRIES
    return any(a == module or a.replace("\\", "/").endswith(script) for a in cmd)


def _titan_fr_flags(cmd: Sequence[str], fr_dir: Path, buffer: int) -> tuple[list[str], list[str]]:
    """The ``--comm.*`` flags that make torchtitan dump its Flight Recorder ring where perfd reads it,
    with perfd's ring size, each unless the command sets it (the user's value is kept, and said)."""
    given = {a.split("=", 1)[0].replace("-", "_") for a in cmd}  # tyro takes --a.b_c, --a.b-c, --a.b_c=v
    flags: list[str] = []
    own: list[str] = []
    for flag, value in zip(TITAN_FR_FLAGS, (str(fr_dir), DUMP_STEM, str(buffer)), strict=True):
        if flag.replace("-", "_") in given:
            own.append(flag)
        else:
            flags += [flag, value]
    notes = []
    if flags:
        notes.append(f"torchtitan: appended {' '.join(flags)}: torchtitan sets the dump file and ring size "
                     "over the environment (<dump_folder>/comm_traces/rank_, 20000 entries)")
    if own:
        notes.append(f"torchtitan: kept the command's {', '.join(own)}: its dumps may not land as "
                     f"{fr_dir / DUMP_STEM}<rank>, where perfd reads them")
    return flags, notes


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")[:60] or "job"


def plan_launch(opts: LaunchOptions, environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """Work out the command line, environment and paths; creates the run and dump directories.
    Raises LaunchError for what would make the launch fail (no command, nsys missing)."""
    from perfd.hook import wire

    environ = os.environ if environ is None else environ
    cmd = list(opts.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise LaunchError("no command given: perfd launch [options] -- CMD [ARGS ...]")
    if opts.fr_buffer <= 0:
        raise LaunchError("--fr-buffer must be > 0 (0 disables Flight Recorder and its dump pipe)")
    if opts.run_dir:
        run_dir = Path(opts.run_dir)
        _check_dir(run_dir, "--run-dir", own=True)
    else:
        # This user's own folder (0700, made race-free), never a shared /tmp name: another user who
        # made /tmp/perfd-launch/<job> first could point output.log at any file of ours.
        from perfd.core.privdir import UnsafeDirError, private_dir, user_dir

        try:
            run_dir = private_dir(user_dir("launch", _safe(opts.job)))
        except UnsafeDirError as exc:
            raise LaunchError(f"run dir: {exc} (or give --run-dir)") from None
    log_path = Path(opts.log) if opts.log else run_dir / "output.log"
    _check_dir(log_path.parent, "--log", own=False)
    manifest = Path(opts.manifest) if opts.manifest else run_dir / "launch.json"
    if opts.manifest:  # written through a temporary file of a known name: a folder only we write in
        _check_dir(manifest.parent, "--manifest", own=True)
    hook_socket = opts.agent_socket or environ.get(wire.SOCKET_ENV) or wire.default_socket_path()
    if hook_socket == wire.default_socket_path():
        from perfd.core.privdir import UnsafeDirError, private_dir

        try:  # the agent of this user binds there; made private now so nobody else takes the name
            private_dir(os.path.dirname(hook_socket))
        except UnsafeDirError as exc:
            raise LaunchError(f"hook socket folder: {exc} (or give --agent-socket)") from None
    env: dict[str, str] = {"PERFD_JOB": opts.job, "PERFD_LAUNCH_MANIFEST": str(manifest.resolve()),
                           wire.SOCKET_ENV: hook_socket}
    if "PYTHONUNBUFFERED" not in environ:
        env["PYTHONUNBUFFERED"] = "1"
    plan = LaunchPlan(cmd, env, run_dir, log_path, manifest, hook_socket)
    if is_torchtitan(cmd):
        plan.log_collector = "torchtitan"
    if opts.flight_recorder:
        # Not resolved first: a link another user planted at the name would be followed, and the job's
        # dumps (stacks among them) written where they chose. Checked and made as --run-dir is.
        plan.fr_dir = Path(os.path.abspath(opts.flight_recorder))
        plan.fr_buffer = opts.fr_buffer
        _check_dir(plan.fr_dir, "--flight-recorder", own=True)
        env.update(env_for_flight_recorder(plan.fr_dir, buffer_entries=opts.fr_buffer, timing=opts.fr_timing))
        fw_env, fw_notes = framework_defaults(opts.fr_buffer, dict(environ))
        for name in FRAMEWORK_DEFAULTS:  # the user's value of a framework-defaulted variable wins
            env.pop(name, None)
        env.update(fw_env)
        plan.notes.extend(f"Flight Recorder: {n}" for n in fw_notes)
        if plan.log_collector == "torchtitan":
            flags, notes = _titan_fr_flags(cmd, plan.fr_dir, opts.fr_buffer)
            cmd = plan.argv = [*cmd, *flags]
            plan.notes.extend(f"Flight Recorder: {n}" for n in notes)
        if opts.fr_timing:
            plan.notes.append(FR_TIMING_NOTE)
    elif opts.fr_timing:
        raise LaunchError("--fr-timing needs --flight-recorder DIR")
    if opts.kineto:
        from perfd.capture.kineto_daemon import TEARDOWN_ENV, kineto_env

        kenv = kineto_env(poll_s=1, config_dir=run_dir)
        if TEARDOWN_ENV in environ:  # the user's choice stands (e.g. 0 for CUDA graphs before CUDA 12.6)
            kenv.pop(TEARDOWN_ENV)
            plan.notes.append(f"Kineto: {TEARDOWN_ENV}={environ[TEARDOWN_ENV]} kept from the environment; "
                              "without 1 a job stays slower after each on-demand trace")
        env.update(kenv)
    env.update(opts.env)
    _wandb(plan, opts, environ)
    if opts.nsys_session:
        from perfd.capture.binaries import NsysNotFoundError, find_nsys
        from perfd.capture.nsys_exec import nsys_launch_argv

        try:
            nsys = find_nsys()
        except NsysNotFoundError as exc:
            raise LaunchError(str(exc)) from None
        try:
            plan.argv = nsys_launch_argv(nsys, opts.nsys_session, cmd, trace=opts.nsys_trace)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        plan.nsys = {"binary": nsys, "session": opts.nsys_session, "trace": opts.nsys_trace}
    if opts.ncu_ranks:
        _ncu(plan, opts, cmd)
    return plan


def _check_dir(path: Path, flag: str, own: bool) -> None:
    """Make and check a folder perfd launch writes in (perfd.core.privdir.open_safe_dir): ``own``, this
    user's and writable by nobody else; else root's or ours, sticky if others may write in it. Root
    writing a log in another user's 1777 folder would follow the links that user planted there."""
    from perfd.core.privdir import OWN, SHARED, UnsafeDirError, open_safe_dir

    try:
        os.close(open_safe_dir(path, what=OWN if own else SHARED))
    except UnsafeDirError as exc:
        raise LaunchError(f"{flag}: {exc}") from None
    except OSError as exc:
        raise LaunchError(f"{flag}: cannot use the folder {path}: {exc.strerror}") from None


def is_torchrun(cmd: Sequence[str]) -> bool:
    """Whether the command starts torchrun (``torchrun`` or ``python -m torch.distributed.run``)."""
    return any(os.path.basename(a) == "torchrun" or a == "torch.distributed.run" for a in cmd[:4])


def _ncu(plan: LaunchPlan, opts: LaunchOptions, cmd: list[str]) -> None:
    """Wrap a one-process command in ``perfd ncu-exec`` (the ncu binary checked now, not at start)."""
    from perfd.capture.ncu_exec import NcuNotFoundError, NcuOptions, find_ncu, rank_prefix

    if opts.nsys_session:
        raise LaunchError("--ncu and --nsys: one CUPTI client per process, choose one")
    if is_torchrun(cmd):
        raise LaunchError("--ncu wraps one process; under torchrun put $(perfd ncu-prefix --job "
                          f"{opts.job} --ranks R) after torchrun --no-python, so only rank R runs under ncu")
    try:
        ncu = find_ncu()
        o = (opts.ncu_options or NcuOptions()).check()
        plan.argv = [*rank_prefix(opts.job, opts.ncu_ranks or [0], o, opts.ncu_capture_dir), *cmd]
    except (NcuNotFoundError, ValueError) as exc:
        raise LaunchError(f"--ncu: {exc}") from None
    plan.ncu = {"binary": ncu, "ranks": list(opts.ncu_ranks or []), "launch_count": o.launch_count,
                "kernel_filter": o.kernel_filter, "clock_control": o.clock_control,
                "time_budget_s": o.time_budget_s, "capture_dir": opts.ncu_capture_dir}


def _wandb(plan: LaunchPlan, opts: LaunchOptions, environ: Mapping[str, str]) -> None:
    """The W&B run the job logs to, so perfd's export joins it: the job's own WANDB_RUN_ID wins;
    else ``--wandb-run-id`` (``auto``: a new id) is exported with WANDB_RESUME=allow, which the
    training script's ``wandb.init`` honours (Megatron-LM passes no id of its own)."""
    own = environ.get("WANDB_RUN_ID") or opts.env.get("WANDB_RUN_ID")
    if own:
        plan.wandb_run_id = own
        if opts.wandb_run_id and opts.wandb_run_id not in ("auto", own):
            plan.notes.append(f"--wandb-run-id {opts.wandb_run_id} ignored: the job sets WANDB_RUN_ID={own}")
        return
    if not opts.wandb_run_id:
        return
    rid = uuid.uuid4().hex[:12] if opts.wandb_run_id == "auto" else opts.wandb_run_id
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", rid):
        raise LaunchError(f"--wandb-run-id {rid!r}: W&B run ids are letters, digits, '_' and '-' "
                          "(at most 64)")
    plan.wandb_run_id = rid
    plan.env_set["WANDB_RUN_ID"] = rid
    plan.env_set.setdefault("WANDB_RESUME", environ.get("WANDB_RESUME") or "allow")
    plan.notes.append(f"WANDB_RUN_ID={rid}: the training script's W&B run; perfd's export attaches to it")


def manifest_data(plan: LaunchPlan, opts: LaunchOptions, pid: int | None, status: str,
                  started: float, exit_code: int | None = None, ended: float | None = None) -> LaunchManifest:
    return {
        "version": MANIFEST_VERSION, "job": opts.job, "status": status, "pid": pid,
        # The job's user: the agent takes step hooks, GPU processes and capture targets of this uid only.
        "uid": os.getuid(),
        "launcher_pid": os.getpid(), "started": started, "ended": ended, "exit_code": exit_code,
        "command": plan.argv,
        "cwd": os.getcwd(), "env": plan.env_set, "env_keys": sorted(plan.env_set),
        "log": str(plan.log_path.resolve()), "run_dir": str(plan.run_dir.resolve()),
        "flight_recorder": None if plan.fr_dir is None else {
            "dir": str(plan.fr_dir), "pipe_prefix": str(plan.fr_dir / "frp_"),
            "dump_prefix": str(plan.fr_dir / "fr_dump_"), "timing": opts.fr_timing,
            "buffer_entries": opts.fr_buffer},
        "hook_socket": plan.hook_socket,
        "kineto": {"config": plan.env_set.get("KINETO_CONFIG")} if opts.kineto else None,
        "nsys": plan.nsys, "ncu": plan.ncu, "notes": plan.notes, "collectors": plan.collectors(opts.job),
        "wandb_run_id": plan.wandb_run_id,
        "mfu_alert": opts.mfu_alert,
    }


class Tee:
    """Copies everything read from ``fd`` to each output as it arrives (bytes, partial lines too).

    An output that fails (a closed terminal, a full disk) is dropped and counted; the others go on.
    After :meth:`finish` the thread reads on until end of file, or until the pipe stays quiet for
    ``quiet_s`` (a leftover grandchild may hold it open for ever).
    """

    def __init__(self, fd: int, outputs: Sequence[IO[bytes]], quiet_s: float = 1.0,
                 times: IO[bytes] | None = None, times_for: int = 1) -> None:
        self.fd = fd
        self.outputs = list(outputs)
        # ``times``: the ``.times`` sidecar (perfd.core.linetimes) of output ``times_for`` (the log):
        # when each read that carried a newline arrived, for step boundaries finer than the
        # log's own one-second stamps.
        self.times = times
        self.times_for = times_for
        self.errors: dict[int, str] = {}
        self.bytes = 0
        self.quiet_s = quiet_s
        self._finish = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perfd-launch-tee", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        last_data = time.monotonic()
        while True:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.1)
            except (OSError, ValueError):
                return
            if not ready:
                if self._finish.is_set() and time.monotonic() - last_data >= self.quiet_s:
                    return
                continue
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            now_ns = time.time_ns()
            last_data = time.monotonic()
            self.bytes += len(chunk)
            # The time first: a reader that sees a line in the log then always finds its time.
            self._note_time(chunk, now_ns)
            for i, out in enumerate(self.outputs):
                if i in self.errors:
                    continue
                try:
                    out.write(chunk)
                    out.flush()
                except (OSError, ValueError) as exc:
                    self.errors[i] = repr(exc)

    def _note_time(self, chunk: bytes, now_ns: int) -> None:
        # The log will hold every byte read so far (until it fails): its size is self.bytes.
        if self.times is None or b"\n" not in chunk or self.times_for in self.errors:
            return
        try:
            self.times.write(linetimes.format_record(self.bytes, now_ns))
            self.times.flush()
        except (OSError, ValueError) as exc:
            self.errors[-1] = f"line times: {exc!r}"
            self.times = None

    def finish(self, timeout_s: float = 10.0) -> None:
        self._finish.set()
        self._thread.join(timeout_s)


def exit_status(returncode: int) -> int:
    """The shell convention: a child killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def run_launch(opts: LaunchOptions, terminal: IO[bytes] | None = None, err: IO[str] | None = None) -> int:
    """Run the command to completion; returns the exit status (see the module docstring)."""
    err = err if err is not None else sys.stderr
    terminal = terminal if terminal is not None else sys.stdout.buffer
    try:
        plan = plan_launch(opts)
    except LaunchError as exc:
        print(f"perfd launch: {exc}", file=err)
        return 2
    for note in plan.notes:
        print(f"perfd launch: note: {note}", file=err)
    started = time.time()
    stdin = subprocess.DEVNULL if sys.stdin is None or _isatty(sys.stdin) else None
    from perfd.core.privdir import UnsafeDirError

    try:  # never through a link, nor over a file not ours: refused before the job starts
        log, times, why = linetimes.open_for_writing(plan.log_path)
    except UnsafeDirError as exc:
        print(f"perfd launch: --log: {exc}", file=err)
        return 2
    except OSError as exc:
        print(f"perfd launch: cannot write the log {plan.log_path}: {exc.strerror}", file=err)
        return 2
    if times is None:  # the sidecar is an aid: without it the log's own time stamps are used
        print(f"perfd launch: note: cannot write {linetimes.sidecar_path(plan.log_path)}: {why}; "
              "step boundaries fall back to the log's time stamps", file=err)
    fwd = _Forwarder()
    with log:
        previous = fwd.install()  # before the child exists: a signal in between is held, then passed
        try:
            try:
                child = subprocess.Popen(plan.argv, env={**os.environ, **plan.env_set}, stdin=stdin,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         start_new_session=True)
            except FileNotFoundError:
                print(f"perfd launch: command not found: {plan.argv[0]}", file=err)
                return 127
            except PermissionError:
                print(f"perfd launch: not executable: {plan.argv[0]}", file=err)
                return 126
            assert child.stdout is not None
            fwd.attach(child.pid)
            write_manifest(plan.manifest_path, manifest_data(plan, opts, child.pid, STATUS_RUNNING, started))
            print(f"perfd launch: job {opts.job!r} pid {child.pid}; log {plan.log_path}; manifest "
                  f"{plan.manifest_path}", file=err, flush=True)
            tee = Tee(child.stdout.fileno(), [terminal, log], times=times, times_for=1)
            tee.start()
            try:
                rc = child.wait()
            finally:
                tee.finish()
                child.stdout.close()
        finally:
            _restore(previous)
    status = exit_status(rc)
    write_manifest(plan.manifest_path, manifest_data(plan, opts, child.pid, STATUS_EXITED, started, status,
                                                     time.time()))
    if times is not None:
        try:
            times.close()
        except OSError:
            pass
    for i, why in tee.errors.items():
        what = "line times" if i < 0 else ["terminal", "log"][i]
        print(f"perfd launch: output {what} failed: {why}", file=err)
    return status


def _isatty(f: IO[str]) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError):
        return False


# What signal.signal takes and gives back: a function, SIG_DFL / SIG_IGN, or None (set from outside Python)
SignalHandler = Callable[[int, FrameType | None], object] | int | None


class _Forwarder:
    """Passes the usual termination and user signals on to the child's process group; signals that
    arrive before the child exists are held and passed once it does."""

    def __init__(self) -> None:
        self.pgid: int | None = None
        self.pending: list[int] = []

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        if self.pgid is None:
            self.pending.append(signum)
            return
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            pass

    def install(self) -> dict[int, SignalHandler]:
        if threading.current_thread() is not threading.main_thread():
            return {}  # handlers can only be set from the main thread (tests call run_launch elsewhere)
        previous: dict[int, SignalHandler] = {}
        for sig in FORWARDED_SIGNALS:
            try:
                previous[sig] = signal.signal(sig, self._handler)
            except (OSError, ValueError):
                continue
        return previous

    def attach(self, pgid: int) -> None:
        self.pgid = pgid  # start_new_session: the child leads its own process group
        while self.pending:
            self._handler(self.pending.pop(0), None)


def _restore(previous: Mapping[int, SignalHandler]) -> None:
    for sig, h in previous.items():
        try:
            signal.signal(sig, h)
        except (OSError, ValueError, TypeError):
            pass
