"""The engine tests' one-cluster rig: a Rig (tests/engine/engine_driver) under the test's tmp_path,
everything it started ended at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.engine_driver import Rig, need_nats_server


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    need_nats_server()
    r = Rig(tmp_path / "rig")
    try:
        yield r
    finally:
        r.close()
