"""The datagrams between the step hook (in the training process) and the agent's ``hook`` collector.

Fixed little-endian structs, not JSON: packing the step record with ``struct`` costs well under a
microsecond on the training thread, several times less than ``json.dumps`` of the same fields
(benchmarks/hook_overhead.py prints both), and the record stays at 120 bytes. A datagram holds one
or more records back to back (the hook batches them, see ``split_records``); every record starts
with a version byte and a kind byte, and a receiver drops (and counts) what it does not know.

Absent values: integers -1, floats NaN (a metric that was not measured is absent, never 0).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass

from perfd.core.limits import HOOK_TRACE_PATH_MAX_BYTES as TRACE_PATH_MAX_BYTES
from perfd.core.model import HF_TRAINER_FRAMEWORK, LIGHTNING_FRAMEWORK, ModelSpec

VERSION = 1
SOCKET_NAME = "hook.sock"  # in this user's perfd runtime folder (perfd.core.privdir.runtime_dir)
SOCKET_ENV = "PERFD_HOOK_SOCKET"

KIND_STEP = 1
KIND_JOB = 2
KIND_PROFILE_STATUS = 3
KIND_PHASE = 4  # a checkpoint save or an evaluation begins or ends (StepHook.phase)
# The CUDA device the rank computes on (its UUID: the agent finds the GPU without RANK in the
# process's environment and without sharing its pid namespace). Sent after the step records of a
# datagram, never before them: an agent older than this record stops at it (unknown kind, counted)
# and still takes every step before it.
KIND_DEVICE = 5
# The step record a hook sends: KIND_STEP's fields and the step's period (from the previous step's end
# to this one's) and the host time between the two steps that was neither a data fetch nor an
# announced pause. A hook before it sent KIND_STEP (its step time was the time inside the step only);
# the collector reads both. An agent older than KIND_STEP2 drops it (unknown kind, counted).
KIND_STEP2 = 6
STEP_KINDS = (KIND_STEP, KIND_STEP2)
# Hook -> agent: a trace the hook wrote (perfd.hook.trace), where: the hook picks the path (in its
# own private folder), never the request. Variable length: TRACE_WRITTEN then the path, UTF-8; sent in
# a datagram of its own.
KIND_TRACE_WRITTEN = 7
# Hook -> agent: the trainer whose callback drives the hook (perfd.hook.hf, perfd.hook.lightning) and
# the version of it the process imported, so that the job's advice is in the trainer's own terms. Sent
# with the job record, after the step records beside KIND_DEVICE (an agent older than it stops there,
# counted, and keeps every step before it); a plain StepHook sends none: its job is "pytorch".
KIND_FRAMEWORK = 8
# Hook -> agent: the model the hook counts each step's FLOPs with (StepHook(model=...), read by
# perfd.analytics.steps.flops.read_spec), so that the analysis divides the stated count into the GEMMs'
# and core attention's by the same formula. Sent with the job record, after the step records of a
# datagram (an agent older than it stops there, as at KIND_DEVICE).
KIND_MODEL = 9
KIND_PROFILE_REQUEST = 16
KIND_PROFILE_CANCEL = 17
# Agent -> hook: open a Kineto trace in the process (torch.profiler) for the steps asked
# (perfd.hook.trace); the answer is a status, then KIND_TRACE_WRITTEN with the file.
KIND_TRACE_REQUEST = 18
# Agent -> hook: this agent refuses the process's records (they are another job's, or no perfd launch
# names the process and the agent serves a launch's job); the hook says so once on the job's stderr.
KIND_REFUSED = 19

# Step record flags.
FLAG_CUDA = 1 << 0  # times from CUDA events (else host perf_counter)
FLAG_WARMUP = 1 << 1  # within the first warmup_steps: left out of the percentiles
FLAG_PROFILING = 1 << 2  # a cudaProfilerStart/Stop range covered this step
FLAG_HAS_DATA = 1 << 3  # data_wait is set: data_ready() was called, or the fetches are stamped
FLAG_DATA_READY = 1 << 4  # data_ready() was called in the step
FLAG_FETCH = 1 << 5  # the data wait counts stamped fetches (perfd.hook.loader)
FLAG_ARMED = 1 << 6  # the process runs under a profiler armed for a capture (perfd.core.armed.ARMED_ENV)

# version, kind, flags, rank, pid, step, end_time_ns, step_ns, data_wait_ns, compute_ns,
# p50_ns, p90_ns, p99_ns, window_n, send_drops, harvest_drops, tokens_per_step, flops_per_step
STEP = struct.Struct("<BBHiIqqqqqqqqIIIdd")
# KIND_STEP2: STEP's fields, then period_ns, outside_ns. Its step_ns is the time inside the step
# (begin -> end); data_wait_ns covers the whole period (the fetch between the steps included).
STEP2 = struct.Struct("<BBHiIqqqqqqqqIIIddqq")
# version, kind, hook flags (JOB_FLAG_*), rank, pid, world, tp, pp, dp, cp, ep, dtype (ASCII, NUL-padded)
JOB = struct.Struct("<BBHiIiiiiii8s")
# version, kind, flags (MODEL_FLAG_*), rank, pid, then MODEL_FIELDS (int32 each, -1: absent) and the
# parameter count (int64, -1: absent)
MODEL = struct.Struct("<BBHiI15iq")
MODEL_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_channels",
                "num_query_groups", "seq_length", "padded_vocab_size", "vocab_size", "num_experts",
                "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_ffn_hidden_size",
                "moe_layer_freq", "mtp_num_layers")
MODEL_FLAG_SWIGLU = 1 << 0
MODEL_FLAG_UNTIED = 1 << 1
MODEL_FLAG_MLA = 1 << 2
_I32 = (1 << 31) - 1
# version, kind, reserved, rank, pid, CUDA device index (as the process numbers it), UUID (ASCII,
# NUL-padded: "GPU-..." or "MIG-..." as NVML spells it)
DEVICE = struct.Struct("<BBHiIi48s")
# version, kind, framework (FRAMEWORK_*), rank, pid, its version (ASCII, NUL-padded; a longer one cut)
FRAMEWORK_VERSION_BYTES = 32
FRAMEWORK = struct.Struct(f"<BBHiI{FRAMEWORK_VERSION_BYTES}s")
# version, kind, trace flags (TRACE_FLAG_*), request_id, start_step, num_steps
TRACE_REQUEST = struct.Struct("<BBHIqI")
# version, kind, reserved, rank, pid, request_id, last step traced, path length; the path
TRACE_WRITTEN = struct.Struct("<BBHiIIqH")
# version, kind, state, rank, pid, request_id, step
PROFILE_STATUS = struct.Struct("<BBHiIIq")
# version, kind, reserved, request_id, start_step, num_steps
PROFILE_REQUEST = struct.Struct("<BBHIqI")
# version, kind, phase, rank, pid, step, time_ns (wall clock), state, padding, the pause's length in
# microseconds by the hook's monotonic clock (an end's; 0: not said — a begin, an older hook, a pause
# past the field's 71 minutes); what was padding before, so an older hook's end reads as not said
PHASE = struct.Struct("<BBHiIqqB3xI")
# version, kind, reason (REFUSED_*), the job the agent serves (UTF-8, NUL-padded, cut at a character)
REFUSED = struct.Struct("<BBH56s")  # within the 64 bytes the hook reads a control datagram in
REFUSED_OTHER_JOB = 1  # the process declares another job (PERFD_JOB)
REFUSED_NOT_LAUNCHED = 2  # no perfd launch names the process; the agent serves a launch's job

# Phases a hook announces: the training loop pauses for them, so a stall detector must not call the
# pause a hang (perfd.analytics.incidents.stall). The names are perfd.analytics.steps.goodput's kinds.
PHASES = {1: "checkpoint", 2: "evaluation"}
PHASE_CODES = {name: code for code, name in PHASES.items()}
PHASE_BEGIN = 1
PHASE_END = 2
PHASE_STATES = {PHASE_BEGIN: "begin", PHASE_END: "end"}

# The trainers a KIND_FRAMEWORK record names, by code (a receiver counts a code it does not know).
FRAMEWORK_HF_TRAINER = 1
FRAMEWORK_LIGHTNING = 2
FRAMEWORKS = {FRAMEWORK_HF_TRAINER: HF_TRAINER_FRAMEWORK, FRAMEWORK_LIGHTNING: LIGHTNING_FRAMEWORK}

# Job record flags: what the hook's process can do for a capture (0 from a hook older than them).
JOB_FLAG_KINETO_DAEMON = 1 << 0  # started with KINETO_USE_DAEMON: it polls the Kineto daemon itself
JOB_FLAG_CAN_TRACE = 1 << 1  # torch.profiler is importable: the hook can open a Kineto trace itself
# Whether the hook's process has CUDA (neither: unknown, as from an older hook or before torch is in)
JOB_FLAG_CUDA = 1 << 2  # torch.cuda.is_available(): the job computes on a GPU (or could)
JOB_FLAG_NO_CUDA = 1 << 3  # torch is imported and has no CUDA device: a CPU-only job
# Trace request flags.
TRACE_FLAG_STACK = 1 << 0  # Python stacks and input shapes too (with_stack, record_shapes)

# Profile status states.
PROFILE_ACCEPTED = 1  # step = the first step that will be captured
PROFILE_STARTED = 2  # cudaProfilerStart called at the beginning of ``step``
PROFILE_STOPPED = 3  # cudaProfilerStop called at the end of ``step``
PROFILE_REJECTED = 4  # another range is pending or running, or the request is invalid
PROFILE_FAILED = 5  # cudaProfilerStart/Stop raised
PROFILE_CANCELLED = 6
PROFILE_WRITTEN = 7  # a trace request's file is complete at its path (step: the last step traced)
PROFILE_STATE_NAMES = {PROFILE_ACCEPTED: "accepted", PROFILE_STARTED: "started", PROFILE_STOPPED: "stopped",
                       PROFILE_REJECTED: "rejected", PROFILE_FAILED: "failed", PROFILE_CANCELLED: "cancelled",
                       PROFILE_WRITTEN: "written"}

_U32 = 0xFFFFFFFF


@dataclass
class StepMsg:
    rank: int
    pid: int
    step: int
    end_time_ns: int
    step_ns: int
    data_wait_ns: int | None = None
    compute_ns: int | None = None
    p50_ns: int | None = None
    p90_ns: int | None = None
    p99_ns: int | None = None
    window_n: int = 0
    send_drops: int = 0
    harvest_drops: int = 0
    tokens_per_step: float | None = None
    flops_per_step: float | None = None
    flags: int = 0
    # KIND_STEP2 only (None from a KIND_STEP record): the step's period, previous end -> this end,
    # less the announced pauses in it (None after a gap in the series: the first step, one
    # abandoned or dropped before it), and the host time between the two steps that was neither a
    # stamped fetch nor an announced pause.
    period_ns: int | None = None
    outside_ns: int | None = None


def data_wait_from(flags: int) -> str:
    """What a step record's data wait was measured from: stamped fetches (hook.loader, torch's
    DataLoader), data_ready() calls, or both (a hook before FLAG_DATA_READY: data_ready)."""
    parts = [name for flag, name in ((FLAG_FETCH, "fetch"), (FLAG_DATA_READY, "data_ready")) if flags & flag]
    return "+".join(parts) or "data_ready"


def _i(v: int | None) -> int:
    return -1 if v is None else v


def _o(v: int) -> int | None:
    return None if v < 0 else v


def _f(v: float | None) -> float:
    return math.nan if v is None else v


def _of(v: float) -> float | None:
    return None if math.isnan(v) else v


def pack_step(m: StepMsg, legacy: bool = False) -> bytes:
    """A KIND_STEP2 record (``legacy``: a KIND_STEP record, as a hook before KIND_STEP2 sent it)."""
    head = (m.flags & 0xFFFF, m.rank, m.pid & _U32, m.step, m.end_time_ns, m.step_ns, _i(m.data_wait_ns),
            _i(m.compute_ns), _i(m.p50_ns), _i(m.p90_ns), _i(m.p99_ns), m.window_n & _U32,
            m.send_drops & _U32, m.harvest_drops & _U32, _f(m.tokens_per_step), _f(m.flops_per_step))
    if legacy:
        return STEP.pack(VERSION, KIND_STEP, *head)
    return STEP2.pack(VERSION, KIND_STEP2, *head, _i(m.period_ns), _i(m.outside_ns))


def unpack_step(data: bytes) -> StepMsg:
    """A KIND_STEP or KIND_STEP2 record (by its kind byte)."""
    period = outside = -1
    if kind_of(data) == KIND_STEP2:
        (_, _, flags, rank, pid, step, end_ns, step_ns, data_ns, compute_ns, p50, p90, p99, window_n,
         send_drops, harvest_drops, tokens, flops, period, outside) = STEP2.unpack(data)
    else:
        (_, _, flags, rank, pid, step, end_ns, step_ns, data_ns, compute_ns, p50, p90, p99, window_n,
         send_drops, harvest_drops, tokens, flops) = STEP.unpack(data)
    return StepMsg(rank=rank, pid=pid, step=step, end_time_ns=end_ns, step_ns=step_ns,
                   data_wait_ns=_o(data_ns), compute_ns=_o(compute_ns), p50_ns=_o(p50), p90_ns=_o(p90),
                   p99_ns=_o(p99), window_n=window_n, send_drops=send_drops, harvest_drops=harvest_drops,
                   tokens_per_step=_of(tokens), flops_per_step=_of(flops), flags=flags,
                   period_ns=_o(period), outside_ns=_o(outside))


@dataclass
class JobMsg:
    """What a rank's hook knows of the job: its world size and parallel sizes (from
    torch.distributed, a device mesh, or as the script named them) and the training dtype. Sent
    once at the first flush and then every minute (a restarted agent learns it again)."""

    rank: int
    pid: int
    world_size: int | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    dtype: str | None = None
    flags: int = 0  # JOB_FLAG_*


def pack_job(m: JobMsg) -> bytes:
    dtype = (m.dtype or "").encode("ascii", "replace")[:8]
    return JOB.pack(VERSION, KIND_JOB, m.flags & 0xFFFF, m.rank, m.pid & _U32, _i(m.world_size), _i(m.tp),
                    _i(m.pp), _i(m.dp), _i(m.cp), _i(m.ep), dtype)


def unpack_job(data: bytes) -> JobMsg:
    _, _, flags, rank, pid, world, tp, pp, dp, cp, ep, dtype = JOB.unpack(data)
    text = dtype.rstrip(b"\0").decode("ascii", "replace")
    return JobMsg(rank, pid, _o(world), _o(tp), _o(pp), _o(dp), _o(cp), _o(ep), text or None, flags)


@dataclass
class FrameworkMsg:
    """The trainer driving a rank's hook (FRAMEWORK_*) and the version the process imported (None:
    unknown)."""

    rank: int
    pid: int
    framework: int
    version: str | None = None


def pack_framework(m: FrameworkMsg) -> bytes:
    version = (m.version or "").encode("ascii", "replace")[:FRAMEWORK_VERSION_BYTES]
    return FRAMEWORK.pack(VERSION, KIND_FRAMEWORK, m.framework & 0xFFFF, m.rank, m.pid & _U32, version)


def unpack_framework(data: bytes) -> FrameworkMsg:
    _, _, framework, rank, pid, version = FRAMEWORK.unpack(data)
    text = version.rstrip(b"\0").decode("ascii", "replace")
    return FrameworkMsg(rank, pid, framework, text or None)


@dataclass
class ModelMsg:
    """The model a rank's hook counts FLOPs with: the spec's sizes (None: not stated, or a value the
    record cannot hold: an MoE layer pattern given as a list, a size past int32) and its flags."""

    rank: int
    pid: int
    sizes: dict[str, int | None]  # MODEL_FIELDS -> value
    parameter_count: int | None = None
    swiglu: bool = False
    untie_embeddings: bool = False
    multi_latent_attention: bool = False


def model_msg(rank: int, pid: int, spec: ModelSpec) -> ModelMsg:
    sizes = {}
    for name in MODEL_FIELDS:
        v = getattr(spec, name)
        sizes[name] = v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _I32 else None
    n = spec.parameter_count
    return ModelMsg(rank, pid, sizes, n if isinstance(n, int) and 0 <= n < 1 << 63 else None, spec.swiglu,
                    spec.untie_embeddings, spec.multi_latent_attention)


def pack_model(m: ModelMsg) -> bytes:
    flags = ((MODEL_FLAG_SWIGLU if m.swiglu else 0) | (MODEL_FLAG_UNTIED if m.untie_embeddings else 0)
             | (MODEL_FLAG_MLA if m.multi_latent_attention else 0))
    return MODEL.pack(VERSION, KIND_MODEL, flags, m.rank, m.pid & _U32,
                      *(_i(m.sizes.get(k)) for k in MODEL_FIELDS), _i(m.parameter_count))


def unpack_model(data: bytes) -> ModelMsg:
    _, _, flags, rank, pid, *values = MODEL.unpack(data)
    return ModelMsg(rank, pid, {k: _o(v) for k, v in zip(MODEL_FIELDS, values[:-1], strict=True)},
                    _o(values[-1]), bool(flags & MODEL_FLAG_SWIGLU), bool(flags & MODEL_FLAG_UNTIED),
                    bool(flags & MODEL_FLAG_MLA))


@dataclass
class DeviceMsg:
    """The CUDA device a rank's process computes on: its index as the process numbers it (after
    CUDA_VISIBLE_DEVICES) and its UUID, which names the same GPU in NVML on the node."""

    rank: int
    pid: int
    index: int
    uuid: str


def pack_device(m: DeviceMsg) -> bytes:
    return DEVICE.pack(VERSION, KIND_DEVICE, 0, m.rank, m.pid & _U32, m.index,
                       m.uuid.encode("ascii", "replace")[:DEVICE.size - 16])


def unpack_device(data: bytes) -> DeviceMsg:
    _, _, _, rank, pid, index, uuid = DEVICE.unpack(data)
    return DeviceMsg(rank, pid, index, uuid.rstrip(b"\0").decode("ascii", "replace"))


def normalize_uuid(uuid: str | None) -> str | None:
    """One spelling of a device UUID for comparisons: NVML writes ``GPU-8b7c...``, torch's device
    properties the bare ``8b7c...``; MIG instances keep their ``MIG-`` prefix (another namespace)."""
    if not uuid:
        return None
    text = uuid.strip().lower()
    text = text.removeprefix("gpu-")
    return text or None


@dataclass
class ProfileStatus:
    state: int
    rank: int
    pid: int
    request_id: int
    step: int


def pack_profile_status(s: ProfileStatus) -> bytes:
    return PROFILE_STATUS.pack(VERSION, KIND_PROFILE_STATUS, s.state, s.rank, s.pid & _U32,
                               s.request_id & _U32, s.step)


def unpack_profile_status(data: bytes) -> ProfileStatus:
    _, _, state, rank, pid, req, step = PROFILE_STATUS.unpack(data)
    return ProfileStatus(state, rank, pid, req, step)


@dataclass
class ProfileRequest:
    request_id: int
    start_step: int
    num_steps: int
    cancel: bool = False


def pack_profile_request(r: ProfileRequest) -> bytes:
    kind = KIND_PROFILE_CANCEL if r.cancel else KIND_PROFILE_REQUEST
    return PROFILE_REQUEST.pack(VERSION, kind, 0, r.request_id & _U32, r.start_step, r.num_steps & _U32)


def unpack_profile_request(data: bytes) -> ProfileRequest:
    _, kind, _, req, start, n = PROFILE_REQUEST.unpack(data)
    return ProfileRequest(req, start, n, cancel=kind == KIND_PROFILE_CANCEL)


@dataclass
class PhaseMsg:
    rank: int
    pid: int
    phase: int  # a PHASES code
    state: int  # PHASE_BEGIN or PHASE_END
    step: int
    time_ns: int
    # An end's pause length by the hook's monotonic clock (µs; 0: not said): a step of the wall
    # clock between the begin and the end stamps moves their difference, not this.
    took_us: int = 0


def pack_phase(m: PhaseMsg) -> bytes:
    return PHASE.pack(VERSION, KIND_PHASE, m.phase & 0xFFFF, m.rank, m.pid & _U32, m.step, m.time_ns,
                      m.state & 0xFF, m.took_us if 0 < m.took_us <= _U32 else 0)


def unpack_phase(data: bytes) -> PhaseMsg:
    _, _, phase, rank, pid, step, time_ns, state, took_us = PHASE.unpack(data)
    return PhaseMsg(rank, pid, phase, state, step, time_ns, took_us)


@dataclass
class TraceRequest:
    """Agent -> hook: trace steps [start_step, start_step + num_steps) with torch.profiler. Where the
    file goes is the hook's choice (its private folder), said in its TraceWritten record."""

    request_id: int
    start_step: int
    num_steps: int
    stack: bool = False


