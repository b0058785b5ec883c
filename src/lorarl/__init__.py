"""lorarl: asynchronous LoRA reinforcement learning for LLMs.

The public API a user's module needs at the top level: `plugin`, which declares a function that a
config may name (an environment factory, a custom loss, an advantage estimator).
"""

from lorarl.plugins import plugin

__all__ = ["plugin"]
__version__ = "0.1.0"
