"""Write supervised warm-up data for an environment: its prompts with reference answers.

python scripts/make_sft_data.py --env reverse_text --num 2000 --out data/reverse_text_sft.jsonl

One chat per record, {"messages": [...prompt, {"role": "assistant", "content": solution}]}, as
JSONL or Parquet (by the suffix of --out); `sft` reads both. A multi-turn environment's episodes are
played through: each reference turn (`solutions()`), then the environment's answer to it, so the
record holds every turn (`sft` trains on all assistant turns). An environment with tools (calculator,
search) plays its reference tool calls, so the record holds the real `tool` results, and the record
carries the tool schemas as "tools" (the Hugging Face convention), which `sft` shows the model
through the chat template as `rl` does.

--guess-frac F (environments with tools): a fraction F of the records answer at once, without a
tool call, with another example's answer (its last reference turn). It stands in for a base model
that sometimes answers from memory, and wrongly, instead of looking things up: the warm-up then
holds both behaviours, and RL has to find out that the tools pay (configs/search/).

--no-tools (environments with tools): the records carry no tool schemas, so the chat template shows
them a prompt without its tools block (calculator's: ~150 tokens instead of ~990). A first warm-up
stage for a tiny model, which learns to copy from the prompt there and not beside ~800 tokens of
schemas (configs/calculator/sft_copy.toml).
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


def guess_record(env: Environment, example: Example, other: Example) -> dict[str, Any]:
    """A record that answers `example` at once, without tools, with `other`'s answer (a wrong guess
    unless the two share it): the prompt, then `other`'s last reference turn."""
    guess = {"role": "assistant", "content": env.solutions(other)[-1]}
    return {"messages": [*env.prompt(example), guess], "tools": env.tool_schemas()}


def records(env: Environment, num: int, guess_frac: float, seed: int, tools: bool = True) -> list[dict[str, Any]]:
    """`num` warm-up records; with `guess_frac`, that fraction of them (drawn at random) guesses;
    without `tools`, none carries the tool schemas."""
    rng = random.Random(seed)
    examples = list(islice(env.examples(rng), num))
    data = [
        guess_record(env, example, rng.choice(examples)) if rng.random() < guess_frac else record(env, example)
        for example in examples
    ]
    return data if tools else [{k: v for k, v in r.items() if k != "tools"} for r in data]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="reverse_text")
    parser.add_argument("--args", default="{}", help="environment args as JSON")
    parser.add_argument("--num", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, required=True, help="a .jsonl or .parquet file")
    parser.add_argument(
        "--guess-frac", type=float, default=0.0, help="fraction of records that answer without tools, wrongly"
    )
    parser.add_argument("--no-tools", action="store_true", help="records without the tool schemas (shorter prompts)")
    args = parser.parse_args()
    if args.out.suffix not in (".jsonl", ".parquet"):
        parser.error(f"--out must end in .jsonl or .parquet, got {args.out}")
    if not 0.0 <= args.guess_frac < 1.0:
        parser.error(f"--guess-frac must be in [0, 1), got {args.guess_frac}")
    env = load_environment(args.env, json.loads(args.args))
    for flag, given in (("--guess-frac", args.guess_frac), ("--no-tools", args.no_tools)):
        if given and env.tool_schemas() is None:
            parser.error(f"{flag} is for environments with tools; {args.env} has none")
    try:
        data = records(env, args.num, args.guess_frac, args.seed, tools=not args.no_tools)
    except NotImplementedError as e:
        parser.error(str(e))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(data), args.out)
    else:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in data))
    print(f"wrote {len(data)} {args.env} conversations to {args.out}")


if __name__ == "__main__":
    main()