def pack_trace_request(r: TraceRequest) -> bytes:
    flags = TRACE_FLAG_STACK if r.stack else 0
    return TRACE_REQUEST.pack(VERSION, KIND_TRACE_REQUEST, flags, r.request_id & _U32, r.start_step,
                              r.num_steps & _U32)


def unpack_trace_request(data: bytes) -> TraceRequest | None:
    """None for a datagram that is not exactly one trace request (an older agent's carried a path:
    the hook no longer writes where a request says)."""
    if len(data) != TRACE_REQUEST.size or kind_of(data) != KIND_TRACE_REQUEST:
        return None
    _, _, flags, req, start, n = TRACE_REQUEST.unpack(data)
    return TraceRequest(req, start, n, stack=bool(flags & TRACE_FLAG_STACK))


@dataclass
class TraceWritten:
    """Hook -> agent: the trace of ``request_id`` is complete at ``path`` (in the hook's private
    folder, mode 0600; the agent checks the file is the sender's before it reads it)."""

    rank: int
    pid: int
    request_id: int
    step: int  # the last step traced
    path: str


def pack_trace_written(w: TraceWritten) -> bytes:
    path = w.path.encode()
    if len(path) > TRACE_PATH_MAX_BYTES:
        raise ValueError(f"trace path of {len(path)} bytes: at most {TRACE_PATH_MAX_BYTES}")
    return TRACE_WRITTEN.pack(VERSION, KIND_TRACE_WRITTEN, 0, w.rank, w.pid & _U32, w.request_id & _U32,
                              w.step, len(path)) + path


