"""What the Tinker API costs in lorarl-serve, measured with the stock `tinker` SDK against a real server.

    python benchmarks/serve.py [--model outputs/models/tiny-qwen3] [--steps 5]

Starts `lorarl-serve` on the model (a run folder under /tmp), then:
1. overhead: a forward_backward + optim_step round trip (cross_entropy, `--batch` datums of the
   quickstart's lengths) against the same step done by rl's trainer in this process (the trainer's
   forward_backward_step and optimizer step on the same samples, same rank), taken in turns, median
   seconds per step;
2. tenants: trained tokens/s of 1, 2, 4 and 8 tenants training at once (each its own batch of the same
   size, one thread per tenant), against one tenant training a 4x batch;
3. sampling: generated tokens/s with 1 and 8 tenants' sampler adapters live (16 prompts each, 8 samples).
Prints one Markdown table per part (docs/benchmarks.md keeps them with the command). Run it alone:
other processes on the machine move every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import tinker
from tinker import types

from runner import ENV, after_warmup, cli, free_port, markdown_head, markdown_row, process_group

PROMPT, COMPLETION = 32, 16  # the quickstart's lengths: a chat-templated word, then its reversal


@contextlib.contextmanager
def server(model: str, folder: Path) -> Iterator[str]:
    """`lorarl-serve` of `model` in `folder` (its output in serve.out there), waited on until its API
    answers; yields the API's url."""
    port = free_port()
    cfg = {
        "seq_len": 256,
        "output_dir": str(folder),
        "run_name": "bench",
        "model": {"name": model},
        "trainer": {"micro_batch_size": 64},
        "inference": {"port": free_port(), "kv_cache_gib": 1},
        "serve": {"port": port, "max_rank": 8, "max_loras": 8, "max_tenants": 32},
    }
    config = folder / "serve.json"
    config.write_text(json.dumps(cfg))
    url = f"http://127.0.0.1:{port}"
    env = {**ENV, "TINKER_TELEMETRY": "0"}
    with process_group(cli("serve", "@", str(config)), folder / "serve.out", env, stop_timeout=120) as proc:
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"lorarl-serve exited: see {folder / 'serve.out'}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=2)
                break
            time.sleep(1)
        yield url


def data(seed: int, n: int) -> list[types.Datum]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        tokens = [rng.randrange(10, 250) for _ in range(PROMPT + COMPLETION)]
        weights = [0.0] * (PROMPT - 1) + [1.0] * COMPLETION
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs=cast(Any, {"target_tokens": tokens[1:], "weights": weights}),  # the SDK converts lists
            )
        )
    return out


def api_step(client: tinker.TrainingClient, batch: list[types.Datum]) -> float:
    start = time.perf_counter()
    client.forward_backward(batch, "cross_entropy")
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    return time.perf_counter() - start


