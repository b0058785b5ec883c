"""Write supervised warm-up data for an environment: its prompts with reference answers.

python scripts/make_sft_data.py --env reverse_text --num 2000 --out data/reverse_text_sft.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from itertools import islice
from pathlib import Path

from lorarl.orchestrator.envs import load_environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="reverse_text")
    parser.add_argument("--args", default="{}", help="environment args as JSON")
    parser.add_argument("--num", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    env = load_environment(args.env, json.loads(args.args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for example in islice(env.examples(random.Random(args.seed)), args.num):
            messages = [*env.prompt(example), {"role": "assistant", "content": env.solution(example)}]
            f.write(json.dumps({"messages": messages}) + "\n")
    print(f"wrote {args.num} {args.env} conversations to {args.out}")


if __name__ == "__main__":
    main()
