"""Regenerate ``perfd/transport/gen/`` from ``perfd.proto``: ``python -m perfd.transport.regen``.

See perfd/core/protogen.py for the method. ``tests/transport/test_transport_regen.py`` fails when the
committed files are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from perfd.core.protogen import ProtoPackage, regen_main

HERE = Path(__file__).resolve().parent
PACKAGE = ProtoPackage(HERE / "perfd.proto", HERE / "gen", "python -m perfd.transport.regen")
GEN_DIR = PACKAGE.gen_dir
GENERATED = PACKAGE.generated
generate = PACKAGE.generate
stale_files = PACKAGE.stale_files

if __name__ == "__main__":
    sys.exit(regen_main(PACKAGE, description=__doc__))