def unpack_trace_written(data: bytes) -> TraceWritten | None:
    """None for a record that is not a whole TraceWritten (a path of another length, not UTF-8)."""
    if len(data) < TRACE_WRITTEN.size or kind_of(data) != KIND_TRACE_WRITTEN:
        return None
    _, _, _, rank, pid, req, step, size = TRACE_WRITTEN.unpack_from(data)
    raw = data[TRACE_WRITTEN.size:]
    if len(raw) != size or size > TRACE_PATH_MAX_BYTES:
        return None
    try:
        path = raw.decode()
    except UnicodeDecodeError:
        return None
    return TraceWritten(rank, pid, req, step, path)


def kind_of(data: bytes) -> int | None:
    """The kind byte of a datagram of this version, or None (wrong version, too short)."""
    if len(data) < 2 or data[0] != VERSION:
        return None
    return data[1]


EXPECTED_SIZE = {KIND_STEP: STEP.size, KIND_STEP2: STEP2.size, KIND_JOB: JOB.size,
                 KIND_PROFILE_STATUS: PROFILE_STATUS.size, KIND_PROFILE_REQUEST: PROFILE_REQUEST.size,
                 KIND_PROFILE_CANCEL: PROFILE_REQUEST.size, KIND_PHASE: PHASE.size, KIND_DEVICE: DEVICE.size,
                 KIND_TRACE_REQUEST: TRACE_REQUEST.size, KIND_FRAMEWORK: FRAMEWORK.size,
                 KIND_MODEL: MODEL.size}


