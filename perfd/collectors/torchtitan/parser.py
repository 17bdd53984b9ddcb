"""A streaming parser for torchtitan's training log (torchtitan 0.3.0: train.py, trainer.py,
components/metrics.py, tools/logging.py).

What the log says, and where perfd takes it from (formats read from torchtitan 0.3.0's source):

- every line: ``[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s`` (tools/logging.py;
  asctime is local time with milliseconds, ``2026-11-23 15:01:02,345``), possibly behind torchrun's
  ``[rankN]:`` prefix (``--role rank --tee 3``, what torchtitan's run_train.sh uses) and with ANSI
  colours unless ``metrics.disable_color_printing``;
- start-up (0.3.0; 0.2.2 alike, seen on an H100): ``torchtitan version: 0.3.0 (...)``;
  ``Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1``;
  ``Building llama3 debugmodel`` (0.2.2: ``Building llama3 debugmodelwith {``, its arguments
  after); ``Model llama3 debugmodel size: 6,163,712 total parameters``; ``Peak FLOPS used for
  computing MFU: 9.890e+14``;
  ``Trainer is initialized with local batch size 8, global batch size 64, gradient accumulation
  steps 1, sequence length 2048, total steps 10 (warmup 2)``; ``Training starts at step 1``;
- every ``metrics.log_freq`` steps (MetricsProcessor.log): ``step: 10  loss:  7.12345
  grad_norm:  1.2345  memory:  1.23GiB(1.56%)  tps: 12,345  tflops: 0.12  mfu: 0.01%`` (``mfu:
  N/A`` with quantisation); ``validate step: 10  loss: ...  memory: ...  tps: ...`` after a
  validation (which resets torchtitan's timer).

The line has no step time: torchtitan's tps and tflops are over the time since its previous log
call. perfd measures the same span from when the lines were printed (``arrived``: `perfd launch`'s
line-times sidecar, microseconds; else the line's own millisecond stamp): a step line's step time is
the time since the previous step line of the same rank (or the start of training, or the last
validation line) ÷ the steps between them. The first step line of a rank follows start-up and
compilation: it is reported (its iterations are warm-up) but perfd's cross-check skips nothing.

Per-rank logs: with ``[rankN]:`` prefixes (several ranks' ``LOG_RANK`` in one stream, or one file
per rank) each rank's lines make that rank's records, timed against its own previous line; without
a prefix the records speak for the job (rank ``"last"``, as Megatron's last-rank lines do).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from perfd.core.bounds import LAYOUT_BOUNDS, in_bounds
from perfd.core.model import (
    TORCHTITAN_FRAMEWORK,
    JobInfo,
    ModelSpec,
    ParseIssue,
    Provenance,
    RankScope,
    StepRecord,
)

COLLECTOR = "torchtitan"
FRAMEWORK = TORCHTITAN_FRAMEWORK

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank(\d+)\]:")
_TITAN = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) - [^-]*? - ([A-Z]+) - (.*)$")
_STEP = re.compile(r"^step:\s*(\d+)\s+(.*)$")
_VALIDATE = re.compile(r"^validate step:\s*(\d+)\s+(.*)$")
_KV = re.compile(r"([a-z_]+):\s*(\S+)")
_MEMORY = re.compile(r"^([0-9.]+)GiB\(([0-9.]+)%\)$")
_VERSION = re.compile(r"^torchtitan version: (\S+)")
_MESH = re.compile(r"^Building device mesh with parallelism: (.*)$")
# 0.2.2 runs the model arguments on: "Building llama3 debugmodelwith {" (no space; JSON lines follow)
_BUILDING = re.compile(r"^Building (\S+) (\S+?)(?:\s?with \{.*)?$")
_SIZE = re.compile(r"size: ([0-9,]+) total parameters")
_PEAK = re.compile(r"^Peak FLOPS used for computing MFU: (\S+)")
_TRAINER = re.compile(r"^Trainer is initialized with local batch size (\d+), global batch size (\d+), "
                      r"gradient accumulation steps (\d+), sequence length (\d+), total steps (\d+)")
_STARTS = re.compile(r"^Training starts at step (\d+)")


def _num(text: str) -> float | None:
    """torchtitan's numbers: thousands separators (``12,345``), a trailing ``%``; None if not one."""
    try:
        return float(text.replace(",", "").rstrip("%"))
    except ValueError:
        return None


@dataclass
class _RankState:
    last_time: float | None = None  # when this rank's previous step (or start/validation) line printed
    last_step: int | None = None
    run_started: bool = False  # "Training starts at step N" printed since its last step line


