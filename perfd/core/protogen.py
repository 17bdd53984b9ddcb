"""Generating Python code from a .proto, the one way this project does it.

``grpc_tools.protoc`` from the pinned ``grpcio-tools`` dev dependency (so the code matches the
protobuf/grpc versions the project pins), with ``.pyi`` stubs for mypy, then the grpc module's bare
``import X_pb2`` made package-relative (grpc's plugin assumes the output directory is on sys.path).
Each generated package has a tiny ``regen`` module calling :func:`regen_main`, and a test that
fails when the committed files differ from a fresh generation (:func:`stale_files`).
"""

from __future__ import annotations

import argparse
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProtoPackage:
    proto: Path  # the .proto file; its directory is the include path
    gen_dir: Path  # where the committed generated code lives
    command: str  # how to regenerate, for the generated __init__ and --help
    grpc: bool = True  # False for messages only (no service, no _pb2_grpc module)

    @property
    def stem(self) -> str:
        return self.proto.stem

    @property
    def generated(self) -> tuple[str, ...]:
        s = self.stem
        return ("__init__.py", f"{s}_pb2.py", f"{s}_pb2.pyi", *((f"{s}_pb2_grpc.py",) if self.grpc else ()))

    def generate(self, out_dir: Path) -> list[Path]:
        """Write the generated modules into ``out_dir`` and return their paths."""
        from grpc_tools import protoc  # dev-only dependency: imported here, not at module import

        out_dir.mkdir(parents=True, exist_ok=True)
        # The include path is the proto's own directory, so the descriptor is registered under the
        # file's bare name and the generated modules import each other by bare name (fixed below).
        proto_include = str(Path(protoc.__file__).resolve().parent / "_proto")
        args = ["grpc_tools.protoc", f"-I{self.proto.parent}", f"-I{proto_include}",
                f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                *([f"--grpc_python_out={out_dir}"] if self.grpc else []), str(self.proto)]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit status {rc}: {' '.join(args)}")
        s = self.stem
        (out_dir / "__init__.py").write_text(
            f'"""Generated from {self.proto.name} by `{self.command}`. Do not edit."""\n')
        if not self.grpc:
            return [out_dir / name for name in self.generated]
        grpc_py = out_dir / f"{s}_pb2_grpc.py"
        fixed, n = re.subn(rf"^import {s}_pb2 as (\w+)$", rf"from . import {s}_pb2 as \1",
                           grpc_py.read_text(), flags=re.M)
        if n != 1:
            raise RuntimeError(f"did not find the `import {s}_pb2` line to fix in {grpc_py.name}")
        grpc_py.write_text(fixed)
        return [out_dir / name for name in self.generated]

    def stale_files(self, gen_dir: Path | None = None) -> list[str]:
        """Names of the generated files that differ from a fresh generation."""
        gen = gen_dir or self.gen_dir
        with tempfile.TemporaryDirectory() as tmp:
            self.generate(Path(tmp))
            fresh = Path(tmp)
            return [name for name in self.generated
                    if not (gen / name).exists() or (gen / name).read_bytes() != (fresh / name).read_bytes()]


def regen_main(pkg: ProtoPackage, argv: list[str] | None = None, description: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=pkg.command, description=description)
    parser.add_argument("--out", type=Path, default=pkg.gen_dir,
                        help="output directory (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only report stale files; exit 1 if any")
    ns = parser.parse_args(argv)
    if ns.check:
        stale = pkg.stale_files(ns.out)
        for name in stale:
            print(f"stale: {ns.out / name}")
        return 1 if stale else 0
    for path in pkg.generate(ns.out):
        print(f"wrote {path}")
    return 0
