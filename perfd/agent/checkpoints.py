"""The agent's --state-dir: one small JSON file per collector with where it can resume.

A collector puts a checkpoint (its position: a log tail's offset, say) in its output
(perfd.collectors.collector.Collected.checkpoint). A restarted agent must resume after the data it had made
safe and before the data it had not: resuming too early sends records again, too late loses them.
"Safe" is the spool's word (``Spool.settled``): the batch is on disk in a segment, acknowledged by
the aggregator, or dropped by the spool's cap (counted there).

Two steps, so that a kill -9 at any point neither loses nor repeats a record:

1. Just before the batch that carries the collector's new data is appended to the spool (under the
   client's lock, with the batch's seq known: ``AgentClient.submit(on_seq=...)``), the file is
   written with the new position *pending* on that seq, beside the *base* position (the newest one
   whose batches were all safe).
2. At start-up the file is resolved against the spool: the base, advanced through the pending
   positions in order while their batches are safe. A kill between the file and the spool leaves
   the pending batch unsafe (the old position: nothing was sent); one after leaves it safe (the new
   position: nothing is read again).

Pending positions fold into the base as their batches become safe (each later save). A batch
held only in memory (the disk refused it) is not safe: the base waits for it, and a restart reads
its data again rather than lose it. At most MAX_PENDING positions wait; beyond, the middle ones are
dropped (a restart then resumes earlier: records sent again, never lost). With no spool (no
aggregator) a position is its own base.

Files are replaced atomically (temp file, fsync, rename): a kill -9 leaves the old file or the new
one, never half of one. A file of the first format (the bare position) is read as a base. A file of
a format above FORMAT was written by a newer perfd: :class:`CheckpointTooNew` stops the agent's
start-up (exit 2, the file untouched) rather than read it as a bare position, which lost the resume
point (``resume:unreadable 'position'``) and read the log again from its start.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from perfd import __version__
from perfd.core.privdir import private_dir

log = logging.getLogger(__name__)

FORMAT = 2  # raise it with every change an older agent would read lossy (its files stop that one)
MAX_PENDING = 64  # positions waiting for their batches (a full disk holds batches in memory)


class CheckpointTooNew(ValueError):
    """A checkpoint file of a newer perfd's format: not read, not overwritten; the agent stops."""


@dataclass
class _State:
    # A position is the collector's own (JSON-able) mapping: kept and handed back as it is.
    base: dict[str, object] | None = None
    pending: list[tuple[int, dict[str, object]]] = field(default_factory=list)  # (seq, position), seq order


class Checkpoints:
    def __init__(self, directory: str | Path, settled: Callable[[int], bool] | None = None) -> None:
        """``settled(seq)``: the spool's word on whether batch ``seq`` is safe (None: no spool)."""
        self.dir = Path(directory)
        private_dir(self.dir)  # ours, 0700, no link: another user's folder is refused
        self.settled = settled
        self.write_errors = 0
        self._states: dict[str, _State] = {}

    def _path(self, name: str) -> Path:
        return self.dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.checkpoint.json"

    def load(self, name: str) -> dict[str, object] | None:
        """Where collector ``name`` resumes: the base, advanced through the pending positions whose
        batches the spool holds safe."""
        try:
            obj = json.loads(self._path(name).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("checkpoint of collector %s unreadable (%s): it starts afresh", name, exc)
            return None
        if not isinstance(obj, dict):
            return None
        found = obj.get("format")
        if isinstance(found, int) and not isinstance(found, bool) and found > FORMAT:
            raise CheckpointTooNew(
                f"{self._path(name)} is a checkpoint of format {found}, written by a newer perfd; this "
                f"perfd {__version__} reads format {FORMAT} and older. Refusing to start rather than "
                "resume at the wrong place; the file is left as it is. Run the perfd that wrote it (or "
                "a newer one), or move the state directory away to read the logs from their start.")
        if found != FORMAT:
            st = _State(base=obj)  # the first format: the position itself
        else:
            base = obj.get("base")
            pending = [(p[0], p[1]) for p in obj.get("pending") or []
                       if isinstance(p, list) and len(p) == 2 and isinstance(p[0], int)
                       and isinstance(p[1], dict)]
            st = _State(base if isinstance(base, dict) else None, pending)
        self._fold(st)
        self._states[name] = st
        return st.base

    def save(self, name: str, position: dict[str, object], seq: int | None = None) -> bool:
        """Collector ``name`` has reached ``position``; ``seq``: the spool batch about to carry what
        it covers (None: nothing to send, it rides on the batches already pending)."""
        st = self._states.setdefault(name, _State())
        self._fold(st)
        if seq is None:
            seq = st.pending[-1][0] if st.pending else None
        if seq is None or self.settled is None:
            st.base, st.pending = position, []
        else:
            if st.pending and st.pending[-1][0] == seq:
                st.pending[-1] = (seq, position)  # a newer position on the same batch
            else:
                st.pending.append((seq, position))
            if len(st.pending) > MAX_PENDING:
                del st.pending[1]
        doc = {"format": FORMAT, "base": st.base, "pending": [list(p) for p in st.pending]}
        return self._write(name, doc)

    def _fold(self, st: _State) -> None:
        """Pending positions whose batches are safe, in order, become the base."""
        while st.pending and self.settled is not None and self.settled(st.pending[0][0]):
            st.base = st.pending.pop(0)[1]

    def _write(self, name: str, doc: Mapping[str, object]) -> bool:
        path = self._path(name)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with tmp.open("w") as fh:
                json.dump(doc, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except (OSError, TypeError, ValueError) as exc:  # a full disk: counted, the agent goes on
            self.write_errors += 1
            log.warning("could not save the checkpoint of collector %s: %s", name, exc)
            return False
        return True
