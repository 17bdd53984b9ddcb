"""JobInfo <-> JSON text, for the wire (the agent sends it once per change) and for files."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from perfd.core.bounds import check_job_info
from perfd.core.model import JobInfo, ModelSpec, ParallelLayout, TimerValue


def job_info_to_json(info: JobInfo) -> str:
    d = dataclasses.asdict(info)
    # JSON object keys are strings: per-rank timer dicts have int keys; asdict keeps them, and
    # json.dumps turns them into strings, which _timer() turns back.
    return json.dumps(d, separators=(",", ":"), allow_nan=False)


def _timer(d: dict[str, Any]) -> TimerValue:
    return TimerValue(d.get("min_ms"), d.get("max_ms"),
                      {int(k): float(v) for k, v in (d.get("per_rank") or {}).items()})


def _fields(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """Only the keys the dataclass knows: a newer agent's extra fields are ignored, not fatal."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def job_info_from_json(text: str) -> JobInfo:
    """Raises ValueError on text that is not a JobInfo object; values outside perfd.core.bounds are
    removed silently (use :func:`decode_job_info` to count them)."""
    return decode_job_info(text)[0]


def decode_job_info(text: str) -> tuple[JobInfo, list[str]]:
    """The JobInfo of ``text`` with every value outside perfd.core.bounds removed (absent), and one
    reason per value removed. Raises ValueError (or TypeError) on text that is not a JobInfo."""
    d = json.loads(text)
    if not isinstance(d, dict):
        raise ValueError("job info JSON must be an object")
    for key in ("layout", "spec", "startup_timers", "packages"):
        if not isinstance(d.get(key) or {}, dict):  # a list here raised AttributeError
            raise ValueError(f"job info {key} must be an object")
    timers = d.get("startup_timers") or {}
    if not all(isinstance(v, dict) and isinstance(v.get("per_rank") or {}, dict) for v in timers.values()):
        raise ValueError("job info startup_timers must map names to timer objects")
    info = JobInfo(**_fields(JobInfo, {k: v for k, v in d.items()
                                       if k not in ("layout", "spec", "startup_timers")}))
    info.layout = ParallelLayout(**_fields(ParallelLayout, d.get("layout") or {}))
    info.spec = ModelSpec(**_fields(ModelSpec, d.get("spec") or {}))
    info.startup_timers = {k: _timer(v) for k, v in timers.items()}
    return info, check_job_info(info)
