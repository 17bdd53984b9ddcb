"""The engine tests' one-cluster rig: a Rig (tests/engine/engine_driver) under the test's tmp_path,
everything it started ended at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.engine_driver import Rig, rig_under


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from rig_under(tmp_path)
