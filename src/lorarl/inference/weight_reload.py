"""Full-weight RL on vLLM: the worker extension (`--worker-extension-cls`) that reloads every weight.

With `model.full_finetune` each policy version is a whole model folder. The orchestrator has every
worker reload it in place (`reload_policy` through vLLM's dev-mode /collective_rpc), between two engine
steps, then resets the prefix cache, preempting the requests in flight so that their KV cache is
recomputed with the new weights (client.py).

On a CPU, vLLM 0.32 hands each linear layer's weight to a packed oneDNN (or sgl-kernel) matmul when it
loads the model and drops the plain weight; `reload_weights` writes new weights but never repacks them.
Measured on the tiny model: after a reload the worker sampled from neither the old weights nor the new
ones. Importing this module, which vLLM does in each worker process before it loads the model, makes a
CPU worker's linear layers plain `torch.nn.functional.linear` over the weights that a reload writes
(docs/vllm.md). On GPUs nothing is patched: their linear layers read the weights in place.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers import utils as layer_utils
from vllm.platforms import current_platform


def _plain_cpu_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
    layer.cpu_linear = torch.nn.functional.linear  # type: ignore[assignment]  # reads the weight at every call


if current_platform.is_cpu():
    # linear.py and vocab_parallel_embedding.py look this function up at model load, after this import.
    layer_utils.dispatch_cpu_unquantized_gemm = _plain_cpu_linear


class WeightReload:
    """Mixed into vLLM's worker class: the methods here run on every worker through collective_rpc."""

    def reload_policy(self, weights_path: str) -> None:
        """Load every weight of the model folder `weights_path` (safetensors) into the served model."""
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]  # vLLM's Worker
