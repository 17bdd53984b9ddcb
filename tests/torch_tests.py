"""For the test modules that run torch in the pytest process: skipped where torch is not installed,
torch itself imported by the fixtures and tests that use it, not at the module's import. Every pytest
process (each xdist worker) imports every test module at collection, `make test-fast` too, where these
modules (all marked slow) are deselected: importing torch there cost each worker ~4 s of CPU of its
~10 s of collection (2-core machine, 2026-11-26)."""

from __future__ import annotations

import importlib.util

import pytest

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (CPU torch, the dev extra)")
