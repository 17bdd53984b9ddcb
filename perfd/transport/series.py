"""The series a sample names, and the agent's table that gives each one a small integer id.

A series (metric name + bounded labels) gets a small integer id from the agent's
:class:`SeriesTable`. A batch carries the definitions of the series first used since the previous
batch; every new stream starts with the whole table in its Hello, because a batch resent after a
reconnect (or after an agent restart) may use ids whose definition travelled in a batch that was
acknowledged and dropped long ago. Ids are stable for the life of the agent's spool (the table
is journalled next to it), so a resent batch always means what it meant when it was encoded.

Apart from the batch codec (perfd.transport.codec) because the table is state with a journal on
disk, not a conversion: the codec, the client and the aggregator's stores each use it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from perfd.core.model import LabelSet, label_set
from perfd.transport.gen import perfd_pb2 as pb

log = logging.getLogger(__name__)

SeriesKey = tuple[str, LabelSet]


class Series(NamedTuple):
    """One series' definition: its name and its labels as sorted (name, value) pairs — the one
    form every layer keys on (a Series is a SeriesKey), made once when the definition is read."""

    name: str
    labels: LabelSet


class SeriesTable:
    """Agent side: (name, labels) → small integer id, stable for the life of the spool.

    With ``path`` the definitions are journalled (one JSON line per series, appended when the id
    is assigned, i.e. before any batch using it is spooled), so that after an agent restart the
    batches still in the spool decode to the same series. A torn last line is skipped and counted.
    """

    def __init__(self, path: Path | None = None) -> None:
        self._ids: dict[SeriesKey, int] = {}
        self._defs: list[Series] = []
        self._new: list[int] = []
        self._path = path
        self.journal_errors = 0  # lines that failed to load or to write
        if path is not None and path.exists():
            self._load(path)

    def __len__(self) -> int:
        return len(self._defs)

    def _load(self, path: Path) -> None:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    obj = json.loads(line)
                    sid, name = int(obj["id"]), str(obj["name"])
                    labels = label_set(dict(obj["labels"]))
                except (ValueError, KeyError, TypeError):
                    self.journal_errors += 1
                    continue
                if sid != len(self._defs):  # ids are dense and in order; anything else is damage
                    self.journal_errors += 1
                    continue
                self._defs.append(Series(name, labels))
                self._ids[(name, labels)] = sid
        if self.journal_errors:
            # Rewrite without the damaged lines: appending after a torn line would tear the next.
            try:
                path.write_text("".join(self._line(i) for i in range(len(self._defs))))
            except OSError:
                pass

    def _line(self, sid: int) -> str:
        s = self._defs[sid]
        return json.dumps({"id": sid, "name": s.name, "labels": dict(s.labels)}) + "\n"

    def _add(self, key: SeriesKey) -> int:
        sid = len(self._defs)
        series = Series(*key)
        self._ids[key] = sid
        self._defs.append(series)
        self._new.append(sid)
        if self._path is not None:
            try:
                with self._path.open("a", encoding="utf-8") as f:
                    f.write(self._line(sid))
            except OSError as e:  # a full disk must not stop sampling: counted, table kept in memory
                self.journal_errors += 1
                log.warning("series journal write failed (%s); ids stay valid until restart", e)
        return sid

    def id_for(self, name: str, labels: Mapping[str, str] | None = None) -> int:
        key: SeriesKey = (name, label_set(labels) if labels else ())
        sid = self._ids.get(key)
        return self._add(key) if sid is None else sid

    def series(self, sid: int) -> Series:
        return self._defs[sid]

    def take_new(self) -> list[int]:
        """Ids assigned since the previous call (their definitions go into the next batch)."""
        new, self._new = self._new, []
        return new

    def untake(self, ids: Iterable[int]) -> None:
        """Put ids back as new (their batch was not sent after all), ahead of later ones."""
        self._new[:0] = list(ids)

    def definitions(self, ids: Iterable[int] | None = None) -> list[pb.SeriesDef]:
        """Wire definitions of ``ids`` (default: every series, for a Hello)."""
        which = range(len(self._defs)) if ids is None else ids
        return [pb.SeriesDef(id=i, name=self._defs[i].name, labels=dict(self._defs[i].labels)) for i in which]

    def clear(self) -> None:
        """Forget every id (ids restart at 0). Only safe when no spooled batch references them."""
        self._ids.clear()
        self._defs.clear()
        self._new.clear()
        if self._path is not None:
            try:
                self._path.write_text("")
            except OSError:
                self.journal_errors += 1
