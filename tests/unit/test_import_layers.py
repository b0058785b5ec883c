"""The packages import one way: the launcher and the console commands sit on top of the processes.

`rl` (cli) plans and starts the trainer, orchestrator and vLLM workers (launcher); those processes
must not reach back into the launcher or the CLI, or a worker would carry `rl`'s machinery (and
import cycles creep in). Every import counts, lazy ones inside functions too, so this reads the
source (ast) rather than what one interpreter happened to load.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "lorarl"
# package -> the lorarl packages it must never import
FORBIDDEN = {
    "trainer": ("launcher", "cli"),
    "orchestrator": ("launcher", "cli"),
    "inference": ("launcher", "cli"),
    "monitor": ("launcher", "cli"),
    "serve": ("launcher", "cli"),
    "config": ("launcher", "cli", "trainer", "orchestrator", "inference", "monitor"),
    "launcher": ("cli",),
}


def lorarl_imports(text: str, package: str) -> list[tuple[int, str]]:
    """(line, module) of every `lorarl...` import in source `text` of a module of `package` (dotted,
    for relative imports)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return [(line, m) for line, m in found if m.split(".")[0] == "lorarl"]


def violations(package: str) -> list[str]:
    forbidden = tuple(f"lorarl.{p}." for p in FORBIDDEN[package])
    return [
        f"{path.relative_to(SRC)}:{line} imports {module}"
        for path in sorted((SRC / package).rglob("*.py"))
        for line, module in lorarl_imports(path.read_text(), ".".join(path.relative_to(SRC.parent).parts[:-1]))
        if f"{module}.".startswith(forbidden)
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_never_imports_the_layers_above_it(package: str) -> None:
    assert not violations(package)


def test_the_check_sees_lazy_and_relative_imports() -> None:
    """The checker itself: an import inside a function and a relative one are both found."""
    text = "def f():\n    from lorarl.launcher.placement import visible_gpus\nfrom ..cli import rl\nimport os\n"
    found = sorted(m for _, m in lorarl_imports(text, "lorarl.inference"))
    assert found == ["lorarl.cli.rl", "lorarl.launcher.placement.visible_gpus"]
