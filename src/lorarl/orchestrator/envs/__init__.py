"""Built-in environments, bridged libraries of tasks, and user environments by `package.module:factory`."""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable
from types import ModuleType
from typing import Any

from lorarl.orchestrator.envs.alphabet_sort import AlphabetSort
from lorarl.orchestrator.envs.base import Environment
from lorarl.orchestrator.envs.calculator import Calculator
from lorarl.orchestrator.envs.math_problems import MathProblems
from lorarl.orchestrator.envs.reverse_text import ReverseText
from lorarl.orchestrator.envs.search import Search
from lorarl.orchestrator.envs.unscramble import Unscramble

BUILTIN: dict[str, type[Environment]] = {
    env.name: env for env in (ReverseText, AlphabetSort, Unscramble, MathProblems, Search, Calculator)
}
# Libraries whose tasks are environments: "<prefix>:<task>" is one task, "<prefix>" alone takes
# its tasks from args. Each maps to the lorarl module that adapts it, with `check(task, args)`
# (no building) and `load(task, args)`; imported on first use, since it imports the library.
BRIDGES: dict[str, str] = {
    "reasoning_gym": "lorarl.orchestrator.envs.reasoning_gym_env",
    "verifiers": "lorarl.orchestrator.envs.verifiers_env",
}


def bridge(env_id: str) -> tuple[ModuleType, str | None] | None:
    """The adapting module and task of a bridged `env_id`, or None if it names no bridged library."""
    prefix, colon, task = env_id.partition(":")
    if prefix not in BRIDGES:
        return None
    return importlib.import_module(BRIDGES[prefix]), task if colon else None


def resolve_environment(env_id: str) -> Callable[..., Environment]:
    """The class or factory that `env_id` names, imported but not called: a built-in name
    (`reverse_text`) or `package.module:factory`, where factory is an Environment subclass or a
    Python function that returns one (so `os:system` and the like are refused, never run)."""
    if env_id in BUILTIN:
        return BUILTIN[env_id]
    if ":" not in env_id:
        raise ValueError(
            f"unknown environment {env_id!r}: built-ins are {sorted(BUILTIN)}, bridged libraries "
            f"{sorted(BRIDGES)} (as '<library>:<task>'), or give 'package.module:factory'"
        )
    module_name, factory_name = env_id.split(":", 1)
    factory = getattr(importlib.import_module(module_name), factory_name)
    if isinstance(factory, type) and issubclass(factory, Environment):
        return factory
    if not inspect.isfunction(factory):
        raise TypeError(f"{env_id} is a {type(factory).__name__}, not an Environment class or a function returning one")
    try:
        returns = typing.get_type_hints(factory).get("return")
    except Exception:  # hints that do not resolve here: the orchestrator checks what the factory returns
        returns = None
    if isinstance(returns, type) and not issubclass(returns, Environment):
        raise TypeError(f"{env_id} returns {returns.__name__}, not an Environment")
    return factory  # type: ignore[no-any-return]


def check_environment(env_id: str, args: dict[str, Any]) -> None:
    """What can be known of an environment without building it (building runs the user's code):
    that it resolves, and that its signature takes `args`; for a bridged library, that the task
    exists and `args` fit it."""
    if bridged := bridge(env_id):
        module, task = bridged
        module.check(task, args)
        return
    factory = resolve_environment(env_id)
    try:
        inspect.signature(factory).bind(**args)
    except TypeError as e:
        raise TypeError(f"args do not fit {getattr(factory, '__name__', env_id)}: {e}") from None
    except ValueError:  # a callable without a signature (a C function): checked when built
        pass


def load_environment(env_id: str, args: dict[str, Any] | None = None) -> Environment:
    """Build the environment `env_id` names with `args` (see `resolve_environment` and `BRIDGES`)."""
    if bridged := bridge(env_id):
        module, task = bridged
        env = module.load(task, args or {})
    else:
        env = resolve_environment(env_id)(**(args or {}))
    if not isinstance(env, Environment):
        raise TypeError(f"{env_id} returned {type(env).__name__}, not an Environment")
    return env
