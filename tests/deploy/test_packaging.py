"""What `pip install` puts on a machine (issue 56 item 7: `perfd-slurm-run`, which example.sbatch calls,
was not installed by pip). The real wheel is built from the checkout and installed into a folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from perfd import __version__

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_pip_installs_perfd_slurm_run_and_the_rule_packs(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True, timeout=300, capture_output=True)
    (wheel,) = wheels.glob("perfd-*.whl")
    assert wheel.name.startswith(f"perfd-{__version__}-"), (wheel.name, __version__)  # one declaration
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".data/scripts/perfd-slurm-run") for n in names), names[:20]
    assert any(n.endswith("share/perfd/rules/default.yaml") for n in names)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(target), str(wheel)], check=True, timeout=300, capture_output=True)
    script = target / "bin" / "perfd-slurm-run"
    assert script.is_file() and os.access(script, os.X_OK)
    assert script.read_bytes() == (ROOT / "deploy" / "slurm" / "perfd-slurm-run").read_bytes()


def test_the_version_is_declared_once_and_repeated_where_it_cannot_be_read() -> None:
    """perfd/__init__.py declares it; pyproject reads it from there; the chart and the plain manifests
    cannot import it, so they repeat it, and here each must say the same."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "perfd.__version__"}
    chart = yaml.safe_load((ROOT / "deploy" / "helm" / "perfd" / "Chart.yaml").read_text())
    assert chart["appVersion"] == chart["version"] == __version__
    tags = {m for p in [*(ROOT / "deploy").rglob("*.yaml"), ROOT / "Dockerfile", ROOT / "README.md"]
            for m in re.findall(r"\bperfd:(\d+\.\d+\.\d+)\b", p.read_text())}
    assert tags == {__version__}, tags


def test_the_image_installs_the_engine_client_perfd_engine_pins():
    """The Dockerfile names each of perfd[engine]'s packages (nats-py, ddsketch) with a version
    (hadolint DL3013 wants one for each package): the one perfd[engine] pins, so the image's engine is
    the one the tests ran."""
    import re

    m = re.search(r'^engine = \[(.*)\]$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert m, "no engine extra in pyproject.toml"
    pins = [d.strip().strip('"') for d in m.group(1).split(",")]
    assert any("nats-py" in p for p in pins) and any("ddsketch" in p for p in pins), pins
    for pin in pins:
        assert re.search(rf'"{re.escape(pin)}"', (ROOT / "Dockerfile").read_text()), pin


def test_the_image_installs_a_remote_write_snappy_perfd_accepts():
    """The Dockerfile names cramjam with a version (DL3013), one perfd[remote-write] accepts: without it
    the container's aggregator refuses --remote-write (the chart's aggregator.remoteWrite)."""
    import re

    from packaging.specifiers import SpecifierSet

    m = re.search(r'^remote-write = \[(.*)\]', (ROOT / "pyproject.toml").read_text(), re.M)
    assert m, "no remote-write extra in pyproject.toml"
    (spec,) = [d.strip().strip('"').removeprefix("cramjam") for d in m.group(1).split(",") if "cramjam" in d]
    pinned = re.search(r'"cramjam==([0-9.]+)"', (ROOT / "Dockerfile").read_text())
    assert pinned and pinned.group(1) in SpecifierSet(spec), (spec, pinned)
