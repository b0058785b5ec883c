"""What lorarl does only on a machine without GPUs, apart from the product's device-independent code:
the host allocator's policy for freed tensors (host_memory), the cores each vLLM worker is pinned to
(cores), vLLM's LoRA ops replaced by ones whose cost does not grow with the largest rank (lora_ops),
and an idle vLLM engine kept from spinning a core (worker_idle)."""