def trainer_step(model: str, batch: list[types.Datum], threads: int | None) -> Callable[[], float]:
    """The same step as rl's trainer takes it, in this process (its forward passes, loss and optimizer, on
    as many threads as the server's trainer, `threads`; None: torch's default; its malloc policy): a
    function that takes one and returns its seconds."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    from lorarl.cpu.host_memory import set_host_malloc

    set_host_malloc(True, keep_freed_memory=True)  # as rl's trainer and the server's keep it on a CPU (the default)
    from lorarl.config.algorithms import CrossEntropyLoss
    from lorarl.config.model import LoraConfig, ModelConfig
    from lorarl.trainer.batching import TrainSample
    from lorarl.trainer.loss import LossNorm, micro_batch_loss
    from lorarl.trainer.model import apply_lora, load_model, trainable_parameters
    from lorarl.trainer.packing import ForwardPasses
    from lorarl.trainer.trainer import forward_backward_step

    peft_model = apply_lora(load_model(ModelConfig(name=model)), LoraConfig(rank=8))
    samples = []
    for d in batch:
        tokens = d.model_input.to_ints() + [d.loss_fn_inputs["target_tokens"].tolist()[-1]]
        weights = d.loss_fn_inputs["weights"].tolist()
        samples.append(
            TrainSample(
                tokens, [False, *(w != 0 for w in weights)], [0.0] * len(tokens), token_advantages=[0.0, *weights]
            )
        )
    cfg = CrossEntropyLoss(norm="constant", norm_constant=1.0)
    norm = LossNorm.for_step(cfg, samples)
    optimizer = torch.optim.AdamW(trainable_parameters(peft_model), lr=1e-3)
    passes = ForwardPasses(True, 256, 64, 0, False)

    def step() -> float:
        start = time.perf_counter()
        forward_backward_step(
            peft_model, samples, lambda b: (micro_batch_loss(peft_model, b, cfg, norm, 128)[0], {}), passes
        )
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - start

    return step


def tenants_tokens_per_s(service: tinker.ServiceClient, base: str, tenants: int, batch: int, steps: int) -> float:
    clients = [service.create_lora_training_client(base_model=base, rank=8, seed=i).result() for i in range(tenants)]
    batches = [data(100 + i, batch) for i in range(tenants)]
    api_step(clients[0], batches[0])  # warm

    def run(i: int) -> None:
        for _ in range(steps):
            api_step(clients[i], batches[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(tenants)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    return tenants * steps * batch * (PROMPT + COMPLETION) / seconds


def sampling_tokens_per_s(service: tinker.ServiceClient, base: str, tenants: int) -> float:
    samplers = []
    for i in range(tenants):
        client = service.create_lora_training_client(base_model=base, rank=8, seed=i).result()
        samplers.append(client.save_weights_and_get_sampling_client().result())
    params = types.SamplingParams(max_tokens=COMPLETION, temperature=1.0, stop=[])
    prompt = types.ModelInput.from_ints(list(range(10, 10 + PROMPT)))
    [s.sample(prompt, 1, params).result() for s in samplers]  # adapters loaded
    start = time.perf_counter()
    futures = [s.sample(prompt, 8, params) for s in samplers for _ in range(16 // tenants or 1)]
    tokens = sum(len(seq.tokens) for f in futures for seq in f.result().sequences)
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="outputs/models/tiny-qwen3")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, server(args.model, Path(tmp)) as url:
        service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
        base = str(service.get_server_capabilities().supported_models[0].model_name)
        batch = data(0, args.batch)
        client = service.create_lora_training_client(base_model=base, rank=8, seed=0).result()
        trainer = json.loads((Path(tmp) / "bench" / "configs" / "trainer.json").read_text())["trainer"]
        direct_step = trainer_step(args.model, batch, trainer["num_threads"])
        # Taken in turns, so that the machine's drift (this VM's figures move 20% in minutes) falls on both.
        pairs = [(api_step(client, batch), direct_step()) for _ in range(args.steps + 1)]
        api, direct = (statistics.median(after_warmup(times)) for times in zip(*pairs, strict=True))
        print(markdown_head(["step of", "s (median)", "overhead"]))
        print(markdown_row([f"rl's trainer, in process ({trainer['num_threads']} threads, as the server's)",
                            f"{direct:.3f}", ""]))  # fmt: skip
        print(markdown_row(["the Tinker API (forward_backward + optim_step)", f"{api:.3f}",
                            f"{100 * (api / direct - 1):+.0f}%"]) + "\n")  # fmt: skip
        print(markdown_head(["tenants at once", "trained tokens/s", "per tenant"]))
        rates = {}
        for n in (1, 2, 4, 8):
            rates[n] = tenants_tokens_per_s(service, base, n, args.batch, args.steps)
            print(markdown_row([n, f"{rates[n]:,.0f}", f"{rates[n] / n:,.0f}"]), flush=True)
        big = tenants_tokens_per_s(service, base, 1, 4 * args.batch, args.steps)
        print(markdown_row(["1 with a 4x batch", f"{big:,.0f}", f"{big:,.0f}"]) + "\n")
        print(f"4 tenants at once / 1 tenant's 4x batch: {rates[4] / big:.2f}x\n")
        print(markdown_head(["sampler adapters live", "generated tokens/s"]))
        for n in (1, 8):
            print(markdown_row([n, f"{sampling_tokens_per_s(service, base, n):,.0f}"]), flush=True)


if __name__ == "__main__":
    main()
