"""Log lost before it was read, as LOG_GAP events: for every collector that tails a log with
collectors.megatron.tail.LogTail (Megatron-LM, torchtitan, SGLang), so that a lost stretch is always
counted and raised, never silent.

What the tail counts and this turns into one event per change:
- a truncation or a rewrite (a new run writing the same start-up block) whose unread part no
  ``<log>.1`` held: ``truncations_unread``, ``unread_bytes`` (a lower bound when
  ``unread_unknown``), ``rewrites``;
- a rotation generation never read (two rotations between two reads): ``missed_generations``;
- a checkpoint whose file is gone at a restart (the agent's --state-dir; the caller says so with
  :meth:`TailGaps.lost_at_resume`).
The tail's falling behind (``skips``) stays with the Megatron collector, which closes its pending
iteration there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from perfd.collectors.megatron.tail import LogTail
from perfd.core.events import LOG_GAP

log = logging.getLogger(__name__)

_WATCHED = ("truncations_unread", "missed_generations")


class TailGaps:
    """``count_error(reason, detail)``: the collector's own error counter (perfd.collectors.collector)."""

    def __init__(self, name: str, path: str, job: str, count_error: Callable[[str, str], None]) -> None:
        self.name, self.path, self.job = name, path, job
        self.count_error = count_error
        self._seen: dict[str, int] = dict.fromkeys(_WATCHED, 0)
        self._resume_offset: int | None = None

    def lost_at_resume(self, offset: int) -> None:
        """The checkpoint named a file the path no longer names and no ``<log>.1`` holds: what was
        written after ``offset`` of the old file was not read (said at the next :meth:`events`)."""
        self._resume_offset = offset

    def events(self, tail: LogTail) -> list[dict[str, object]]:
        """LOG_GAP events for what the tail lost since the last call (counted as ``tail:unread_lost``)."""
        out = []
        name = Path(self.path).name
        if self._resume_offset is not None:
            at, self._resume_offset = self._resume_offset, None
            what = (f"{self.path} is not the file of the checkpoint (rotated, truncated or rewritten by a "
                    f"new run while the agent was down) and no {name}.1 holds it: what was written after "
                    f"byte {at} of the old file, if anything, was not read")
            out.append(self._event(what, {"path": self.path, "checkpoint_offset": at, "cause": "resume"}))
        c = tail.counts
        now = {k: c.get(k, 0) for k in _WATCHED}
        if now != self._seen:
            new = {k: now[k] - self._seen[k] for k in _WATCHED}
            self._seen = now
            unread, unknown = c.get("unread_bytes", 0), c.get("unread_unknown", 0)
            parts = []
            if new["truncations_unread"]:
                rewrites = c.get("rewrites", 0)
                parts.append("truncated (copytruncate or '>')" + (
                    f" or rewritten by a new run ({rewrites} in all)" if rewrites else "")
                    + f" with no {name}.1 holding its unread part")
            if new["missed_generations"]:
                parts.append(f"rotated {new['missed_generations']} more time(s) before it was read "
                             f"(a whole generation of the log never read)")
            bound = ("at least" if unknown else "") + f" {unread} bytes in all"
            what = (f"{self.path} was {' and '.join(parts)}: what was written since the last read is lost "
                    f"({bound.strip()}"
                    + ("; what was written between the last read and the rotation cannot be known"
                       if unknown else "") + ")")
            out.append(self._event(what, {
                "path": self.path, "cause": "rotation" if not new["truncations_unread"] else "truncation",
                "truncations_unread": now["truncations_unread"],
                "missed_generations": now["missed_generations"],
                "rewrites": c.get("rewrites", 0), "unread_bytes_at_least": unread, "exact": not unknown}))
        return out

    def _event(self, what: str, payload: dict[str, object]) -> dict[str, object]:
        self.count_error("tail:unread_lost", what)
        log.warning("%s: %s", self.name, what)
        return {"kind": LOG_GAP.name, "severity": "warning", "time": time.time(), "job": self.job,
                "text": f"log lost before it was read: {what}", "payload": payload}