@dataclass
class TorchtitanLogParser:
    """Feed it lines (with the time each was printed, when known); it returns StepRecords as step
    lines arrive and fills ``job_info`` as the start-up block goes by. Never raises on input: a line
    it cannot use is counted (``counts``) and, when it looked like a step line, kept in ``issues``."""

    job: str = "default"
    source_name: str = "torchtitan.log"
    spec: ModelSpec | None = None  # the model's shape (config): the log does not print it
    job_info: JobInfo = field(default_factory=lambda: JobInfo(framework=FRAMEWORK))
    counts: dict[str, int] = field(default_factory=dict)
    issues: list[ParseIssue] = field(default_factory=list)
    line_no: int = 0
    _ranks: dict[RankScope, _RankState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.spec is not None:
            self.job_info.spec = ModelSpec(**{**self.spec.__dict__})

    def _c(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def _issue(self, reason: str, text: str) -> None:
        self._c(f"issue:{reason}")
        if len(self.issues) < 1000:  # bounded: a log full of broken lines must not grow memory
            self.issues.append(ParseIssue(self.line_no, reason, text[:200]))

    def feed(self, line: str, arrived: float | None = None) -> list[StepRecord]:
        self.line_no += 1
        if "[titan]" not in line:
            return []
        text = _ANSI.sub("", line.rstrip("\r\n"))
        m = _RANK_PREFIX.match(text)
        rank: RankScope = int(m.group(1)) if m else "last"
        t = _TITAN.search(text)
        if t is None:
            self._c("unrecognised_prefix")
            return []
        stamp = arrived if arrived is not None else _local_time(t.group(1), t.group(2))
        if stamp is not None and (self.job_info.started_at is None or stamp < self.job_info.started_at):
            self.job_info.started_at = stamp  # the job's first line: goodput's start-up begins here
        msg = t.group(4).strip()
        self._c("lines")
        if msg.startswith("step:"):
            rec = self._step(msg, rank, stamp)
            return [rec] if rec is not None else []
        if msg.startswith("validate step:"):
            self._rank(rank).last_time = stamp  # torchtitan's own timer restarts after validation
            self._c("validation_lines")
            return []
        self._startup(msg, rank, stamp)
        return []

    def _rank(self, rank: RankScope) -> _RankState:
        st = self._ranks.get(rank)
        if st is None:
            st = self._ranks[rank] = _RankState()
        return st

    def _startup(self, msg: str, rank: RankScope, stamp: float | None) -> None:
        info, lay = self.job_info, self.job_info.layout
        if (m := _VERSION.match(msg)) is not None:
            info.framework_version = m.group(1)
        elif (m := _MESH.match(msg)) is not None:
            sizes = {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", m.group(1))}
            dp = sizes.get("dp_replicate", 1) * sizes.get("dp_shard", 1)
            world = dp * sizes.get("pp", 1) * sizes.get("cp", 1) * sizes.get("tp", 1)
            for key, value in (("world_size", world), ("dp", dp), ("pp", sizes.get("pp")),
                               ("cp", sizes.get("cp")), ("tp", sizes.get("tp")), ("ep", sizes.get("ep"))):
                if value is not None and in_bounds(value, *LAYOUT_BOUNDS[key]):
                    setattr(lay, key, value)
                elif value is not None:
                    self._issue("layout-out-of-bounds", msg)
        elif (m := _BUILDING.match(msg)) is not None:
            info.arguments["model"], info.arguments["flavor"] = m.group(1), m.group(2)
        elif (m := _SIZE.search(msg)) is not None and msg.startswith("Model "):
            n = _num(m.group(1))
            if n is not None:
                info.spec.parameter_count = int(n)
        elif (m := _PEAK.match(msg)) is not None:
            info.arguments["peak_flops"] = m.group(1)
        elif (m := _TRAINER.match(msg)) is not None:
            local, gbs, accum, seq, steps = (int(x) for x in m.groups())
            lay.micro_batch_size, lay.global_batch_size = local, gbs
            lay.num_microbatches = accum
            info.arguments.update({"local_batch_size": str(local), "global_batch_size": str(gbs),
                                   "gradient_accumulation_steps": str(accum), "seq_len": str(seq),
                                   "steps": str(steps)})
            info.spec.seq_length = seq
        elif (m := _STARTS.match(msg)) is not None:
            st = self._rank(rank)
            st.last_time, st.last_step = stamp, int(m.group(1)) - 1
            st.run_started = True

    def _step(self, msg: str, rank: RankScope, stamp: float | None) -> StepRecord | None:
        m = _STEP.match(msg)
        if m is None:
            self._issue("step-line-no-step-number", msg)
            return None
        step = int(m.group(1))
        kv = dict(_KV.findall(m.group(2)))
        fields = {k: v for k, v in kv.items()}
        st = self._rank(rank)
        step_ms: float | None = None
        interval: int | None = None
        timed = st.last_time is not None and stamp is not None and st.last_step is not None
        if timed and st.last_step is not None and step > st.last_step:
            assert st.last_time is not None and stamp is not None
            interval = step - st.last_step
            step_ms = (stamp - st.last_time) * 1e3 / interval
            if step_ms <= 0:
                self._issue("step-line-time-went-back", msg)
                step_ms = None
        elif st.last_step is not None and step <= st.last_step:
            self._c("step_not_increasing")  # a restart from a checkpoint: timing starts again
        st.last_time, st.last_step = stamp, step
        first_of_run, st.run_started = st.run_started, False
        mem = _MEMORY.match(kv.get("memory", ""))
        if mem is not None:
            fields["memory_max_reserved_gib"], fields["memory_max_reserved_pct"] = mem.group(1), mem.group(2)
        mfu_text = kv.get("mfu")
        if mfu_text is not None and _num(mfu_text) is not None:
            fields["mfu_pct"] = mfu_text.rstrip("%")
        self._c("steps")
        return StepRecord(
            job=self.job, iteration=step, rank=rank, end_time=stamp,
            train_iters=_int(self.job_info.arguments, "steps"),
            step_time_ms=step_ms, logged_tflops_per_gpu=_num(kv.get("tflops", "")),
            global_batch_size=self.job_info.layout.global_batch_size,
            lm_loss=_num(kv.get("loss", "")), grad_norm=_num(kv.get("grad_norm", "")), interval=interval,
            fields=fields, source=Provenance(COLLECTOR, f"{self.source_name}:{self.line_no}"),
            first_of_run=first_of_run)


def _int(d: dict[str, str], key: str) -> int | None:
    text = d.get(key)
    return int(text) if text is not None and text.isdigit() else None


def _local_time(date_time: str, millis: str) -> float | None:
    """Epoch seconds of torchtitan's asctime (the training host's local time, as the agent's is)."""
    try:
        return time.mktime(time.strptime(date_time, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1e3
    except (ValueError, OverflowError):
        return None
