"""An RL loop with the stock `tinker` SDK: sample a group of answers per word from the current
weights, score them, and train on their advantages (importance_sampling), as Tinker's cookbook does.

    python examples/tinker_client/rl_loop.py [--from tinker://.../weights/sft-final] [--steps 80]

It starts from the served model (the quickstart's warmed-up one), or a state saved by sft_loop.py
(--from); --warmup-steps adds a supervised warm-up first. Against `lorarl-serve @
configs/serve/quickstart.toml` (docs/serve.md). Prints the mean reward of each step; --lr 0 gives the
control (the same sampling, no learning).
"""

from __future__ import annotations

import argparse
import random

import tinker
from task import connect, example, prompt_tokens, reward, served_model, supervised_datum
from tinker import types


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="start", default=None, help="a saved state to start from")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--words", type=int, default=16, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # The session is finished on the way out (the SDK's context manager), so the process does not leave
    # with the SDK's thread still sending.
    with connect() as service:
        train(service, args)


def train(service: tinker.ServiceClient, args: argparse.Namespace) -> None:
    if args.start:
        training = service.create_training_client_from_state(args.start).result()
    else:
        training = service.create_lora_training_client(
            base_model=served_model(service), rank=8, seed=args.seed
        ).result()
    tokenizer = training.get_tokenizer()
    rng = random.Random(args.seed)
    for _ in range(args.warmup_steps):
        training.forward_backward([supervised_datum(tokenizer, example(rng)) for _ in range(32)], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=3e-3))
    params = types.SamplingParams(max_tokens=16, temperature=1.0, stop=[tokenizer.eos_token_id])
    for step in range(1, args.steps + 1):
        sampler = training.save_weights_and_get_sampling_client().result()
        words = [example(rng) for _ in range(args.words)]
        prompts = [prompt_tokens(tokenizer, w) for w in words]
        futures = [sampler.sample(types.ModelInput.from_ints(p), args.group, params) for p in prompts]
        data, rewards = [], []
        for word, prompt, future in zip(words, prompts, futures, strict=True):
            sequences = future.result().sequences
            scores = [reward(tokenizer.decode(s.tokens, skip_special_tokens=True), word) for s in sequences]
            mean = sum(scores) / len(scores)
            std = (sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5
            rewards += scores
            for seq, score in zip(sequences, scores, strict=True):
                if score == mean:
                    continue  # no advantage, nothing to learn
                tokens = prompt + list(seq.tokens)
                n_prompt = len(prompt) - 1
                data.append(
                    types.Datum(
                        model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={
                            "target_tokens": tokens[1:],
                            "logprobs": [0.0] * n_prompt + list(seq.logprobs),
                            "advantages": [0.0] * n_prompt + [(score - mean) / (std + 1e-6)] * len(seq.tokens),
                        },
                    )
                )
        if data:
            training.forward_backward(data, "importance_sampling")
            training.optim_step(types.AdamParams(learning_rate=args.lr)).result()
        print(f"step {step}: mean reward {sum(rewards) / len(rewards):.3f}", flush=True)


if __name__ == "__main__":
    main()
