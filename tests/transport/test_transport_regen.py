"""The committed generated code matches perfd.proto and imports with the installed protobuf."""

from __future__ import annotations

import pytest


def test_generated_code_is_not_stale():
    pytest.importorskip("grpc_tools")
    from perfd.transport.regen import GEN_DIR, stale_files

    stale = stale_files(GEN_DIR)
    assert not stale, (f"{stale} in {GEN_DIR} differ from a fresh generation: "
                       "run `python -m perfd.transport.regen` and commit the result")


def test_generated_code_imports_with_installed_protobuf():
    # The runtime version check in perfd_pb2 runs at its import: in this process, at this import or at
    # an earlier one. An import that raised leaves no module behind, so importing again runs the check
    # again and raises again: the import below succeeds exactly when the check passes with the installed
    # protobuf, as a fresh interpreter's would.
    import google.protobuf  # noqa: F401

    from perfd.transport.gen import perfd_pb2, perfd_pb2_grpc

    m = perfd_pb2.AgentMessage(batch=perfd_pb2.Batch(seq=3, values=[1.0]))
    assert perfd_pb2.AgentMessage.FromString(m.SerializeToString()).batch.seq == 3
    assert hasattr(perfd_pb2_grpc, "IngestStub")
