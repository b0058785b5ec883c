"""User functions that a config names as "package.module:function" (a custom loss, an advantage
estimator): one place that imports them and says, naming the key, why one cannot be used.

Environments have their own resolution (`orchestrator.envs.resolve_environment`): they may also be
classes, and built-in names and bridged libraries come first.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class PluginError(ValueError):
    """The function a key names cannot be imported or called; str() is one line naming the key."""


def load_function(spec: str, key: str) -> Callable[..., Any]:
    """The callable "package.module:function" (`spec`, given as config key `key`) names."""
    module_name, name = spec.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise PluginError(f"{key} {spec!r}: {e}") from None
    if not callable(fn):
        raise PluginError(f"{key} {spec!r} is a {type(fn).__name__}, not a function")
    return fn  # type: ignore[no-any-return]
