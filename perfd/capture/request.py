"""A ``capture`` command's arguments, validated into a :class:`CaptureRequest` (the admission step of
:mod:`perfd.capture.manager`). Apart from the manager because it is pure checking of untrusted
input, with its limits in one place, and the per-tool runs read the request it yields.

Arguments (strings; ``Command.ranks`` names the ranks, empty = every rank known here): ``tool``
kineto | nsys | ncu | auto (nsys when the job runs under a perfd nsys session or range profile, else
Kineto; ncu only by name, on ranks started under it: one step's range, its kernel and time budgets
set when the rank started, :mod:`perfd.capture.ncu_exec`); ``steps`` (3; ncu: always 1);
``start_iteration`` ``next`` or N (Kineto counts optimizer steps from the process start, the hook
the steps it is given; for the same iteration on every rank give N, or
``roundup=R``: Kineto starts at the next multiple of R, so pick R above the poll period in steps);
``iterations_per_step`` (the aggregator's, from the job's framework:
perfd.core.model.kineto_iterations_per_step): the optimizer steps Kineto counts in one training step
(more than one where an optimizer steps others inside its own step, as torchtitan's does); given,
``steps``, ``start_iteration`` and ``roundup`` are training steps and a Kineto config asks for them
times this many; absent (the job's framework unknown), a config asks for them as given;
``duration_ms`` (a time window instead; nsys sessions always use one, 3000 by default);
``start_time_ms`` (epoch ms, the same start on every node, Kineto); ``warmup_s``; ``mode`` session |
range (nsys); ``timeout_s`` (120); ``stack`` 1 (Kineto: Python stacks and input shapes too, so the
step budget names modules; the captured steps run slower). Copied to the manifest: ``rule``,
``firing``, ``fired_at`` (epoch s: the latency from the firing is recorded too), ``reason``,
``requested_by``, ``source``. No
argument is a path (the agent picks every path, under its store), nothing runs through a shell;
unknown keys are ignored and listed in the manifest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from perfd.core.model import CAPTURE_TOOLS, CaptureTool, capture_tool

if TYPE_CHECKING:  # the agent passes perfd.transport.codec.Command; anything with these fields will do
    from perfd.transport.codec import Command

TOOLS = CAPTURE_TOOLS
# How an nsys capture is taken, where a request says (None: perfd chooses): a time window of a
# session's collection, or a step-aligned range the hook opens.
NsysMode = Literal["session", "range"]
NSYS_MODES: tuple[NsysMode, ...] = get_args(NsysMode)
# A command's text -> the member it names (a typed closed set, never compared as free text)
_MODE_OF: dict[str, NsysMode] = {m: m for m in NSYS_MODES}
INFO_KEYS = ("rule", "firing", "fired_at", "reason", "requested_by", "source")
BUSY_REASON = "busy: one CUPTI client per process"
MAX_ITERATION = 2**31 - 1  # a start iteration, in Kineto's count (what the config may say)
# A training step's Kineto iterations at most: torchtitan's are 1 + its model parts on the rank (a few);
# the bound keeps the products a config says (steps, round-up) far inside Kineto's integers.
MAX_ITERATIONS_PER_STEP = 64


class CaptureArgError(ValueError):
    pass


@dataclass
class CaptureRequest:
    """A validated capture command."""

    job: str
    ranks: tuple[int, ...]
    tool: CaptureTool = "auto"
    steps: int = 3
    start_iteration: int | None = None  # None: the next iteration
    roundup: int = 1
    duration_ms: int | None = None
    start_time_ms: int | None = None
    warmup_s: int | None = None
    mode: NsysMode | None = None
    timeout_s: float = 120.0
    stack: bool = False  # Kineto: Python stacks and input shapes too (module names; a slower capture)
    # Kineto iterations in one training step (None: the job's framework unknown, counted as 1)
    iterations_per_step: int | None = None
    command_id: str = ""
    context: dict[str, str] = field(default_factory=dict)
    ignored_args: list[str] = field(default_factory=list)

    def steps_link(self) -> str:
        if self.duration_ms is not None and self.mode != "range" and self.start_iteration is None:
            return f"{self.duration_ms}ms"
        if self.start_iteration is None:
            return f"next+{self.steps}"
        return f"{self.start_iteration}-{self.start_iteration + self.steps - 1}"


def _int(args: Mapping[str, str], key: str, lo: int, hi: int) -> int | None:
    raw = args.get(key)
    if raw is None or raw == "":
        return None
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise CaptureArgError(f"{key}={raw!r} is not an integer") from None
    if not lo <= v <= hi:
        raise CaptureArgError(f"{key}={v} is outside [{lo}, {hi}]")
    return v


def parse_command(cmd: Command, now: float) -> CaptureRequest:
    """Validate a ``capture`` command's arguments (CaptureArgError says which and why)."""
    args = {str(k): str(v) for k, v in (cmd.args or {}).items()}
    if not cmd.job:
        raise CaptureArgError("no job")
    for key in args:
        if any(w in key.lower() for w in ("path", "file", "dir", "output")):
            raise CaptureArgError(f"argument {key!r} names a path: the agent chooses every path (its store)")
    tool_raw = args.get("tool", "auto").strip().lower() or "auto"
    tool = capture_tool(tool_raw)
    if tool is None:
        raise CaptureArgError(f"tool={tool_raw!r}: one of {', '.join(TOOLS)}")
    ranks = tuple(sorted({int(r) for r in cmd.ranks}))
    if any(r < 0 for r in ranks):
        raise CaptureArgError("ranks must be >= 0")
    start_raw = args.get("start_iteration", "next").strip().lower()
    start = None if start_raw in ("", "next") else _int(args, "start_iteration", 0, MAX_ITERATION)
    mode_raw = args.get("mode", "").strip().lower() or None
    mode = _MODE_OF.get(mode_raw) if mode_raw is not None else None
    if mode_raw is not None and mode is None:
        raise CaptureArgError(f"mode={mode_raw!r}: {' or '.join(NSYS_MODES)}")
    start_time = _int(args, "start_time_ms", 0, 2**62)
    if start_time is not None and not now * 1000 - 1000 <= start_time <= now * 1000 + 3_600_000:
        raise CaptureArgError("start_time_ms must lie within the next hour (epoch milliseconds)")
    timeout = args.get("timeout_s")
    try:
        timeout_s = 120.0 if timeout in (None, "") else float(str(timeout))
    except ValueError:
        raise CaptureArgError(f"timeout_s={timeout!r} is not a number") from None
    if not (math.isfinite(timeout_s) and 1.0 <= timeout_s <= 3600.0):
        raise CaptureArgError("timeout_s must be within [1, 3600]")
    stack_raw = args.get("stack", "0").strip().lower()
    if stack_raw not in ("0", "1", "true", "false", ""):
        raise CaptureArgError(f"stack={stack_raw!r}: 1 or 0")
    per_step = _int(args, "iterations_per_step", 1, MAX_ITERATIONS_PER_STEP)
    if start is not None and start * (per_step or 1) > MAX_ITERATION:
        raise CaptureArgError(f"start_iteration={start} is past Kineto's count at {per_step} iterations a "
                              f"step (at most {MAX_ITERATION})")
    known = {"tool", "steps", "start_iteration", "roundup", "duration_ms", "start_time_ms", "warmup_s",
             "mode", "timeout_s", "stack", "iterations_per_step", *INFO_KEYS}
    return CaptureRequest(
        job=cmd.job, ranks=ranks, tool=tool, steps=_int(args, "steps", 1, 1000) or 3, start_iteration=start,
        roundup=_int(args, "roundup", 1, 1_000_000) or 1, duration_ms=_int(args, "duration_ms", 1, 600_000),
        start_time_ms=start_time, warmup_s=_int(args, "warmup_s", 0, 600), mode=mode, timeout_s=timeout_s,
        command_id=cmd.id, context={k: args[k][:500] for k in INFO_KEYS if k in args},
        ignored_args=sorted(set(args) - known), stack=stack_raw in ("1", "true"),
        iterations_per_step=per_step)

