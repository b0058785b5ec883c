"""Write supervised warm-up data for an environment: its prompts with reference answers.

python scripts/make_sft_data.py --env reverse_text --num 2000 --out data/reverse_text_sft.jsonl

One chat per record, {"messages": [...prompt, {"role": "assistant", "content": solution}]}, as
JSONL or Parquet (by the suffix of --out); `sft` reads both. Needs a single-turn environment
with `solution()`.
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
    parser.add_argument("--out", type=Path, required=True, help="a .jsonl or .parquet file")
    args = parser.parse_args()
    if args.out.suffix not in (".jsonl", ".parquet"):
        parser.error(f"--out must end in .jsonl or .parquet, got {args.out}")
    env = load_environment(args.env, json.loads(args.args))
    if env.max_turns > 1:
        parser.error(f"{args.env} is a multi-turn environment: its episodes have no single reference answer")
    records = [
        {"messages": [*env.prompt(example), {"role": "assistant", "content": env.solution(example)}]}
        for example in islice(env.examples(random.Random(args.seed)), args.num)
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), args.out)
    else:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"wrote {len(records)} {args.env} conversations to {args.out}")


if __name__ == "__main__":
    main()
