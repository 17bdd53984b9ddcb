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
    assert install and "pip install -q -e .\n" in install.group(0) and "[dev]" not in install.group(0)
