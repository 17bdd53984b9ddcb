"""What a collector's checkpoint file on disk says (perfd.agent.checkpoints, format 2): the base
position and the positions pending on spool batches, read by the tests that kill -9 an agent."""

from __future__ import annotations

import json
from pathlib import Path


def offsets(path: Path) -> list[int]:
    """The log offsets the file names, base first, then the pending ones in seq order: a restarted
    agent resumes at one of them (the last whose batches the spool holds safe)."""
    doc = json.loads(path.read_text())
    assert doc.get("format") == 2, doc
    positions = [doc["base"]] if doc.get("base") else []
    positions += [p for _, p in doc.get("pending") or []]
    return [int(p["position"]["offset"]) for p in positions]
