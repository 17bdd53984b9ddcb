"""Tests marked `gpu` need a real NVIDIA GPU: they run only with PERFD_GPU_TESTS=1 (never in CI)."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PERFD_GPU_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="needs a GPU: set PERFD_GPU_TESTS=1 on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
