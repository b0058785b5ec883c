"""Write supervised warm-up data for an environment: its prompts with reference answers.

python scripts/make_sft_data.py --env reverse_text --num 2000 --out data/reverse_text_sft.jsonl

One chat per record, {"messages": [...prompt, {"role": "assistant", "content": solution}]}, as
JSONL or Parquet (by the suffix of --out); `sft` reads both. A multi-turn environment's episodes are
played through: each reference turn (`solutions()`), then the environment's answer to it, so the
record holds every turn (`sft` trains on all assistant turns). An environment with tools (calculator,
search) plays its reference tool calls, so the record holds the real `tool` results, and the record
carries the tool schemas as "tools" (the Hugging Face convention), which `sft` shows the model
through the chat template as `rl` does.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import random
from itertools import islice
from pathlib import Path
from typing import Any

from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Environment, Episode, Example, Message


def reference_episode(env: Environment, example: Example) -> list[Message]:
    """The conversation of a correct episode: the prompt, then each reference turn followed by the
    environment's reply to it, until it ends the episode or the reference turns run out."""
    return asyncio.run(_play_reference(env, example))


async def _play_reference(env: Environment, example: Example) -> list[Message]:
    """On one event loop, with one Episode (its state, e.g. tool call counts, kept turn to turn)."""
    episode = Episode(example, env.prompt(example))
    for turn in env.solutions(example):
        episode.messages.append({"role": "assistant", "content": turn})
        reply = env.env_response(episode)
        reply = await reply if inspect.isawaitable(reply) else reply
        if reply is None:
            break
        episode.messages.extend(reply)
    return episode.messages


def record(env: Environment, example: Example) -> dict[str, Any]:
    """One warm-up record: the reference episode, and the tool schemas of an environment with tools."""
    tools = env.tool_schemas()
    return {"messages": reference_episode(env, example)} | ({"tools": tools} if tools is not None else {})


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
    try:
        records = [record(env, example) for example in islice(env.examples(random.Random(args.seed)), args.num)]
    except NotImplementedError as e:
        parser.error(str(e))
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
