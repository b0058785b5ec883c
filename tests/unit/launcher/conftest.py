"""A `Supervisor` of real processes whose logs go to the test's folder, every group stopped after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lorarl.launcher.supervisor import Supervisor


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    supervisor = Supervisor(tmp_path / "logs")
    yield supervisor
    supervisor.stop_all(grace=1)
