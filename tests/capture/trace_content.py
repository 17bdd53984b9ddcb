"""What a Kineto trace file holds, read here apart from perfd's reader: what perfd's verdict on a capture
of a real CPU torch job must be. Such a job's window can hold nothing (its profiler recorded no op while
the suite's load starved it: seen in CI), which perfd refuses as the rank's miss, and a test of the
capture's path asserts the verdict the file calls for, not a file the machine may not give."""

from __future__ import annotations

import json
from pathlib import Path


def holds_ops(path: str | Path) -> bool:
    """Whether the trace holds an event of the job's: a complete event other than the profiler's own span."""
    doc = json.loads(Path(path).read_text())
    return any(e.get("ph") == "X" and e.get("cat") != "Trace" for e in doc.get("traceEvents", []))
