"""Docs that are generated from code must not go stale."""

from pathlib import Path

from perfd import catalog

ROOT = Path(__file__).resolve().parents[1]


def test_metrics_doc_is_the_catalog():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    table = catalog.render_markdown()
    assert table in doc, "docs/metrics.md is stale: run `perfd catalog --markdown` and paste it"
    for name in catalog.names():
        assert f"`{name}`" in doc


def test_readme_shows_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_and_makefile_agree_on_the_test_workers():
    """The README said TEST_WORKERS=4 while the Makefile ran 6 (issue 37): the number is the
    Makefile's, and the README repeats it."""
    import re

    make = (ROOT / "Makefile").read_text()
    (workers,) = re.findall(r"^TEST_WORKERS \?= (\d+)$", make, re.M)
    said = set(re.findall(r"TEST_WORKERS=(\d+)", (ROOT / "README.md").read_text()))
    assert said == {workers}, (said, workers)
    assert re.search(r"pytest .*-n \$\(TEST_WORKERS\).*--durations=\d+", make)
