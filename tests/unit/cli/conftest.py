"""The workspace of the bad-input table, built once for all its files."""

from __future__ import annotations

import pytest

from tests.unit.cli.bad_inputs import Workspace


@pytest.fixture(scope="session")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("bad-inputs"))