def _record_size(data: bytes, off: int, kind: int) -> int | None:
    """The size of the record of ``kind`` at ``off`` (a TraceWritten's says its path's length)."""
    if kind == KIND_TRACE_WRITTEN:
        if len(data) - off < TRACE_WRITTEN.size:
            return TRACE_WRITTEN.size  # too short: bad_size below
        end = off + TRACE_WRITTEN.size
        return TRACE_WRITTEN.size + int.from_bytes(data[end - 2:end], "little")
    return EXPECTED_SIZE.get(kind)


def split_records(data: bytes) -> tuple[list[tuple[int, bytes]], str | None]:
    """A datagram holds one or more records back to back (the hook batches step records).

    Returns (kind, record bytes) pairs and, if the datagram ends in something unusable, the reason
    (``bad_version``, ``unknown_kind``, ``bad_size``): the records before it are still returned.
    """
    out: list[tuple[int, bytes]] = []
    off, n = 0, len(data)
    while off < n:
        if n - off < 2 or data[off] != VERSION:
            return out, "bad_version"
        kind = data[off + 1]
        size = _record_size(data, off, kind)
        if size is None:
            return out, "unknown_kind"
        if n - off < size:
            return out, "bad_size"
        out.append((kind, data[off:off + size]))
        off += size
    if not out:
        return out, "bad_version"  # empty datagram
    return out, None


