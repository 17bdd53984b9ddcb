"""The agent's --state-dir: one small JSON file per collector with where it can resume.

A collector puts a checkpoint in its output (perfd.collector.Collected.checkpoint); the agent writes
it only once that output is in the spool (on disk with --spool-dir), so a restarted agent resumes
after data it had made durable and before data it had not. Files are replaced atomically (temp
file, fsync, rename): a kill -9 leaves the old checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from perfd.privdir import private_dir

log = logging.getLogger(__name__)


class Checkpoints:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        private_dir(self.dir)  # ours, 0700, no link: another user's folder is refused
        self.write_errors = 0

    def _path(self, name: str) -> Path:
        return self.dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.checkpoint.json"

    def load(self, name: str) -> dict[str, Any] | None:
        try:
            obj = json.loads(self._path(name).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("checkpoint of collector %s unreadable (%s): it starts afresh", name, exc)
            return None
        return obj if isinstance(obj, dict) else None

    def save(self, name: str, checkpoint: dict[str, Any]) -> bool:
        path = self._path(name)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with tmp.open("w") as fh:
                json.dump(checkpoint, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except (OSError, TypeError, ValueError) as exc:  # a full disk: counted, the agent goes on
            self.write_errors += 1
            log.warning("could not save the checkpoint of collector %s: %s", name, exc)
            return False
        return True
