"""Regenerate ``collectors/k8s/gen/`` from ``podresources_v1.proto``:
``python -m perfd.collectors.k8s.regen_podresources``.

See perfd/core/protogen.py for the method. ``collectors/k8s/tests/test_podresources.py`` fails when the
committed files are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from perfd.core.protogen import ProtoPackage, regen_main

HERE = Path(__file__).resolve().parent
PACKAGE = ProtoPackage(HERE / "podresources_v1.proto", HERE / "gen",
                       "python -m perfd.collectors.k8s.regen_podresources")
GEN_DIR = PACKAGE.gen_dir
GENERATED = PACKAGE.generated
generate = PACKAGE.generate
stale_files = PACKAGE.stale_files

if __name__ == "__main__":
    sys.exit(regen_main(PACKAGE, description=__doc__))