def default_socket_path() -> str:
    """``<runtime dir>/hook.sock``: ``$XDG_RUNTIME_DIR/perfd`` or ``<tmp>/perfd-<uid>``, a folder
    only this user may enter — not a shared ``/tmp`` name another user could bind first. The agent
    and a training process of the same user compute the same path; a job of another user is given
    the agent's socket explicitly (``PERFD_HOOK_SOCKET``, ``perfd launch --agent-socket``)."""
    from perfd.core.privdir import runtime_dir

    return str(runtime_dir() / SOCKET_NAME)


def socket_path_from_env(default: str | None = None) -> str:
    return os.environ.get(SOCKET_ENV) or default or default_socket_path()


@dataclass(frozen=True)
class Refused:
    """Agent -> hook: why the agent serving ``job`` takes none of this process's records."""

    reason: int  # REFUSED_*
    job: str


def pack_refused(r: Refused) -> bytes:
    name = r.job.encode("utf-8")[:REFUSED.size - 4].decode("utf-8", "ignore").encode("utf-8")
    return REFUSED.pack(VERSION, KIND_REFUSED, r.reason & 0xFFFF, name)


def unpack_refused(data: bytes) -> Refused | None:
    """None for a datagram that is not exactly one refusal of a known reason."""
    if len(data) != REFUSED.size or kind_of(data) != KIND_REFUSED:
        return None
    _, _, reason, name = REFUSED.unpack(data)
    if reason not in (REFUSED_OTHER_JOB, REFUSED_NOT_LAUNCHED):
        return None
    return Refused(reason, name.rstrip(b"\0").decode("utf-8", "replace"))
