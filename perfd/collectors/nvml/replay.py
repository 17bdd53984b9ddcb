"""Play an NVML recording (``perfd.collectors.nvml.record``) back as if it were live.

Frames come out with their original timing relative to the first collect (optionally faster, and
optionally looped), stamped with the replay's own clock. Every sample and event carries the label
``replay="1"``: one extra, bounded label that makes a replayed number impossible to mistake for a
measured one on a dashboard.

File format (JSON lines, version 1):
  {"type": "header", "version": 1, "driver": ..., "nvml": ..., "devices": [{index, uuid, name,
   memory_total, gpm_supported}], "interval_s": ..., "recorded_at": ...}
  {"type": "collect", "t": seconds since start, "time": epoch, "phase": "matmul" (optional),
   "samples": [{"name", "labels", "value"}], "events": [...]}
  {"type": "footer", ...} (optional: call counts and costs; ignored here)
Unknown line types are skipped, so later versions can add lines.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from perfd.collectors.collector import Capabilities, Collected, Collector
from perfd.collectors.config_values import as_float
from perfd.core.events import REPLAY_FINISHED
from perfd.core.model import Sample

REPLAY_LABEL = ("replay", "1")
FORMAT_VERSION = 1


@dataclass
class Frame:
    t: float
    phase: str | None
    samples: list[tuple[str, dict[str, str], float]]
    events: list[dict[str, object]] = field(default_factory=list)
    time: float | None = None  # epoch seconds when recorded

    def value(self, name: str, **labels: str) -> float | None:
        """The first sample named ``name`` whose labels include ``labels``; None when absent."""
        for n, lbl, v in self.samples:
            if n == name and all(lbl.get(k) == x for k, x in labels.items()):
                return v
        return None


class ReplaySource:
    """A parsed recording: header and frames in time order."""

    def __init__(self, header: dict[str, object], frames: list[Frame],
                 footer: dict[str, object] | None = None):
        self.header = header
        self.frames = frames
        self.footer = footer

    @property
    def interval_s(self) -> float:
        return as_float(self.header.get("interval_s") or 1.0)

    @property
    def start_t(self) -> float:
        return self.frames[0].t if self.frames else 0.0

    @property
    def duration_s(self) -> float:
        """From the first frame to the last."""
        return self.frames[-1].t - self.start_t if self.frames else 0.0

    @property
    def devices(self) -> list[dict[str, object]]:
        """The recorded devices (record.py: index, uuid, name, memory_total, gpm_supported...)."""
        devices = self.header.get("devices")
        return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []

    def phases(self) -> list[str]:
        seen: list[str] = []
        for f in self.frames:
            if f.phase is not None and f.phase not in seen:
                seen.append(f.phase)
        return seen

    def medians_by_phase(self, gpu: str | None = None,
                         skip_first_s: float = 0.0) -> dict[str, dict[str, float]]:
        """Per phase, the median of each metric of GPU ``gpu`` (all GPUs pooled when None; labelled
        series appear as ``name{reason}`` / ``name{type}``). ``skip_first_s`` drops the start of
        each phase: GPM windows and NVML's own averaging straddle a phase change."""
        values: dict[str, dict[str, list[float]]] = {}
        phase_start: dict[str, float] = {}
        for f in self.frames:
            if f.phase is None:
                continue
            start = phase_start.setdefault(f.phase, f.t)
            if f.t - start < skip_first_s:
                continue
            per = values.setdefault(f.phase, {})
            for name, labels, value in f.samples:
                if gpu is not None and labels.get("gpu") != gpu:
                    continue
                key = name if "reason" not in labels and "type" not in labels else (
                    f"{name}{{{labels.get('reason') or labels.get('type')}}}")
                per.setdefault(key, []).append(value)
        return {ph: {k: statistics.median(v) for k, v in per.items()} for ph, per in values.items()}

    @classmethod
    def load(cls, path: str | Path) -> ReplaySource:
        """Parse a recording. Raises OSError or ValueError (with the line number) for a bad file."""
        header: dict[str, object] | None = None
        footer: dict[str, object] | None = None
        frames: list[Frame] = []
        with open(path, encoding="utf-8") as fh:
            for no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"line {no}: not JSON ({exc})") from None
                rec: dict[str, object] = obj if isinstance(obj, dict) else {}  # not a record: no type
                kind = rec.get("type")
                if header is None:
                    if kind != "header":
                        raise ValueError(f"line {no}: the first line must be the header")
                    if rec.get("version") != FORMAT_VERSION:
                        raise ValueError(f"unsupported recording version {rec.get('version')!r}")
                    header = rec
                elif kind == "collect":
                    frames.append(_frame(rec, no))
                elif kind == "footer":
                    footer = rec
        if header is None:
            raise ValueError("empty recording (no header)")
        frames.sort(key=lambda f: f.t)
        return cls(header, frames, footer)


