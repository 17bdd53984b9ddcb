"""A real CPU quota for a test process: a child cgroup with a CFS bandwidth limit, cgroup v2 where
the machine delegates the cpu controller to its root, else v1's cpu controller (a Kubernetes node
on cgroup v1 throttles the same way). Raises OSError (the test skips, saying why) where neither can
be made — not root, no writable hierarchy. Nothing is faked: the kernel throttles the process.
"""

from __future__ import annotations

import os
from pathlib import Path

from perfd.collectors.ranks import procfs

PERIOD_US = 100_000


class CpuQuota:
    def __init__(self, path: Path, version: int) -> None:
        self.path, self.version = path, version
        self._home: dict[int, Path] = {}

    def add(self, pid: int) -> None:
        """Move ``pid`` into the cgroup (its previous cgroup is remembered for :meth:`remove`)."""
        d = procfs.cgroup_dirs(pid, procfs.read_mounts())
        home = (d.v2 if self.version == 2 else d.v1_cpu) if d is not None else None
        self._home[pid] = Path(home) if home else self.path.parent
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self, pid: int) -> None:
        try:
            (self._home.pop(pid, self.path.parent) / "cgroup.procs").write_text(str(pid))
        except OSError:  # gone already
            pass

    def close(self) -> None:
        for pid in list(self._home):
            self.remove(pid)
        try:
            for line in (self.path / "cgroup.procs").read_text().split():
                (self.path.parent / "cgroup.procs").write_text(line)
        except OSError:
            pass
        try:
            self.path.rmdir()
        except OSError:
            pass

    def __enter__(self) -> CpuQuota:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cpu_quota_cgroup(name: str, cores: float) -> CpuQuota:
    """A new cgroup ``name`` limited to ``cores`` CPUs. OSError when none can be made here."""
    mounts = procfs.read_mounts()
    quota = int(cores * PERIOD_US)
    tried = []
    if mounts.v2 is not None:
        root = Path(mounts.v2)
        try:
            if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
                raise OSError(f"cgroup v2 at {root} does not delegate the cpu controller "
                              "(cgroup.subtree_control)")
            path = root / name
            path.mkdir()
            try:
                (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            except OSError:
                path.rmdir()
                raise
            return CpuQuota(path, 2)
        except OSError as exc:
            tried.append(f"v2: {exc}")
    cpu = mounts.v1.get("cpu")
    if cpu is not None:
        path = Path(cpu) / name
        try:
            path.mkdir()
            try:
                (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (path / "cpu.cfs_quota_us").write_text(str(quota))
            except OSError:
                path.rmdir()
                raise
            return CpuQuota(path, 1)
        except OSError as exc:
            tried.append(f"v1 ({cpu}): {exc}")
    else:
        tried.append("v1: no cpu controller mounted")
    raise OSError("; ".join(tried) + (f" (uid {os.geteuid()})" if hasattr(os, "geteuid") else ""))
