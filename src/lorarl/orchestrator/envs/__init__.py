"""Built-in environments and loading of user environments by `package.module:factory`."""

from __future__ import annotations

import importlib
from typing import Any

from lorarl.orchestrator.envs.alphabet_sort import AlphabetSort
from lorarl.orchestrator.envs.base import Environment
from lorarl.orchestrator.envs.math_problems import MathProblems
from lorarl.orchestrator.envs.reverse_text import ReverseText
from lorarl.orchestrator.envs.search import Search
from lorarl.orchestrator.envs.unscramble import Unscramble

BUILTIN: dict[str, type[Environment]] = {
    env.name: env for env in (ReverseText, AlphabetSort, Unscramble, MathProblems, Search)
}


def load_environment(env_id: str, args: dict[str, Any] | None = None) -> Environment:
    """A built-in name (`reverse_text`) or `package.module:factory` returning an Environment."""
    args = args or {}
    if env_id in BUILTIN:
        return BUILTIN[env_id](**args)
    if ":" not in env_id:
        raise ValueError(
            f"unknown environment {env_id!r}: built-ins are {sorted(BUILTIN)}, or give 'package.module:factory'"
        )
    module_name, factory_name = env_id.split(":", 1)
    env = getattr(importlib.import_module(module_name), factory_name)(**args)
    if not isinstance(env, Environment):
        raise TypeError(f"{env_id} returned {type(env).__name__}, not an Environment")
    return env
