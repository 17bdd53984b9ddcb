"""`perfd capture`: ask the aggregator for a capture by hand (same path as a rule firing)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from perfd.core.model import CAPTURE_TOOLS
from perfd.core.typed import obj, objs


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("capture", help="request a Kineto, nsys or ncu capture of a job's ranks")
    p.add_argument("--aggregator", default="http://127.0.0.1:9401", help="aggregator HTTP base URL")
    p.add_argument("--job", required=True, help="the job to capture, as the aggregator names it")
    p.add_argument("--ranks", help="comma-separated ranks (default: every rank of the job)")
    p.add_argument("--steps", type=int, default=3, help="iterations to capture")
    p.add_argument("--tool", choices=CAPTURE_TOOLS, default="auto",
                   help="capture tool; auto: nsys when the job runs under a perfd nsys session or "
                   "range profile, else kineto; ncu: one step's kernel deep dive on ranks started under "
                   "perfd ncu-prefix / perfd launch --ncu (never chosen by auto)")
    p.add_argument("--stack", action="store_true", help="kineto: record Python stacks too, so the step "
                   "budget names modules (the captured steps run slower: ~16%% on an H100 Megatron-LM job)")
    p.add_argument("--auth-token-file", metavar="FILE", help="the bearer token the aggregator requires")
    p.add_argument("--wait", type=float, default=0.0,
                   help="seconds to wait for the capture to finish, printing its status")
    p.set_defaults(handler=run_capture)
    n = sub.add_parser("nsys-prefix", help="print the per-rank nsys wrapper for torchrun --no-python")
    n.add_argument("--job", required=True, help="the job name the agent knows it by")
    n.add_argument("--mode", choices=("session", "profile"), default="session",
                   help="session: each rank in its own nsys session, every capture reported when its "
                   "range closes; profile: each rank under `nsys profile -c cudaProfilerApi` (nsys "
                   "writes the reports only when the rank exits) (default: %(default)s)")
    n.add_argument("--capture-dir", help="profile mode: the agent's capture_dir (default: this "
                   "user's ~/.local/state/perfd/captures; an agent with --state-dir DIR uses DIR/captures)")
    n.add_argument("--trace", default="cuda,nvtx,osrt", help="nsys --trace (default: %(default)s)")
    n.set_defaults(handler=run_nsys_prefix)
    e = sub.add_parser("nsys-exec", help="run one rank under `nsys launch` in its own session "
                       "perfd-<job>-r$RANK (what nsys-prefix prints; torchrun sets RANK)")
    who = e.add_mutually_exclusive_group(required=True)
    who.add_argument("--job", help="the job name the agent knows it by")
    who.add_argument("--session-base", help="the job's session base, as nsys-prefix prints it")
    e.add_argument("--trace", default="cuda,nvtx,osrt", help="nsys --trace (default: %(default)s)")
    e.add_argument("cmd", nargs=argparse.REMAINDER, help="the rank's command, after --")
    e.set_defaults(handler=run_nsys_exec)


def _words_for_shell(words: list[str], who: str = "nsys-prefix") -> str | None:
    """Printed for $(...), where the shell splits on white space and expands globs but does not
    remove quotes: the words are printed as they are (values that could be split or expanded travel
    as hex: perfd.capture.nsys_exec.shell_arg), and a path that would be is refused."""
    from perfd.capture.nsys_exec import unsafe_for_shell

    bad = [w for w in words if unsafe_for_shell(w)]
    if bad:
        print(f"perfd {who}: {bad[0]!r} would be split or expanded by the shell; use a path without "
              "spaces or *?[", file=sys.stderr)
        return None
    return " ".join(words)


def run_nsys_prefix(args: argparse.Namespace) -> int:
    """``torchrun --no-python --nproc_per_node 8 $(perfd nsys-prefix --job J) python train.py``:
    each rank under its own nsys session (or range profile), so a capture records only the ranks it
    targets (the step hook in the loop opens and closes the ranges)."""
    from perfd.capture.binaries import NsysNotFoundError, find_nsys
    from perfd.capture.nsys_exec import rank_range_prefix, rank_session_prefix

    try:
        nsys = find_nsys()
    except NsysNotFoundError as exc:
        print(f"perfd nsys-prefix: {exc}", file=sys.stderr)
        return 2
    if args.mode == "session":
        line = _words_for_shell(rank_session_prefix(args.job, args.trace))
        if line is None:
            return 2
        print(line)
        return 0
    words = rank_range_prefix(nsys, args.job, args.capture_dir, args.trace)
    line = _words_for_shell(words)
    if line is None:
        return 2
    out_dir = Path(words[words.index("-o") + 1]).parent
    try:  # made here, not left to nsys: the agent also finds the job by this directory
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"perfd nsys-prefix: cannot create {out_dir}: {exc.strerror}", file=sys.stderr)
        return 2
    print(line)
    return 0


def run_nsys_exec(args: argparse.Namespace) -> int:
    """Become ``nsys launch --session-new=perfd-<job>-r<RANK> CMD`` (exec: the rank's process is nsys,
    then the command, with no perfd process left between them and torchrun)."""
    import os

    from perfd.capture.binaries import NsysNotFoundError, find_nsys
    from perfd.capture.nsys_exec import rank_session_argv

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("perfd nsys-exec: no command (perfd nsys-exec --job J -- python train.py)", file=sys.stderr)
        return 2
    rank = os.environ.get("RANK", "")
    if not rank.isdigit():
        print(f"perfd nsys-exec: RANK is {rank or 'unset'}: run it under torchrun (torchrun --no-python "
              "... $(perfd nsys-prefix --job J) python train.py)", file=sys.stderr)
        return 2
    try:
        nsys = find_nsys()
        argv = rank_session_argv(nsys, args.job or "", int(rank), cmd, trace=args.trace,
                                 base=args.session_base)
    except (NsysNotFoundError, ValueError) as exc:
        print(f"perfd nsys-exec: {exc}", file=sys.stderr)
        return 2
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        print(f"perfd nsys-exec: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 126
    return 0  # not reached: execv replaced this process


_HEADERS: dict[str, str] = {"Content-Type": "application/json"}


def _call(url: str, body: Mapping[str, object] | None = None) -> tuple[int, object]:
    """(HTTP status, the JSON answered)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                 headers=_HEADERS)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def run_capture(args: argparse.Namespace) -> int:
    try:
        ranks = [int(x) for x in args.ranks.split(",")] if args.ranks else None
    except ValueError:
        print(f"perfd capture: --ranks must be integers, got {args.ranks!r}", file=sys.stderr)
        return 2
    base = args.aggregator.rstrip("/")
    if getattr(args, "auth_token_file", None):  # a Namespace made by hand may lack it
        from perfd.transport.security import SecurityConfigError, TokenFile

        try:
            _HEADERS["Authorization"] = TokenFile(args.auth_token_file).header()
        except SecurityConfigError as exc:
            print(f"perfd capture: {exc}", file=sys.stderr)
            return 2
    try:
        body = {"job": args.job, "ranks": ranks, "steps": args.steps, "tool": args.tool}
        if getattr(args, "stack", False):  # a Namespace made by hand (tests) may lack it
            body["stack"] = True
        code, rec = _call(f"{base}/api/captures", body)
    except OSError as exc:
        print(f"perfd capture: aggregator at {base} not reachable: {exc}", file=sys.stderr)
        return 1
    said = obj(rec).get("error")
    if code >= 400 and isinstance(said, str):  # refused by the aggregator (a bad rank, the rate): one line
        print(f"perfd capture: refused ({code}): {said}", file=sys.stderr)
        return 1
    print(json.dumps(rec, indent=2))
    if code >= 300 or obj(rec).get("status") in ("refused", "undeliverable"):
        return 1
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        time.sleep(1.0)
        _c, listing = _call(f"{base}/api/captures")
        cur = next((c for c in objs(obj(listing).get("captures")) if c.get("id") == obj(rec).get("id")), None)
        if cur and cur.get("status") in ("finished", "failed"):
            print(json.dumps(cur, indent=2))
            return 0 if cur["status"] == "finished" else 1
    return 0
