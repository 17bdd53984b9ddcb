"""Download torchtitan 0.3.0 and every wheel it needs beyond torch into a directory, for a GPU
machine without network (tests/gpu/torchtitan_live.py --install installs from it).

    python3 tests/gpu/torchtitan_wheels.py .whl [--python 3.12] [--part-mib 55] [--have FILE]
                                               [--torchtitan 0.2.2]

Left out: torch (and what only torch needs: triton, nvidia-*, cuda-*), which the GPU machine has,
and wandb with what only it needs (torchtitan imports it only when W&B logging is on). Each
requirement is fetched with ``pip download --no-deps`` for the target Python and manylinux x86_64,
its wheel's METADATA read for the next requirements (markers evaluated for that Python on Linux,
extras not taken). ``--torchtitan`` picks the release: 0.3.0 imports
``torch.distributed.fsdp.DataParallelMeshDims``, which torch 2.11 lacks, so a machine with torch 2.11
needs 0.2.2 (same log format; its CLI takes ``--model.*`` / ``--training.*`` flags instead of
``--module/--config``). ``--have FILE`` names packages the GPU machine already holds (one name per line,
``pip list --format freeze`` output works): they are left out too, which brings the closure from
~160 MiB (pyarrow, pandas, numpy...) to a few MiB, one call's carry. The wheels are then split
into DIR/part1, DIR/part2, ... of at most
``--part-mib`` MiB each (what one call to the GPU machine may carry), installed one part per call.
Prints the closure as name==version lines and writes them to DIR/requirements.txt.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

SKIP = ("torch", "triton", "wandb")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def _skip(name: str, have: set[str]) -> bool:
    n = canonicalize_name(name)
    return n in SKIP or n in have or n.startswith(("nvidia-", "cuda-"))


def _requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--python", default="3.12")
    ap.add_argument("--part-mib", type=float, default=55.0)
    ap.add_argument("--torchtitan", default="0.3.0", help="torchtitan release (0.2.2 for torch 2.11)")
    ap.add_argument("--have", type=Path, help="packages the GPU machine already has, one per line")
    args = ap.parse_args()
    have: set[str] = set()
    if args.have is not None:
        for line in args.have.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                have.add(canonicalize_name(line.split("==")[0].strip()))
    dest: Path = args.dest
    dest.mkdir(parents=True, exist_ok=True)
    env = {
        **default_environment(),
        "python_version": args.python,
        "python_full_version": f"{args.python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    todo = [Requirement(f"torchtitan=={args.torchtitan}")]
    done: dict[str, str] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in done or _skip(name, have):
            continue
        platforms = [a for p in PLATFORMS for a in ("--platform", p)]
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            args.python,
            *platforms,
            "-d",
            str(dest),
            str(req),
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wheel = max(
            (w for w in dest.glob("*.whl") if canonicalize_name(parse_wheel_filename(w.name)[0]) == name),
            key=lambda w: w.stat().st_mtime,
        )
        done[name] = str(parse_wheel_filename(wheel.name)[1])
        for text in _requirements(wheel):
            r = Requirement(text)
            if r.marker is None or r.marker.evaluate(env):
                todo.append(r)
    lines = [f"{n}=={v}" for n, v in sorted(done.items())]
    (dest / "requirements.txt").write_text("\n".join(lines) + "\n")
    wheels = sorted(
        (w for w in dest.glob("*.whl") if canonicalize_name(parse_wheel_filename(w.name)[0]) in done),
        key=lambda w: -w.stat().st_size,
    )
    parts: list[list[Path]] = []
    sizes: list[int] = []
    limit = int(args.part_mib * (1 << 20))
    for w in wheels:  # first fit, largest first
        size = w.stat().st_size
        i = next((k for k, s in enumerate(sizes) if s + size <= limit), None)
        if i is None:
            parts.append([])
            sizes.append(0)
            i = len(parts) - 1
        parts[i].append(w)
        sizes[i] += size
    for i, ws in enumerate(parts, start=1):
        d = dest / f"part{i}"
        d.mkdir(exist_ok=True)
        for w in ws:
            shutil.move(str(w), d / w.name)
        print(f"# {d}: {len(ws)} wheels, {sizes[i - 1] / (1 << 20):.1f} MiB", file=sys.stderr)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
