"""The agent-side torchtitan collector: tails the job's log and parses it as it grows."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path

from perfd.collectors.collector import Capabilities, Collected, Collector
from perfd.collectors.config_values import as_int
from perfd.collectors.megatron.gaps import TailGaps
from perfd.collectors.megatron.tail import LogTail
from perfd.collectors.torchtitan.parser import TorchtitanLogParser
from perfd.core.dtypes import normalize_dtype
from perfd.core.linetimes import LineTimes
from perfd.core.model import JobInfo, ModelSpec

_KNOWN = {"path", "job", "from_start", "line_times", "model", "dtype", "max_bytes_per_collect"}


def model_spec(cfg: Mapping[str, object]) -> ModelSpec:
    """The model's shape from the config's ``model`` mapping (and ``dtype``): torchtitan's log does
    not print it, and perfd's FLOPs count needs it. Unknown keys are errors that name them."""
    raw = cfg.get("model") or {}
    if not isinstance(raw, dict):
        raise ValueError("perfd.collectors.torchtitan.model must be a mapping of ModelSpec fields")
    known = {f.name for f in dataclasses.fields(ModelSpec)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"collectors.torchtitan.model: unknown key(s) {unknown}; known: {sorted(known)}")
    spec = ModelSpec(**raw)
    dtype = cfg.get("dtype")
    if dtype is not None:
        if normalize_dtype(str(dtype)) is None:
            raise ValueError(f"collectors.torchtitan.dtype {dtype!r} is not a known dtype "
                             "(bf16, fp16, fp8, fp32)")
        spec.dtype = str(dtype)
    return spec


class TorchtitanCollector(Collector):
    """Config: ``path`` (required: the job's stdout log), ``job`` (default: the agent's job),
    ``from_start`` (default true: the start-up block says the layout and batch), ``line_times`` (the
    `perfd launch` sidecar: step times from when each line was printed, to the microsecond, instead
    of the log's millisecond stamps), ``model`` (the model's shape, ModelSpec fields: num_layers,
    hidden_size, ffn_hidden_size, num_attention_heads, kv_channels, num_query_groups,
    padded_vocab_size, swiglu — the log does not print them), ``dtype`` (the training dtype, for the
    peak: torchtitan trains in bf16 mixed precision by default; the log does not say)."""

    name = "torchtitan"
    default_interval_s = 0.5

    def __init__(self, config: Mapping[str, object]) -> None:
        super().__init__()
        unknown = set(config) - _KNOWN - {"resume"}
        if unknown:
            raise ValueError(f"torchtitan: unknown config key(s) {sorted(unknown)}; known: {sorted(_KNOWN)}")
        if not config.get("path"):
            raise ValueError("perfd.collectors.torchtitan.path is required (the job's log file)")
        self.path = str(config["path"])
        self.job = str(config.get("job") or "default")
        self.from_start = bool(config.get("from_start", True))
        self.max_bytes_per_collect = as_int(config.get("max_bytes_per_collect", 4 << 20))
        self.parser = TorchtitanLogParser(self.job, Path(self.path).name, model_spec(config))
        lt = config.get("line_times")
        self.line_times = LineTimes(str(lt)) if lt else None
        self.tail: LogTail | None = None
        self.gaps = TailGaps(self.name, self.path, self.job, self.count_error)  # lost log: LOG_GAP events
        self._sent_info: JobInfo | None = None
        self._tail_errors_seen: dict[str, int] = {}
        self._issues_seen = 0

    def probe(self) -> Capabilities:
        exists = Path(self.path).exists()  # a log that does not exist yet is normal: the tail waits
        return Capabilities(True, "" if exists else f"{self.path} does not exist yet; waiting",
                            {"file_exists": exists})

    def start(self) -> None:
        self.tail = LogTail(self.path, from_start=self.from_start)

    def collect(self, now: float) -> Collected:
        out = Collected()
        if self.tail is None:
            return out
        lines = self.tail.read_lines_at(max_bytes=self.max_bytes_per_collect)
        for reason, n in self.tail.errors.items():
            for _ in range(n - self._tail_errors_seen.get(reason, 0)):
                self.count_error(f"tail:{reason}", self.path)
            self._tail_errors_seen[reason] = n
        out.events.extend(self.gaps.events(self.tail))
        lt = self.line_times
        for line, offset in lines:
            arrived = lt.time_for(offset) if lt is not None and "[titan]" in line else None
            out.steps.extend(self.parser.feed(line, arrived))
        for issue in self.parser.issues[self._issues_seen:]:
            self.count_error(f"parse:{issue.reason}", f"line {issue.line_no}: {issue.text[:80]}")
        self._issues_seen = len(self.parser.issues)
        info = self.parser.job_info
        if info.framework_version is not None and info != self._sent_info:
            self._sent_info = copy.deepcopy(info)
            out.job_info[self.job] = self._sent_info
        return out

    def stop(self) -> None:
        if self.tail is not None:
            self.tail.close()
