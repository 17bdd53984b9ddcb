"""Recognisers for single SGLang scheduler log lines. Pure functions, no parser state.

Formats (checked against the released wheels; README.md has the table):

- prefix ``[YYYY-MM-DD HH:MM:SS(.mmm)?( DPx)?( PPx)?( TPx)?( EPx)?...]`` (0.3.x+; ``.mmm`` with
  SGLANG_LOG_MS; tags of parallel sizes > 1 only in 0.4.x+, ``ATTN_CP``/``MOE_DP`` in 0.5.2x,
  ``DP-1`` in 0.3.x when DP_RANK is unset), ``[HH:MM:SS TP0]`` (0.2.9-0.2.15), none (0.2.0-0.2.7:
  ``[gpu_id=0] `` / ``[gpu=0] `` starts the message instead);
- ``Prefill batch.`` / ``Prefill batch,`` / ``Prefill batch [N],`` / ``Prefill batch(mixed
  #running-req: N).`` and ``Decode batch.`` / ``Decode batch,`` / ``Decode batch [N],`` followed
  by ``key: value`` pairs separated by ``, ``. Values are read by key, never by position.

Every regular expression is anchored or starts with a literal, so matching stays linear in the
length of an untrusted line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from perfd.core.bounds import MAX_SERVING_VALUE
from perfd.core.serving_records import BatchKind, ServerInfo, ServingRecord

MAX_LINE = 64 * 1024

# "[2025-06-01 12:00:00 DP0 TP1] ", "[2025-06-01 12:00:00.123] ", "[12:00:00 TP0] "
_PREFIX_RE = re.compile(
    r"\[(?:(?P<date>\d{4}-\d{2}-\d{2}) )?(?P<clock>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,6}))?"
    r"(?P<tags>(?: [A-Z][A-Z_]{0,15}-?\d{1,6}){0,8})\] ?"
)
_TAG_RE = re.compile(r" ([A-Z][A-Z_]{0,15})(-?\d{1,6})")
# ISO-ish time in a foreign prefix (journald, container runtimes, structured loggers)
_ISO_RE = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})[T ](?P<clock>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,9}))?")
_GPU_RE = re.compile(r"\[gpu(?:_id)?=(?P<gpu>\d{1,4})\] ")
_HEAD_RE = re.compile(
    r"(?<![A-Za-z0-9_])(?P<kind>Prefill|Decode) batch(?: \[(?P<iter>\d{1,15})\])?"
    r"(?:\(mixed #running-req: (?P<mixed>\d{1,9})\))?(?P<sep>[.,])(?: |$)"
)
_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_SUBVALUE_RE = re.compile(r"(?P<sub>[a-z]{1,10})=(?P<num>[-+]?\d+(?:\.\d*)?)")

# key -> (record attribute, value kind, the batch kind it belongs to or None for both)
KEYS: dict[str, tuple[str, str, BatchKind | None]] = {
    "#new-seq": ("new_seq", "int", "prefill"),
    "#new-token": ("new_tokens", "int", "prefill"),
    "#cached-token": ("cached_tokens", "int", "prefill"),
    "cache hit rate": ("cache_hit_rate", "pct", "prefill"),
    "#pending-token": ("pending_tokens", "int", "prefill"),
    "input throughput (token/s)": ("input_throughput", "float", "prefill"),
    "est. prefill TFLOPS/s (per GPU)": ("est_tflops_per_gpu", "float", "prefill"),
    "#running-req": ("running_req", "int", None),
    "#queue-req": ("queue_req", "int", None),
    "token usage": ("token_usage", "float", None),
    "full token usage": ("full_token_usage", "float", None),
    "swa token usage": ("swa_token_usage", "float", None),
    "mamba usage": ("mamba_usage", "float", None),
    "#token": ("kv_tokens", "int", None),  # prefill lines too in 0.4.9 (allocator.log_usage)
    "#full token": ("full_kv_tokens", "int", None),
    "#swa token": ("swa_kv_tokens", "int", None),
    "gen throughput (token/s)": ("gen_throughput", "float", "decode"),
    "accept len": ("accept_len", "float", "decode"),
    "accept rate": ("accept_rate", "float", "decode"),
    "est. decode TFLOPS/s (per GPU)": ("est_tflops_per_gpu", "float", "decode"),
    "est. read BW (GB/s per GPU)": ("est_read_gbs_per_gpu", "float", "decode"),
}
# 0.4.9 hybrid sliding-window allocator: "#token: full=N, swa=M, token usage: full=0.12, swa=0.10"
_SUBKEYS: dict[tuple[str, str], str] = {
    ("#token", "full"): "#full token", ("#token", "swa"): "#swa token",
    ("token usage", "full"): "full token usage", ("token usage", "swa"): "swa token usage",
}
_GRAPH_KEY_RE = re.compile(r"[a-z]{2,8} graph")  # "cuda graph", "cpu graph", "npu graph", "musa graph"


@dataclass
class Prefix:
    time: float | None = None
    clock_s: float | None = None  # seconds since midnight, when only HH:MM:SS is known
    text: str | None = None
    fmt: str = "none"
    ranks: dict[str, int] = field(default_factory=dict)
    gpu: int | None = None


@dataclass
class BatchParse:
    record: ServingRecord
    issues: list[str] = field(default_factory=list)  # short reasons: "bad-value:#running-req", ...
    truncated: bool = False
    unknown_keys: int = 0


def _epoch(date: str, clock: str, frac: str | None) -> float | None:
    try:
        dt = datetime.strptime(f"{date} {clock}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    t = dt.replace(tzinfo=timezone.utc).timestamp()
    return t + int(frac) / 10 ** len(frac) if frac else t


def _clock_seconds(clock: str) -> float | None:
    try:
        h, m, s = (int(x) for x in clock.split(":"))
    except ValueError:
        return None
    if h > 23 or m > 59 or s > 60:
        return None
    return h * 3600.0 + m * 60.0 + s


def split_prefix(line: str) -> tuple[Prefix, str]:
    """(prefix, message) of a line that starts with SGLang's ``[time tags]`` prefix; else the
    whole line as the message with an empty prefix."""
    m = _PREFIX_RE.match(line)
    p = Prefix()
    msg = line
    if m:
        msg = line[m.end():]
        p.text = m.group(0).strip()
        if m["date"]:
            p.time = _epoch(m["date"], m["clock"], m["frac"])
            p.fmt = "ymd-ms" if m["frac"] else "ymd"
        else:
            p.clock_s = _clock_seconds(m["clock"])
            if p.clock_s is not None and m["frac"]:
                p.clock_s += int(m["frac"]) / 10 ** len(m["frac"])
            p.fmt = "hms"
        p.ranks = {t: int(n) for t, n in _TAG_RE.findall(m["tags"] or "")}
    g = _GPU_RE.match(msg)
    if g:
        p.gpu = int(g["gpu"])
        msg = msg[g.end():]
    return p, msg


def _foreign_prefix(pre: str) -> Prefix:
    """A prefix SGLang did not write (a log shipper's, a structured logger's): the SGLang prefix
    inside it if there is one, else its ISO timestamp. Only the last 512 characters are looked at."""
    pre = pre[-512:]
    i = pre.rfind("[")
    while i >= 0:
        p, rest = split_prefix(pre[i:])
        if not rest.strip() and (p.text is not None or p.gpu is not None):
            if p.text is None and i > 0:  # "[gpu=N] " after the time prefix
                inner = _foreign_prefix(pre[:i])
                inner.gpu = p.gpu
                return inner
            return p
        i = pre.rfind("[", 0, i)
    p = Prefix(fmt="foreign")
    last = None
    for m in _ISO_RE.finditer(pre):
        last = m
    if last is not None:
        p.time = _epoch(last["date"], last["clock"], last["frac"][:6] if last["frac"] else None)
        p.text = last.group(0)
    return p


def _convert(raw: str, kind: str) -> float | int | bool | None:
    raw = raw.strip()
    if kind == "pct":
        if not raw.endswith("%") or not _NUMBER_RE.fullmatch(raw[:-1].strip()):
            return None
        return float(raw[:-1]) / 100.0
    if not _NUMBER_RE.fullmatch(raw):
        return None
    x = float(raw)
    if not math.isfinite(x) or abs(x) > MAX_SERVING_VALUE:  # perfd.core.bounds: a corrupt value
        return None
    if kind == "int":
        return int(x) if x == int(x) else None
    return x


def _segments(body: str) -> list[str]:
    return [s for s in (x.strip() for x in body.split(", ")) if s]


def parse_batch_line(line: str, line_no: int = 0) -> BatchParse | str | None:
    """A batch line -> BatchParse; a line that looks like one but cannot be used -> a reason string;
    anything else -> None."""
    if "batch" not in line:
        return None
    m = _HEAD_RE.search(line)
    if m is None:
        return None
    pre = line[:m.start()]
    p = Prefix()
    if pre.strip():
        p, rest = split_prefix(pre)
        if rest.strip() or (p.text is None and p.gpu is None):  # not (only) SGLang's own prefix
            p = _foreign_prefix(pre)
    kind: BatchKind = "prefill" if m["kind"] == "Prefill" else "decode"
    rec = ServingRecord(kind=kind, line_no=line_no, time=p.time, time_text=p.text,
                        prefix_format=p.fmt, ranks=p.ranks, gpu=p.gpu)
    if p.clock_s is not None:
        rec.clock_time = p.clock_s
    if m["iter"]:
        rec.forward_iter = int(m["iter"])
    if m["mixed"]:
        rec.mixed_running_req = int(m["mixed"])
        rec.fields["mixed #running-req"] = m["mixed"]
    out = BatchParse(rec)
    segs = _segments(line[m.end():])
    if not segs:
        return "batch-line-without-fields"
    last_key: str | None = None
    for i, seg in enumerate(segs):
        key, sep, value = seg.partition(": ")
        if not sep:
            if seg.endswith(":") and i == len(segs) - 1:
                out.truncated = True
                continue
            sub = _SUBVALUE_RE.fullmatch(seg)
            if sub and last_key is not None and (last_key, sub["sub"]) in _SUBKEYS:
                key, value = _SUBKEYS[(last_key, sub["sub"])], sub["num"]
            else:
                if i == len(segs) - 1:
                    out.truncated = True
                else:
                    out.issues.append("segment-without-key")
                continue
        else:
            key, value = key.strip(), value.strip()
            sub = _SUBVALUE_RE.fullmatch(value)
            if sub and (key, sub["sub"]) in _SUBKEYS:
                last_key = key
                key, value = _SUBKEYS[(key, sub["sub"])], sub["num"]
            else:
                last_key = key
        if key in rec.fields:
            out.issues.append(f"duplicate-key:{key}")
            continue
        rec.fields[key] = value
        _assign(rec, key, value, out)
    if not any(k in KEYS or _GRAPH_KEY_RE.fullmatch(k) for k in rec.fields):
        return "batch-line-without-known-fields"
    return out


def _assign(rec: ServingRecord, key: str, value: str, out: BatchParse) -> None:
    if _GRAPH_KEY_RE.fullmatch(key):
        if value in ("True", "False"):
            rec.cuda_graph, rec.graph_backend = value == "True", key
        else:
            out.issues.append(f"bad-value:{key}")
        return
    spec = KEYS.get(key)
    if spec is None:
        out.unknown_keys += 1
        return
    attr, vkind, bkind = spec
    if bkind is not None and bkind != rec.kind:
        out.issues.append(f"key-of-other-kind:{key}")  # kept in fields, never typed
        return
    conv = _convert(value, vkind)
    if conv is None:
        out.issues.append(f"bad-value:{key}")
        return
    setattr(rec, attr, conv)


# --- start-up lines --------------------------------------------------------------------------

_STARTUP_KEYS = {"max_total_num_tokens": "int", "chunked_prefill_size": "int", "max_prefill_tokens": "int",
                 "max_running_requests": "int", "context_len": "int", "available_gpu_mem": "gb",
                 "available_cpu_mem": "gb"}
# server_args keys perfd reads (ServerArgs repr: key=value, strings quoted)
SERVER_ARG_KEYS: tuple[str, ...] = (
    "model_path", "served_model_name", "dtype", "kv_cache_dtype", "quantization", "tp_size", "dp_size",
    "pp_size", "ep_size", "chunked_prefill_size", "max_running_requests", "schedule_policy",
    "schedule_conservativeness", "decode_log_interval", "enable_metrics", "enable_dp_attention",
    "disable_cuda_graph", "cuda_graph_max_bs", "speculative_algorithm", "mem_fraction_static",
    "enable_mixed_chunk", "disaggregation_mode",
)
_ARG_RE = re.compile(
    r"(?<![A-Za-z0-9_])(?P<k>[a-z_][a-z0-9_]{0,63})=(?P<v>'(?:[^'\\]|\\.){0,4096}'|[^,()\[\]{}]{0,256})")
_KV_ALLOC_RE = re.compile(r"(?:^|\] )KV Cache is allocated\. ")
_KV_PAIR_RE = re.compile(r"(?P<k>#tokens|K size|V size|KV size|dtype): (?P<v>[^,]{1,64})")
_WEIGHT_RE = re.compile(r"Load weight end\. ")


def parse_startup_line(msg: str, info: ServerInfo) -> str | None:
    """Fill ``info`` from one start-up message; the kind of line it was, or None."""
    if msg.startswith("max_total_num_tokens="):
        for part in msg.split(", "):
            k, _, v = part.partition("=")
            kind = _STARTUP_KEYS.get(k.strip())
            if kind is None:
                continue
            v = v.strip()
            if kind == "gb":
                num = _convert(v.removesuffix("GB").strip(), "float")
                if isinstance(num, float) and info.available_gpu_mem_gb is None:
                    info.available_gpu_mem_gb = num
            else:
                n = _convert(v, "int")
                if isinstance(n, int) and getattr(info, k.strip()) is None:
                    setattr(info, k.strip(), n)
        return "limits"
    if msg.startswith("server_args=ServerArgs(") or msg.startswith("server_args="):
        for am in _ARG_RE.finditer(msg):
            k, v = am["k"], am["v"].strip()
            if k in SERVER_ARG_KEYS and k not in info.args:
                info.args[k] = v[1:-1] if len(v) >= 2 and v[0] == v[-1] == "'" else v
        return "server_args"
    if _KV_ALLOC_RE.match(msg):
        if info.kv_pool_tokens is not None:  # each scheduler prints its own; the first is kept
            return "kv_alloc"
        pairs = {m["k"]: m["v"].strip() for m in _KV_PAIR_RE.finditer(msg)}
        tokens = _convert(pairs.get("#tokens", ""), "int")
        sizes = [_convert(pairs[k].removesuffix("GB").strip(), "float")
                 for k in ("K size", "V size", "KV size") if k in pairs]
        if isinstance(tokens, int) and tokens > 0 and sizes and all(isinstance(x, float) for x in sizes):
            info.kv_pool_tokens = tokens
            info.kv_pool_bytes_per_gpu = sum(float(x) for x in sizes if x is not None) * 2**30
        return "kv_alloc"
    if _WEIGHT_RE.match(msg):
        if info.model_class is not None:
            return "weights"
        for part in msg[len("Load weight end. "):].rstrip(".").split(", "):
            k, _, v = part.partition("=")
            k, v = k.strip(), v.strip()
            if k == "type":
                info.model_class = v
            elif k == "dtype":
                info.torch_dtype = v.removeprefix("torch.")
            elif k == "mem usage":
                num = _convert(v.removesuffix("GB").strip(), "float")
                if isinstance(num, float):
                    info.weight_bytes_per_gpu = num * 2**30
        return "weights"
    return None
