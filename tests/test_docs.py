"""Docs that are generated from code must not go stale."""

from pathlib import Path

from perfd.app.commands.catalog_docs import doc_text, render_markdown
from perfd.core import catalog

ROOT = Path(__file__).resolve().parents[1]


def test_metrics_doc_is_the_catalog():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    table = render_markdown()
    assert table in doc, "docs/metrics.md is stale: run `make docs`"
    for name in catalog.names():
        assert f"`{name}`" in doc
    # All of it is generated: the labels' closed sets and the registry's classes, parts and grades too
    assert doc == doc_text(), "docs/metrics.md is stale: run `make docs`"


def test_no_doc_counts_the_classes_by_hand():
    """A class count written by hand went stale once (8 where the enum had 9): the count and the list
    are docs/metrics.md's, generated; the other docs point there."""
    import re

    for f in (ROOT / "docs").glob("*.md"):
        if f.name != "metrics.md":
            said = re.findall(r"\b(\d+|seven|eight|nine|ten) (?:bottleneck )?classes\b", f.read_text())
            assert not said, (f.name, said)


def test_readme_shows_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_and_makefile_agree_on_the_test_workers():
    """The README said TEST_WORKERS=4 while the Makefile ran 6: the number is the
    Makefile's, and the README repeats it."""
    import re

    make = (ROOT / "Makefile").read_text()
    (workers,) = re.findall(r"^TEST_WORKERS \?= (\d+)$", make, re.M)
    said = set(re.findall(r"TEST_WORKERS=(\d+)", (ROOT / "README.md").read_text()))
    assert said == {workers}, (said, workers)
    assert re.search(r"pytest .*-n \$\(TEST_WORKERS\).*--durations=\d+", make)
