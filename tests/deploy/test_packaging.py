"""What `pip install` puts on a machine (`perfd-slurm-run`, which example.sbatch calls,
was once not installed by pip). The real wheel is built from the checkout's files and installed into a folder;
it carries the license and none of the tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from perfd import __version__

ROOT = Path(__file__).resolve().parents[2]


def _source_tree(dest: Path) -> Path:
    """What a clone has that the build reads, copied without this checkout's own build products (a
    stale ``build/`` or ``*.egg-info`` from an earlier build would put its files in the wheel too): the
    packages with their tests folders, the top-level tests' and benchmarks' modules (not their data)."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("perfd", "rules"):
        shutil.copytree(ROOT / name, dest / name, ignore=skip)
    (dest / "deploy" / "slurm").mkdir(parents=True)
    shutil.copy2(ROOT / "deploy" / "slurm" / "perfd-slurm-run", dest / "deploy" / "slurm")
    for name in ("tests", "benchmarks"):
        (dest / name).mkdir()
        for f in (ROOT / name).glob("*.py"):
            shutil.copy2(f, dest / name / f.name)
    return dest


def test_the_packages_are_perfd_with_its_collectors_without_their_tests() -> None:
    """setuptools' discovery as pyproject.toml configures it: no ``tests`` or ``benchmarks`` package
    (perfd/collectors/<name>/tests are packages, for the suite); the license file named."""
    from setuptools.config.pyprojecttoml import read_configuration  # type: ignore[import-untyped]

    cfg = read_configuration(ROOT / "pyproject.toml")
    packages = cfg["tool"]["setuptools"]["packages"]
    assert "perfd" in packages and "perfd.collectors.megatron" in packages, packages
    # what is left out
    assert (ROOT / "perfd" / "collectors" / "megatron" / "tests" / "__init__.py").is_file()
    assert not [p for p in packages if {"tests", "benchmarks", "examples"} & set(p.split("."))], packages
    assert cfg["project"]["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().split()[:6] == ["Apache", "License", "Version", "2.0,",
                                                           "January", "2004"]


@pytest.mark.slow
def test_pip_installs_perfd_slurm_run_and_the_rule_packs(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    src = _source_tree(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(src)], check=True, timeout=300, capture_output=True)
    (wheel,) = wheels.glob("perfd-*.whl")
    assert wheel.name.startswith(f"perfd-{__version__}-"), (wheel.name, __version__)  # one declaration
    names = zipfile.ZipFile(wheel).namelist()
    # No tests, no benchmarks: neither the top-level folders nor perfd/collectors/<name>/tests and their data
    assert not [n for n in names if {"tests", "benchmarks"} & set(n.split("/")[:-1])], \
        [n for n in names if "tests" in n][:10]
    assert "perfd/app/cli.py" in names and "perfd/collectors/megatron/collector.py" in names
    info = f"perfd-{__version__}.dist-info"
    assert zipfile.ZipFile(wheel).read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
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
