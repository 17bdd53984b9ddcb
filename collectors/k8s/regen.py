"""Regenerate ``collectors/k8s/gen/`` from ``podresources_v1.proto``: ``python -m collectors.k8s.regen``.

Same method as ``perfd/transport/regen.py``: ``grpc_tools.protoc`` from the pinned ``grpcio-tools``
dev dependency, then the grpc module's bare import made package-relative.
``collectors/k8s/tests/test_podresources.py`` fails when the committed files are stale.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "podresources_v1.proto"
GEN_DIR = HERE / "gen"
GENERATED = ("__init__.py", "podresources_v1_pb2.py", "podresources_v1_pb2.pyi",
             "podresources_v1_pb2_grpc.py")

INIT_TEXT = '''"""Generated from podresources_v1.proto by `python -m collectors.k8s.regen`. Do not edit."""
'''


def generate(out_dir: Path) -> list[Path]:
    """Write the generated modules into ``out_dir`` and return their paths."""
    from grpc_tools import protoc  # dev-only dependency

    out_dir.mkdir(parents=True, exist_ok=True)
    proto_include = str(Path(protoc.__file__).resolve().parent / "_proto")
    args = ["grpc_tools.protoc", f"-I{HERE}", f"-I{proto_include}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", str(PROTO)]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit status {rc}: {' '.join(args)}")
    grpc_py = out_dir / "podresources_v1_pb2_grpc.py"
    fixed, n = re.subn(r"^import podresources_v1_pb2 as (\w+)$", r"from . import podresources_v1_pb2 as \1",
                       grpc_py.read_text(), flags=re.M)
    if n != 1:
        raise RuntimeError("did not find the `import podresources_v1_pb2` line in the grpc module")
    grpc_py.write_text(fixed)
    (out_dir / "__init__.py").write_text(INIT_TEXT)
    return [out_dir / name for name in GENERATED]


def stale_files(gen_dir: Path = GEN_DIR) -> list[str]:
    """Names of the generated files in ``gen_dir`` that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [name for name in GENERATED
                if not (gen_dir / name).exists()
                or (gen_dir / name).read_bytes() != (Path(tmp) / name).read_bytes()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectors.k8s.regen", description=__doc__)
    parser.add_argument("--out", type=Path, default=GEN_DIR)
    parser.add_argument("--check", action="store_true", help="only report stale files; exit 1 if any")
    ns = parser.parse_args(argv)
    if ns.check:
        stale = stale_files(ns.out)
        for name in stale:
            print(f"stale: {ns.out / name}")
        return 1 if stale else 0
    for path in generate(ns.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
