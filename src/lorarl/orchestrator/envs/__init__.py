"""Built-in environments, bridged libraries of tasks, and user environments by `package.module:factory`.

A user's factory runs only if declared one (see `lorarl.plugins`): an Environment subclass, a function
annotated to return one, or a function marked `@lorarl.plugin("environment")`. Its args are checked
against its signature and annotations (by pydantic) before it is built, and converted as they say.
"""

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
from lorarl.plugins import PluginError, declared_kind, fit_args, how_to_declare, import_attribute

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
    function declared as a factory (annotated to return an Environment, or marked
    `@lorarl.plugin("environment")`); anything else (`os:system`, `shutil:rmtree`) is refused unrun."""
    if env_id in BUILTIN:
        return BUILTIN[env_id]
    if ":" not in env_id:
        raise ValueError(
            f"unknown environment {env_id!r}: built-ins are {sorted(BUILTIN)}, bridged libraries "
            f"{sorted(BRIDGES)} (as '<library>:<task>'), or give 'package.module:factory'"
        )
    factory = import_attribute(env_id)
    if isinstance(factory, type) and issubclass(factory, Environment):
        return factory
    returns = _return_type(factory) if inspect.isfunction(factory) else None
    returns_env = isinstance(returns, type) and issubclass(returns, Environment)
    if returns_env or (declared_kind(factory) == "environment" and not isinstance(returns, type)):
        return factory  # type: ignore[return-value]
    if declared_kind(factory) == "environment":
        raise PluginError(f"{env_id} returns {getattr(returns, '__name__', returns)}, not an Environment")
    how = how_to_declare(factory, "environment", " or annotate its return type as an Environment")
    raise PluginError(f"not an Environment class, and {how}")


def _return_type(fn: Callable[..., Any]) -> object:
    try:
        return typing.get_type_hints(fn).get("return")
    except Exception:  # hints that do not resolve here: no declaration by annotation
        return None


def check_environment(env_id: str, args: dict[str, Any]) -> None:
    """What can be known of an environment without building it (building runs the user's code):
    that it resolves to a declared factory, and that `args` fit its signature and annotations; for a
    bridged library, that the task exists and `args` fit it."""
    if bridged := bridge(env_id):
        module, task = bridged
        module.check(task, args)
        return
    fit_args(resolve_environment(env_id), args)


def load_environment(env_id: str, args: dict[str, Any] | None = None) -> Environment:
    """Build the environment `env_id` names with `args` (see `resolve_environment` and `BRIDGES`)."""
    if bridged := bridge(env_id):
        module, task = bridged
        env = module.load(task, args or {})
    else:
        factory = resolve_environment(env_id)
        env = factory(**fit_args(factory, args or {}))
    if not isinstance(env, Environment):
        raise TypeError(f"{env_id} returned {type(env).__name__}, not an Environment")
    return env
