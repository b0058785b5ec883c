"""A supervised loop with the stock `tinker` SDK: a LoRA adapter on the served model learns to write a
word backwards (cross_entropy), then saves its state (rl_loop.py --from can start from it).

    python examples/tinker_client/sft_loop.py [--steps 60]

Against `lorarl-serve @ configs/serve/quickstart.toml` (docs/serve.md). Prints the loss per target token.
"""

from __future__ import annotations

import argparse
import random

from task import connect, example, served_model, supervised_datum
from tinker import types


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--name", default="sft-final", help="the name the state is saved as")
    args = parser.parse_args()
    with connect() as service:
        training = service.create_lora_training_client(
            base_model=served_model(service), rank=args.rank, seed=0
        ).result()
        tokenizer = training.get_tokenizer()
        rng = random.Random(0)
        for step in range(1, args.steps + 1):
            data = [supervised_datum(tokenizer, example(rng)) for _ in range(args.batch)]
            result = training.forward_backward(data, "cross_entropy")
            training.optim_step(types.AdamParams(learning_rate=args.lr)).result()
            targets = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in data)
            print(f"step {step}: loss {result.result().metrics['loss:sum'] / targets:.3f} per token", flush=True)
        print("saved", training.save_state(args.name).result().path, flush=True)


if __name__ == "__main__":
    main()
