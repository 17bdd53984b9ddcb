"""The mutation spot-check's mutations still name code that is there (tools/mutation_check.py; its run is
`make mutation-check`): a snippet changed or gone fails here, in the suite, not first in that run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "tools" / "mutation_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutation_check", mod)  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


TOOL = _tool()


@pytest.mark.parametrize("m", TOOL.MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_names_one_place_in_its_file_and_existing_tests(m) -> None:
    assert TOOL.locate(m, ROOT) > 0
    assert m.replacement != m.original


def test_a_snippet_that_drifted_is_an_error_naming_it(tmp_path: Path) -> None:
    m = TOOL.MUTATIONS[0]
    (tmp_path / m.path).parent.mkdir(parents=True)
    (tmp_path / m.path).write_text("nothing of the snippet\n")
    with pytest.raises(TOOL.MutationError, match=f"mutation '{m.name}'.*not found in {m.path}"):
        TOOL.locate(m, tmp_path)
