"""Recognisers for single Megatron-LM stdout lines. Pure functions, no parser state.

Every ``parse_*`` returns ``None`` when the line is not of its kind, a result object when it is,
and (where it makes sense) a short reason string when the line *looks* like its kind but cannot be
used; the stateful parser turns those strings into ParseIssues.

Performance note: lines are untrusted and may be very long (a glued-together stream, a binary
dump). Every regular expression here is anchored or starts with a literal, and none has two
adjacent quantifiers that can match the same characters, so matching stays linear in the line
length; where that was awkward the code splits strings by hand instead.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from perfd.core.model import RankValue, TimerValue

# A number as Megatron formats it ({:.1f}, {:.6E}, {:d}, torch's nan/inf).
_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|infinity)", re.I)

# Keys of `key: value` pairs on Megatron lines ("lm loss", "throughput per GPU (TFLOP/s/GPU)",
# "mtp_1 loss", "load_balancing_loss", "forward-compute"). Bounded length: a 200-character "key"
# is another rank's text, not Megatron's.
_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9_ ./()%+-]{0,79}")

# Launchers that prefix every line: torchrun --tee ("[default0]:"), PyTorch's per-rank
# prefixes ("[rank3]:"), ``srun -l`` ("12: "). Stripped before anything else looks at a line.
_LAUNCHER_PREFIX_RE = re.compile(r"(?:\[(?:default|rank)\d{1,6}\]:|\d{1,6}: )")

# "[2026-11-21 20:58:42.618274]" (new), "[2024-05-01 10:00:00]" (older, no fraction).
_TIMESTAMP_RE = re.compile(
    r"\[(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<clock>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,9}))?\]"
)


def to_float(text: str) -> float | None:
    """A float if ``text`` is exactly one number, else None (never raises)."""
    text = text.strip()
    if not _NUMBER_RE.fullmatch(text):
        return None
    try:
        return float(text)
    except ValueError:  # pragma: no cover - the regex admits only what float() accepts
        return None


def to_int(text: str) -> int | None:
    """An int if ``text`` is an integral finite number ("64", "64.0"), else None."""
    value = to_float(text)
    if value is None or not math.isfinite(value) or value != int(value):
        return None
    return int(value)


def strip_launcher_prefix(line: str) -> str:
    m = _LAUNCHER_PREFIX_RE.match(line)
    return line[m.end():] if m else line


def parse_timestamp(text: str) -> float | None:
    """Epoch seconds of the last ``[YYYY-MM-DD HH:MM:SS(.ffffff)]`` in ``text``, read as UTC.

    Megatron prints the job machine's local time without a zone; perfd treats it as UTC (README).
    """
    last = None
    for m in _TIMESTAMP_RE.finditer(text):
        last = m
    if last is None:
        return None
    try:
        dt = datetime.strptime(f"{last['date']} {last['clock']}", "%Y-%m-%d %H:%M:%S")
    except ValueError:  # e.g. month 13 in a corrupted line
        return None
    seconds = dt.replace(tzinfo=timezone.utc).timestamp()
    frac = last["frac"]
    if frac:
        seconds += int(frac) / 10 ** len(frac)
    return seconds


_DATETIME_RE = re.compile(
    r"^\[(?P<label>[^\]]{1,200})\] datetime: (?P<date>\d{4}-\d{2}-\d{2}) (?P<clock>\d{2}:\d{2}:\d{2})"
    r"(?:\.(?P<frac>\d{1,6}))?")


def parse_datetime_line(line: str) -> tuple[str, float] | None:
    """Megatron-LM's ``print_datetime``: ``[after megatron is initialized] datetime: 2026-11-22
    11:35:46.052407`` -> (label, epoch seconds, read as UTC as the iteration stamps are)."""
    m = _DATETIME_RE.match(line.strip())
    if m is None:
        return None
    frac = m["frac"] or ""
    when = parse_timestamp(f"[{m['date']} {m['clock']}{'.' + frac if frac else ''}]")
    return None if when is None else (m["label"], when)


def parse_pair(segment: str) -> tuple[str, str] | None:
    """``" lm loss: 1.057704E+01 "`` -> ("lm loss", "1.057704E+01"); None unless key: number."""
    s = segment.strip()
    if len(s) > 160:
        return None
    i = s.rfind(":")
    if i <= 0:
        return None
    key, value = s[:i].strip(), s[i + 1:].strip()
    if not _KEY_RE.fullmatch(key) or not _NUMBER_RE.fullmatch(value):
        return None
    return key, value


# --------------------------------------------------------------------------------------------
# Iteration lines
# --------------------------------------------------------------------------------------------

# "iteration 12/ 40" with any spacing. The look-behind keeps "current_iteration 5" out.
_ITER_HEAD_RE = re.compile(
    r"(?<![\w-])iteration\s+(?P<it>\d{1,18})(?!\d)(?P<slash>\s*/\s*(?P<total>\d{1,18}(?!\d))?)?"
)
# What a line cut inside a pair looks like: " elapsed time per it", " lm loss: 1.05".
_TRUNCATED_TAIL_RE = re.compile(r"[A-Za-z][A-Za-z0-9_ ./()%+-]{0,79}(?::[ ]*[-+0-9.eE]*)?")
_VALIDATION_RE = re.compile(
    r"(?<![\w-])(?P<label>(?:validation|test)\S{0,40}) loss at (?P<where>[^|]{0,200})\|"
)


@dataclass
class IterationLine:
    iteration: int
    train_iters: int | None
    end_time: float | None
    pairs: dict[str, str] = field(default_factory=dict)  # raw key -> raw value, in line order
    truncated: bool = False  # the line stops inside a pair (file still being written)
    intrusion: str | None = None  # trailing text from another rank, dropped
    bad_segments: int = 0  # `|`-delimited segments that were not key: number (intrusions)


def parse_iteration(line: str) -> IterationLine | str | None:
    """A training iteration line, a malformed-reason string, or None (not an iteration line).

    Megatron writes ``[ts] iteration N/M | key: value | ... |``: each pair is closed by ``|``, so
    only closed pairs are trusted. Text after the last ``|`` is either a cut (the line is still
    being written: a space then the start of a pair) or another rank's output glued on (anything
    else), and is never turned into a field.
    """
    for m in _ITER_HEAD_RE.finditer(line):
        rest = line[m.end():]
        prefix = line[: m.start()].strip()
        # A line that ends inside the head is only trusted where the head starts a line, as
        # Megatron's does ("[ts] iteration ..."); "saving at iteration 5/10" is prose.
        cut_head = not rest.strip() and (not prefix or _TIMESTAMP_RE.fullmatch(prefix) is not None)
        if m["slash"] is None:
            if cut_head:
                # "[ts] iteration   12" and nothing more: the number itself may be cut; no record.
                return "truncated-iteration-line"
            continue  # "iteration 100 |" (evaluation) or prose: not a training line head
        if m["total"] is None or not rest.lstrip().startswith("|"):
            if cut_head:
                # Cut right after "N/" or "N/ M": M may be incomplete, so it is not trusted.
                return IterationLine(int(m["it"]), None, parse_timestamp(prefix), truncated=True)
            if "|" in rest and ":" in rest:
                return "iteration-line-bad-head"  # "iteration 5/x | a: 1 |"
            continue
        rec = IterationLine(int(m["it"]), int(m["total"]), parse_timestamp(line[: m.start()]))
        body = rest.lstrip()[1:]
        segments = body.split("|")
        for seg in segments[:-1]:
            pair = parse_pair(seg)
            if pair is not None:
                rec.pairs.setdefault(pair[0], pair[1])
            elif seg.strip():
                rec.bad_segments += 1
        tail = segments[-1].rstrip()
        if tail.strip():
            if tail.startswith(" ") and _TRUNCATED_TAIL_RE.fullmatch(tail.strip()):
                rec.truncated = True
            else:
                rec.intrusion = tail
        return rec
    if "elapsed time per iteration" in line or ("consumed samples" in line and "|" in line):
        return "iteration-line-no-iteration-number"
    return None


@dataclass
class ValidationLine:
    iteration: int | None
    label: str  # "validation", "validation-1", "test"
    values: dict[str, float] = field(default_factory=dict)  # "lm loss value" -> 2.95


def parse_validation(line: str) -> ValidationLine | None:
    """`` validation loss at iteration 100 | lm loss value: ... | lm loss PPL: ... |``."""
    m = _VALIDATION_RE.search(line) if " loss at " in line else None
    if m is None:
        return None
    it = re.search(r"iteration\s+(\d{1,18})(?!\d)", m["where"])
    out = ValidationLine(int(it[1]) if it else None, m["label"])
    for seg in line[m.end():].split("|")[:-1]:
        pair = parse_pair(seg)
        if pair is not None:
            v = to_float(pair[1])
            if v is not None:
                out.values[pair[0]] = v
    return out


# --------------------------------------------------------------------------------------------
# Pauses the training loop announces (checkpoint saves, evaluations)
# --------------------------------------------------------------------------------------------

# Megatron-LM (core 0.20, megatron/training/checkpointing.py) before and after a save:
#   "[2026-11-23 16:21:18.782183] saving checkpoint at iteration      10 to /ckpt in torch_dist format"
#   "  [2026-11-23 16:21:35.529378] successfully saved checkpoint from iteration      10 to /ckpt [ ... ]"
_SAVE_RE = re.compile(r"(?P<what>saving checkpoint at|successfully saved checkpoint from) iteration\s+"
                      r"(?P<it>\d{1,18})(?!\d)")
# evaluate() sets the rerun state machine to DISABLED as it starts (and back as it ends), which core
# 0.20 logs; the "validation loss at iteration N" line follows the pass (seen in
# tests/data/megatron/h100_resume_save_eval.log).
_EVAL_BEGIN = "Setting RerunStateMachine mode RerunMode.DISABLED"


@dataclass
class PhaseLine:
    phase: str  # perfd.analytics.steps.goodput kinds: "checkpoint" or "evaluation"
    state: str  # "begin" | "end"
    iteration: int | None


def parse_phase(line: str) -> PhaseLine | None:
    """A checkpoint save's start or end, or an evaluation's start; None for any other line (the
    evaluation's end is its validation line: :func:`parse_validation`)."""
    if "checkpoint" in line:
        m = _SAVE_RE.search(line)
        if m is not None:
            return PhaseLine("checkpoint", "begin" if m["what"].startswith("saving") else "end", int(m["it"]))
    if _EVAL_BEGIN in line:
        return PhaseLine("evaluation", "begin", None)
    return None


# --------------------------------------------------------------------------------------------
# Timers
# --------------------------------------------------------------------------------------------

_TIMER_HEADER_RE = re.compile(
    r"(?:(?P<minmax>\(min, max\) time)|(?P<max>max time)|(?P<all>times)) across ranks \(ms\):\s*$"
)
_ALL_NAME_RE = re.compile(r" {1,3}(?P<name>[^\s:]+):")
_ALL_RANK_RE = re.compile(r"\s+rank\s+(?P<rank>\d{1,9}):\s*(?P<value>\S+)")
_ONE_LINE_TIMERS_RE = re.compile(r"(?:^|[\s:])time \(ms\)\s*\|")


def parse_timer_header(line: str) -> str | None:
    """The timing-log option a block header announces: "minmax", "max", "all", or None."""
    if "across ranks (ms):" not in line:  # cheap pre-check: most lines are not headers
        return None
    m = _TIMER_HEADER_RE.search(line)
    if m is None:
        return None
    return "minmax" if m["minmax"] else "max" if m["max"] else "all"


def parse_timer_body(line: str) -> tuple[str, TimerValue] | str | None:
    """``    name ......: (min, max)`` or ``    name ......: max``; reason string if the value is bad.

    Megatron pads ``name + ' '`` with dots to 48 columns, so the name always ends with a space
    (long names get no dots: ``    name : 1.0``). Names have no spaces or colons.
    """
    if not line.startswith("  "):
        return None
    i = line.find(":")
    if i < 0:
        return None
    head = line[:i]
    if not (head.endswith(" ") or head.endswith(".")):
        return None  # "  name:" is the 'all' format, "    train: 2560" is something else
    name = head.strip().rstrip(".").rstrip()
    if not name or any(c.isspace() for c in name):
        return None
    text = line[i + 1:].strip()
    if text.startswith("(") and text.endswith(")"):
        parts = text[1:-1].split(",")
        if len(parts) == 2:
            lo, hi = to_float(parts[0]), to_float(parts[1])
            if lo is not None and hi is not None:
                return name, TimerValue(min_ms=lo, max_ms=hi)
        return "timer-line-bad-value"
    value = to_float(text)
    if value is None:
        return "timer-line-bad-value"
    return name, TimerValue(max_ms=value)


def parse_all_timer_name(line: str) -> str | None:
    """``  forward-backward:`` (the ``all`` option's per-timer heading)."""
    m = _ALL_NAME_RE.fullmatch(line.rstrip())
    return m["name"] if m else None


def parse_all_timer_rank(line: str) -> tuple[int, float] | str | None:
    """``     rank  0: 12.34`` (the ``all`` option's per-rank row)."""
    m = _ALL_RANK_RE.fullmatch(line.rstrip())
    if m is None:
        return None
    value = to_float(m["value"])
    if value is None:
        return "timer-line-bad-value"
    return int(m["rank"]), value


def parse_one_line_timers(line: str) -> dict[str, TimerValue] | str | None:
    """Very old Megatron: ``time (ms) | forward-compute: 123.45 | backward-compute: 234.56``."""
    m = _ONE_LINE_TIMERS_RE.search(line)
    if m is None:
        return None
    out: dict[str, TimerValue] = {}
    for seg in line[m.end():].split("|"):
        pair = parse_pair(seg)
        if pair is not None:
            value = to_float(pair[1])
            if value is not None:
                out[pair[0]] = TimerValue(max_ms=value)
    return out if out else "timer-line-bad-value"


# --------------------------------------------------------------------------------------------
# Straggler detector and memory reports
# --------------------------------------------------------------------------------------------

_STRAGGLER_SEG_RE = re.compile(
    r"(?P<mm>Mn|Mx)(?P<q>[A-Za-z]+)/Rnk:\s*(?P<v>[-+0-9.eE]+|nan|inf)\s*(?P<u>[A-Za-z%]*)\s*/\s*(?P<r>-?\d{1,9})"
)
# Megatron's labels -> perfd's quantity keys. Power is printed with a "W" label but holds
# torch.cuda.power_draw(), which is milliwatts: converted here.
STRAGGLER_QUANTITIES: dict[str, str] = {
    "Rtt": "rtt",
    "Pwr": "power",
    "Tmp": "temp",
    "Utl": "util",
    "Clk": "clock",
    "DRtt": "data_rtt",
    "Etpt": "tflops",
}


@dataclass
class StragglerParsed:
    time: str | None
    quantities: dict[str, tuple[RankValue, RankValue]] = field(default_factory=dict)
    unpaired: int = 0  # a min without its max (or the reverse): a cut or odd line


def parse_straggler(line: str) -> StragglerParsed | str | None:
    """``[ts] | MnRtt/Rnk: 98.88ms/0 | MxRtt/Rnk: 144.58ms/1 | ...`` (rank 0's detector report)."""
    if "/Rnk:" not in line:
        return None
    ts = _TIMESTAMP_RE.search(line)
    out = StragglerParsed(f"{ts['date']} {ts['clock']}" if ts else None)
    found: dict[str, dict[str, RankValue]] = {}
    for seg in line.split("|"):
        seg = seg.strip()
        # Real segments are ~25 characters; the length bound also keeps the match linear.
        m = _STRAGGLER_SEG_RE.fullmatch(seg) if len(seg) <= 80 else None
        if m is None:
            continue
        value = to_float(m["v"])
        if value is None:
            continue
        unit = m["u"]
        if m["q"] == "Pwr":
            value, unit = value / 1000.0, "W"
        key = STRAGGLER_QUANTITIES.get(m["q"], m["q"].lower())
        found.setdefault(key, {})[m["mm"]] = RankValue(value, int(m["r"]), unit)
    for key, ends in found.items():
        if "Mn" in ends and "Mx" in ends:
            out.quantities[key] = (ends["Mn"], ends["Mx"])
        else:
            out.unpaired += 1
    if not out.quantities:
        return "straggler-line-unparseable"
    return out


_MEMORY_HEAD_RE = re.compile(
    r"\[Rank (?P<rank>\d{1,9})\]\s*\(after (?P<it>\d{1,18}) iterations?\)\s*memory \(MB\)"
)


# Megatron-LM also reports memory around a checkpoint save, "[Rank 0] (before save_checkpoint for
# iteration 10) memory (MB) | ...": a reading of that moment, not of an iteration's step.
_MEMORY_MOMENT_RE = re.compile(r"\[Rank \d{1,9}\]\s*\((?:before|after) [^)]{1,200}\)\s*memory \(MB\)")


@dataclass
class MemoryLine:
    rank: int
    iteration: int  # -1: a reading of a moment (a checkpoint save), no iteration's
    values: dict[str, float] = field(default_factory=dict)  # "allocated", "max allocated", ...


def parse_memory(line: str) -> MemoryLine | str | None:
    """``[Rank 0] (after 1 iterations) memory (MB) | allocated: 1638.72 | max allocated: ...``."""
    if "memory (MB)" not in line:
        return None
    m = _MEMORY_HEAD_RE.search(line)
    if m is None:
        moment = _MEMORY_MOMENT_RE.search(line)
        if moment is not None:
            return MemoryLine(int(line[line.index("[Rank") + 6:].split("]")[0]), -1)
        return "memory-line-unparseable" if "[Rank" in line else None
    out = MemoryLine(int(m["rank"]), int(m["it"]))
    for seg in line[m.end():].split("|"):
        pair = parse_pair(seg)
        if pair is not None:
            value = to_float(pair[1])
            if value is not None:
                out.values[pair[0]] = value
    return out
