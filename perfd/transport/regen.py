"""Regenerate ``perfd/transport/gen/`` from ``perfd.proto``: ``python -m perfd.transport.regen``.

Uses ``grpc_tools.protoc`` (the ``grpcio-tools`` dev dependency), so the generated code matches
the protobuf/grpc versions pinned in the environment. ``tests/transport/test_transport_regen.py`` runs
:func:`generate` into a temporary directory and fails when the committed files differ.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "perfd.proto"
GEN_DIR = HERE / "gen"
GENERATED = ("__init__.py", "perfd_pb2.py", "perfd_pb2.pyi", "perfd_pb2_grpc.py")

INIT_TEXT = '''"""Generated from perfd.proto by `python -m perfd.transport.regen`. Do not edit."""
'''


def generate(out_dir: Path) -> list[Path]:
    """Write the generated modules into ``out_dir`` and return their paths."""
    from grpc_tools import protoc  # dev-only dependency: imported here, not at module import

    out_dir.mkdir(parents=True, exist_ok=True)
    # The include path is the proto's own directory, so the descriptor is registered as
    # "perfd.proto" and the generated modules import each other by bare name (fixed below).
    proto_include = str(Path(protoc.__file__).resolve().parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{HERE}",
        f"-I{proto_include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit status {rc}: {' '.join(args)}")
    grpc_py = out_dir / "perfd_pb2_grpc.py"
    text = grpc_py.read_text()
    # grpc's plugin writes `import perfd_pb2 as perfd__pb2`, which only works with gen/ on
    # sys.path; the package-relative form works wherever perfd is installed.
    fixed, n = re.subn(r"^import perfd_pb2 as perfd__pb2$", "from . import perfd_pb2 as perfd__pb2",
                       text, flags=re.M)
    if n != 1:
        raise RuntimeError("did not find the `import perfd_pb2` line to fix in perfd_pb2_grpc.py")
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
    parser = argparse.ArgumentParser(prog="python -m perfd.transport.regen", description=__doc__)
    parser.add_argument("--out", type=Path, default=GEN_DIR, help="output directory (default: %(default)s)")
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
