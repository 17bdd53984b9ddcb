"""The committed generated code matches perfd.proto and imports with the installed protobuf."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_not_stale():
    pytest.importorskip("grpc_tools")
    from perfd.transport.regen import GEN_DIR, stale_files

    stale = stale_files(GEN_DIR)
    assert not stale, (f"{stale} in {GEN_DIR} differ from a fresh generation: "
                       "run `python -m perfd.transport.regen` and commit the result")


def test_generated_code_imports_with_installed_protobuf():
    # A fresh interpreter: the runtime version check in perfd_pb2 runs at import time.
    code = ("from perfd.transport.gen import perfd_pb2, perfd_pb2_grpc\n"
            "import google.protobuf\n"
            "m = perfd_pb2.AgentMessage(batch=perfd_pb2.Batch(seq=3, values=[1.0]))\n"
            "assert perfd_pb2.AgentMessage.FromString(m.SerializeToString()).batch.seq == 3\n"
            "assert hasattr(perfd_pb2_grpc, 'IngestStub')\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
