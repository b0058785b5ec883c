"""lorarl: asynchronous LoRA reinforcement learning for LLMs.

This package's top level is the public API, what a user's module builds on: environments and their
episodes, reward functions, tool environments and tool schemas, judges, the custom loss and advantage
function protocols and their inputs, and `plugin`, which declares a function a config may name.
Import these from `lorarl` itself (`from lorarl import Environment, WeightedReward`). Every module
inside the package (`lorarl.orchestrator...`, `lorarl.trainer...`) is internal: its paths and names
may change from one release to the next.

The names are imported on first use (module `__getattr__`), so that `import lorarl` stays cheap: the
loss's names import torch, the environments' import transformers.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from lorarl.plugins import plugin

# bitsandbytes (model.quantization), which transformers and PEFT import whenever it is installed, warns on
# every CPU with AVX512-bf16 that it cannot fetch an optional kernel from a model hub: lorarl never uses that
# kernel (quantized_base.py), and the line would break every one-line error of every command.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

if TYPE_CHECKING:  # what mypy, IDEs and the API reference (griffe reads these statically) see
    from lorarl.orchestrator.advantages import AdvantageFn
    from lorarl.orchestrator.envs import load_environment
    from lorarl.orchestrator.envs.base import Environment, Episode, Example, Message, RewardFunc, WeightedReward
    from lorarl.orchestrator.envs.tool_env import ToolEnvironment, used_tools
    from lorarl.orchestrator.episodes import PlayedEpisode
    from lorarl.orchestrator.judge import Judge, JudgeError
    from lorarl.orchestrator.tools import ToolFunc, ToolStats, tool_schema
    from lorarl.trainer.losses import LossFn, LossInputs

__all__ = [
    "plugin",
    "Environment",
    "Episode",
    "Example",
    "Message",
    "RewardFunc",
    "WeightedReward",
    "load_environment",
    "ToolEnvironment",
    "ToolFunc",
    "ToolStats",
    "tool_schema",
    "used_tools",
    "Judge",
    "JudgeError",
    "LossFn",
    "LossInputs",
    "AdvantageFn",
    "PlayedEpisode",
]
# The internal module that defines each public name but `plugin`, imported when the name is first asked for.
_LAZY: dict[str, str] = {
    "Environment": "lorarl.orchestrator.envs.base",
    "Episode": "lorarl.orchestrator.envs.base",
    "Example": "lorarl.orchestrator.envs.base",
    "Message": "lorarl.orchestrator.envs.base",
    "RewardFunc": "lorarl.orchestrator.envs.base",
    "WeightedReward": "lorarl.orchestrator.envs.base",
    "load_environment": "lorarl.orchestrator.envs",
    "ToolEnvironment": "lorarl.orchestrator.envs.tool_env",
    "used_tools": "lorarl.orchestrator.envs.tool_env",
    "ToolFunc": "lorarl.orchestrator.tools",
    "ToolStats": "lorarl.orchestrator.tools",
    "tool_schema": "lorarl.orchestrator.tools",
    "Judge": "lorarl.orchestrator.judge",
    "JudgeError": "lorarl.orchestrator.judge",
    "LossFn": "lorarl.trainer.losses",
    "LossInputs": "lorarl.trainer.losses",
    "AdvantageFn": "lorarl.orchestrator.advantages",
    "PlayedEpisode": "lorarl.orchestrator.episodes",
}
__version__ = "0.1.0"


# A public name, imported from its module on first use and kept in this module afterwards. No docstring:
# the API reference lists only documented members, and this one is machinery, not API.
def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'lorarl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
