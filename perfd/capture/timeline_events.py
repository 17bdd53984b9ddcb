"""A GPU timeline's activities, as every capture reader (Chrome trace, nsys SQLite) gives them and every
analysis of it (the breakdown, the sweep of a step's parts, the launch-by-launch replay) reads them: below
all of those, so none imports another to name them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelEvent:
    device: int
    start_ns: float
    end_ns: float
    name: str
    stream: int | None = None
    pid: int | None = None  # the process that launched it (attributes NVTX ranges to devices)
    corr: int | None = None  # the correlation id of the runtime call that launched it
    grid: tuple[int, int, int] | None = None  # its launch's grid (x: a row-per-block layer norm's rows)
    block: tuple[int, int, int] | None = None  # and block: with the grid, what an ncu launch is matched on


@dataclass(frozen=True)
class MemEvent:
    device: int
    start_ns: float
    end_ns: float
    kind: str = "memcpy"  # memcpy | memset
    stream: int | None = None
    pid: int | None = None
    name: str = ""  # the tool's name for it ("Memcpy DtoD (Device -> Device)"), when it gives one
    corr: int | None = None
