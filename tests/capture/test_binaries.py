"""The capture tools' binary lookup (perfd.capture.binaries): the environment variable first (and it
must name an executable), then PATH, then the known install locations, best first; else an error that
says how to fix it. Exercised through find_ncu, whose known locations are versioned folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfd.capture import ncu_exec
from perfd.capture.ncu_exec import NcuNotFoundError, find_ncu


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_variable_then_path_then_the_newest_install(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ncu_exec, "NCU_GLOB", str(tmp_path / "opt" / "*" / "ncu"))
    monkeypatch.delenv("PERFD_NCU", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(NcuNotFoundError, match=r"ncu not found: set PERFD_NCU, put ncu on PATH, or install "
                                                r"Nsight Compute \(looked for .*opt/\*/ncu\)"):
        find_ncu()
    _exe(tmp_path / "opt" / "2025.3.1" / "ncu")
    newest = _exe(tmp_path / "opt" / "2025.10.0" / "ncu")  # 10 > 3: versions compare as numbers
    (tmp_path / "opt" / "2026.1.0").mkdir()  # a version folder without the binary
    assert find_ncu() == str(newest)
    on_path = _exe(tmp_path / "bin" / "ncu")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert find_ncu() == str(on_path)
    mine = _exe(tmp_path / "mine" / "ncu")
    monkeypatch.setenv("PERFD_NCU", str(mine))
    assert find_ncu() == str(mine)
    mine.chmod(0o644)
    with pytest.raises(NcuNotFoundError, match=r"PERFD_NCU=.* is not an executable file"):
        find_ncu()
