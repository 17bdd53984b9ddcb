"""What the capture manager and its per-tool runs (:mod:`perfd.capture.kineto_capture`,
:mod:`perfd.capture.nsys_capture`) share: the context a run works in (store, clock, stop flag, event
sink), the failure that ends a run with a status, and how a rank's analysis is kept in the manifest
and summarised for events. Apart so that the runs record results exactly as the manager does without
importing the manager (imports go manager → runs → here).
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from perfd.analytics.breakdown.device_breakdown import CaptureAnalysis
from perfd.capture.analysis import TraceEmpty
from perfd.capture.chrome_trace import analyze_chrome_trace
from perfd.capture.request import CaptureRequest
from perfd.capture.store import CaptureStore, Manifest
from perfd.capture.trace_input import TraceRefused
from perfd.core.events import CAPTURE_STARTED
from perfd.core.model import CaptureFailure

log = logging.getLogger(__name__)

STARTED = CAPTURE_STARTED.name
# A device breakdown travels whole in the capture's events but for its tables (the aggregator's
# diagnosis reads every number: a list of kept keys here once dropped the idle-gap split on the way).
_TABLE_KEYS = frozenset({"top_kernels", "nvtx"})
PART_KERNEL_NAME = 160  # characters of a kernel's name kept in an event (ATen names run to thousands)

# (kind, request, text, severity, capture id, payload) -> None: the manager's event emitter
EventSink = Callable[[str, CaptureRequest, str, str, str, "Mapping[str, object] | None"], None]
# (reason, detail) -> None: counts a refusal of the agent's (a rank's trace past its caps) under its
# reason, logged once (CaptureManager.count_error)
ErrorCounter = Callable[[str, str], None]


def _uncounted(reason: str, detail: str) -> None:
    log.warning("capture refusal %s: %s", reason, detail)


class CaptureFailed(Exception):
    """Ends a capture's run with a status (``failed``, ``timeout``, ``skipped``), its reason (for
    people) and its typed cause (for the aggregator: a target not ready yet is retried when it is,
    with no rule cooldown taken; perfd.core.model.CaptureFailure)."""

    def __init__(self, status: str, reason: str, cause: CaptureFailure = CaptureFailure.FAILED) -> None:
        super().__init__(reason)
        self.status, self.reason, self.cause = status, reason, cause


def not_ready(reason: str, status: str = "failed") -> CaptureFailed:
    """The failure of a capture whose target cannot take it yet
    (perfd.core.model.CaptureFailure.NOT_READY)."""
    return CaptureFailed(status, reason, CaptureFailure.NOT_READY)


@dataclass(frozen=True)
class RunContext:
    """The manager's parts a tool's run uses: its store and clock, how long a file must stay unchanged
    to count as written (``settle_s``), the flag set when the manager closes, its event sink, and
    where a refusal is counted."""

    store: CaptureStore
    clock: Callable[[], float]
    settle_s: float
    closing: threading.Event
    emit: EventSink
    count_error: ErrorCounter = _uncounted


def _rounded(v: object) -> object:
    if isinstance(v, float):
        return round(v, 4)
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return {k: _rounded(x) for k, x in v.items()} if isinstance(v, dict) else v


def device_summary(analysis: CaptureAnalysis) -> list[dict[str, object]]:
    """The per-device numbers of an analysis, without the kernel and NVTX tables (event payloads)."""
    out = []
    for dev in analysis.devices:
        row = {k: _rounded(v) for k, v in dev.to_json().items() if k not in _TABLE_KEYS}
        if dev.complete is not None and dev.complete.part_op_ms:
            # the budget reads each part's ops from the complete steps (capture_budget): the span's
            # copy would only add to the event, which carries every rank's devices
            row.pop("part_op_ms", None)
        row["part_kernels"] = {p: [{**k.to_json(share=False), "name": k.name[:PART_KERNEL_NAME]} for k in ks]
                               for p, ks in dev.part_kernels.items()}
        if dev.top_kernels:
            row["top_kernel"] = dev.top_kernels[0].name[:120]
        out.append(row)
    return out


def record_analysis(m: Manifest, rank: int, fn: Callable[[], CaptureAnalysis],
                    passes: type[Exception] | tuple[type[Exception], ...] = ()) -> None:
    """Run ``fn`` and keep its analysis (with the event summary) under the rank, or the error it raised
    (but ``passes``, raised on to the caller)."""
    t0 = time.monotonic()
    try:
        a = fn()
        m.setdefault("analysis", {})[str(rank)] = {**a.to_json(), "summary": device_summary(a)}
        log.info("capture %s rank %d: analysed in %.1f s", m.get("id"), rank, time.monotonic() - t0)
    except passes:
        raise
    except Exception as exc:
        m.setdefault("analysis", {})[str(rank)] = {"error": f"{type(exc).__name__}: {exc}"[:500]}


# One trace read at a time in this process: what a read may take is bounded per trace (perfd.core.limits
# MAX_TRACE_*: up to ~1.6 GB for the worst JSON accepted), and the captures of a node's ranks run in
# threads of their own, so concurrent reads would multiply it.
_TRACE_READS = threading.Lock()


class TraceMissKind(enum.Enum):
    """Why a rank's trace, written and taken in, gives no analysis (the capture's status counts it
    as the rank's miss)."""

    REFUSED = "refused"  # past a cap of the reader's (perfd.capture.trace_input), counted
    EMPTY = "empty"  # nothing perfd reads in it (perfd.capture.analysis.TraceEmpty)


@dataclass(frozen=True)
class TraceMiss:
    kind: TraceMissKind
    text: str  # the sentence the capture's reason shows


def record_trace(ctx: RunContext, m: Manifest, rank: int, path: Path) -> TraceMiss | None:
    """Analyse a rank's Kineto trace into the manifest (record_analysis); None once kept. A trace the
    reader refuses (perfd.capture.trace_input: the job's process wrote it, and it is past a cap) keeps
    no analysis and is counted under its reason; one that holds no timed event keeps none either: the
    rank's miss, typed, with its sentence for the capture's reason."""
    try:
        with _TRACE_READS:
            record_analysis(m, rank, functools.partial(analyze_chrome_trace, path),
                            passes=(TraceRefused, TraceEmpty))
    except TraceRefused as exc:
        ctx.count_error(exc.reason, f"capture {m.get('id')} rank {rank}: {path.name}: {exc}")
        return TraceMiss(TraceMissKind.REFUSED, f"rank {rank}: its trace {path.name} was {exc}")
    except TraceEmpty as exc:
        log.warning("capture %s rank %d: %s: %s", m.get("id"), rank, path.name, exc)
        return TraceMiss(TraceMissKind.EMPTY, f"rank {rank}: {exc} ({path.name}, kept)")
    return None
