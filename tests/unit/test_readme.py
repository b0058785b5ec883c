"""README.md is the front page, not the guide (issue 36): short, with the two commands CI and users
rely on, and every link in it reaching a file. The docs site checks its own links (`mkdocs build
--strict` in scripts/test.sh); GitHub renders README.md outside it, so nothing else would."""

from __future__ import annotations

import re

from tests.conftest import REPO

README = REPO / "README.md"


def test_readme_is_short_and_names_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "README.md is the front page: move the detail into docs/"
    assert "bash scripts/quickstart.sh" in text and "bash scripts/test.sh" in text


def test_readme_links_reach_files() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "README.md links to no docs page"
    assert [t for t in local if not (REPO / t).exists()] == []
