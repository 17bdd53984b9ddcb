"""Regenerate ``perfd/exporters/prompb/gen/`` from ``remote.proto``.

``python -m perfd.exporters.prompb.regen_remote``.

See perfd/core/protogen.py for the method. ``tests/test_remote_write.py`` fails when the committed files
are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from perfd.core.protogen import ProtoPackage, regen_main

HERE = Path(__file__).resolve().parent
PACKAGE = ProtoPackage(HERE / "remote.proto", HERE / "gen", "python -m perfd.exporters.prompb.regen_remote",
                       grpc=False)
GEN_DIR = PACKAGE.gen_dir
stale_files = PACKAGE.stale_files

if __name__ == "__main__":
    sys.exit(regen_main(PACKAGE, description=__doc__))
