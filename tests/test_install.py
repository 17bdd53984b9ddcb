"""`pip install perfd` and `make demo` bring no torch: the runtime dependencies name none, and the
demo's venv installs perfd without extras (its own venv, not the dev one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower()


def test_runtime_dependencies_have_no_torch() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    assert runtime and not runtime & {"torch", "pytorch", "triton", "nvidia-cudnn-cu12"}
    extras = project["optional-dependencies"]
    # torch only where asked for: the hook's extra and the test tools.
    assert [k for k, reqs in extras.items() if "torch" in {_name(r) for r in reqs}] == ["torch", "dev"]


def test_make_demo_installs_perfd_without_extras_in_its_own_venv() -> None:
    mk = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo: (.+)$", mk, re.M)
    assert demo and "setup" not in demo.group(1)  # not the dev venv (which has CPU torch for tests)
    install = re.search(r"^\$\(DEMO_VENV\)/\.installed:.*?(?=^\S)", mk, re.M | re.S)
    assert install and "pip install -q -e . " in install.group(0) and "[dev]" not in install.group(0)
    # pip's progress and warnings go to a log: the first run's screen starts with the demo itself
    assert all(">" in ln for ln in install.group(0).splitlines() if "pip install" in ln)


def test_pyproject_license_is_an_spdx_expression_without_deprecation_warnings() -> None:
    """setuptools >= 77 warns (four times per install) about `license = { text = ... }`: the
    SPDX string form, with a build requirement that knows it."""
    import warnings

    from setuptools.config.pyprojecttoml import read_configuration  # type: ignore[import-untyped]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = read_configuration(ROOT / "pyproject.toml")
    assert cfg["project"]["license"] == "Apache-2.0"
    assert not [w for w in caught if "license" in str(w.message).lower()], [str(w.message) for w in caught]
    assert "setuptools>=77" in cfg["build-system"]["requires"]