def entries(value: object) -> list[object]:
    """A record's list (absent or empty: none); anything else is a TypeError."""
    if not value:
        return []
    if not isinstance(value, list):
        raise TypeError(f"a list expected, not {type(value).__name__}")
    return value


def _sample(s: object) -> tuple[str, dict[str, str], float]:
    if not isinstance(s, dict):
        raise TypeError(f"a sample is a mapping, not {type(s).__name__}")
    labels = s.get("labels") or {}
    if not isinstance(labels, dict):
        raise TypeError(f"a sample's labels are a mapping, not {type(labels).__name__}")
    return str(s["name"]), {str(k): str(v) for k, v in labels.items()}, as_float(s["value"])


def _frame(rec: dict[str, object], no: int) -> Frame:
    try:
        samples = [_sample(s) for s in entries(rec.get("samples"))]
        events = [e for e in entries(rec.get("events")) if isinstance(e, dict)]
        phase = rec.get("phase")
        when = rec.get("time")
        return Frame(t=as_float(rec["t"]), phase=str(phase) if phase is not None else None,
                     samples=samples, events=events, time=as_float(when) if when is not None else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"line {no}: bad collect record ({exc!r})") from None


class NvmlReplay:
    """Replay state for ``NvmlCollector`` with ``source: replay:FILE``."""

    def __init__(self, owner: Collector, path: str, loop: bool = False, speed: float = 1.0) -> None:
        self.owner = owner
        self.path = path
        self.loop = loop
        self.speed = speed
        self.source: ReplaySource | None = None
        self.caps: Capabilities | None = None
        self.current_phase: str | None = None
        self.finished = False
        self._anchor: float | None = None
        self._cycle = 0
        self._pos = 0

    def probe(self) -> Capabilities:
        if self.caps is not None:
            return self.caps
        try:
            self.source = ReplaySource.load(self.path)
        except (OSError, ValueError) as exc:
            self.caps = Capabilities(available=False, reason=f"nvml replay file {self.path}: {exc}")
            return self.caps
        if not self.source.frames:
            self.caps = Capabilities(available=False, reason=f"nvml replay file {self.path}: no frames")
            return self.caps
        self.caps = Capabilities(available=True, features={
            "replay": True, "gpm": any(d.get("gpm_supported") for d in self.source.devices)})
        return self.caps

    def collect(self, now: float) -> Collected:
        out = Collected()
        if not self.probe().available or self.source is None or self.finished:
            return out
        if self._anchor is None:
            self._anchor = now
        src = self.source
        # One cycle lasts the recording plus one interval, so a loop's first frame follows the
        # last one at the recorded pace.
        period = src.duration_s + src.interval_s
        elapsed = (now - self._anchor) * self.speed
        due: list[tuple[Frame, float]] = []
        while True:
            if self._pos >= len(src.frames):
                if not self.loop:
                    self.finished = True
                    break
                self._cycle += 1
                self._pos = 0
            frame = src.frames[self._pos]
            at = self._cycle * period + frame.t - src.start_t
            if at > elapsed:
                break
            self._pos += 1
            due.append((frame, at))
        # After a long stall (collect called too rarely), emit the newest frames only.
        budget = len(src.frames)
        if len(due) > budget:
            self.owner.count_error("replay-frames-skipped", f"{len(due) - budget} frames: collect too rare")
            due = due[-budget:]
        for frame, at in due:
            self._emit(frame, self._anchor + at / self.speed, out)
        if self.finished:
            out.events.append({"kind": REPLAY_FINISHED.name, "severity": "info", "time": now,
                               "labels": {REPLAY_LABEL[0]: REPLAY_LABEL[1]},
                               "text": f"nvml replay of {self.path} reached its end"})
        return out

    def _emit(self, frame: Frame, t: float, out: Collected) -> None:
        self.current_phase = frame.phase
        key, val = REPLAY_LABEL
        for name, labels, value in frame.samples:
            out.samples.append(Sample(name=name, value=value, time=t, labels={**labels, key: val}))
        for ev in frame.events:
            given = ev.get("labels")
            labels = {**(given if isinstance(given, dict) else {}), key: val}
            out.events.append({**ev, "time": t, "labels": labels})
