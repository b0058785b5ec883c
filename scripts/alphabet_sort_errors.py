"""What a warmed-up alphabet_sort model gets wrong, turn by turn, sampling and taking the likeliest
token: how much room a warm-up leaves RL (docs/learning.md).

.venv/bin/python scripts/alphabet_sort_errors.py outputs/alphabet_sort-sft/final
.venv/bin/python scripts/alphabet_sort_errors.py outputs/alphabet_sort-sft/final --temperature 0   # greedy

It plays --num episodes of the environment (configs/alphabet_sort/rl.toml's args by default) with the model through
transformers (no vLLM: a census, not a benchmark), each turn's answer fed back as `rl` does, and
prints the mean reward and, per turn, how many answers were exactly right or wrong in one way:
"foreign" (a name that is not among the episode's, e.g. a first name bound to another last name),
"count" (a name missing or repeated), "order", or "mark" (only the new-name marks wrong); and of
the names each later turn should list, how many it has right, those listed before and the new ones.
"""

from __future__ import annotations

import argparse
import json
import random
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from lorarl.orchestrator.envs.alphabet_sort import NEW_MARK, AlphabetSort, _lines, turn_similarity
from lorarl.orchestrator.envs.base import Episode

RL_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "alphabet_sort" / "rl.toml"


def recipe_args() -> dict[str, Any]:
    """The environment args of the recipe's rl.toml, the task its warm-up was made for."""
    with open(RL_CONFIG, "rb") as f:
        (env,) = tomllib.load(f)["orchestrator"]["env"]
    return dict(env.get("args", {}))


def turn_error(answer: str, expected: str) -> str:
    """The answer's turn in the census: "exact", or the first of "foreign", "count", "order", "mark"
    that it gets wrong."""
    got, want = _lines(answer), _lines(expected)
    if got == want:
        return "exact"
    wanted = {w.removesuffix(NEW_MARK) for w in want}
    if any(g.removesuffix(NEW_MARK) not in wanted for g in got):
        return "foreign"
    if len(got) != len(want):
        return "count"
    return "order" if sorted(got) == sorted(want) else "mark"


def names_listed(episode: Episode) -> list[tuple[str, bool]]:
    """("old" or "new", whether it is in the answer) for each name each turn after the first should list."""
    turns, listed = episode.example["turns"], []
    for t, answer in enumerate(episode.turns[1:], start=1):
        got = {line.removesuffix(NEW_MARK) for line in _lines(answer)}
        listed += [("old", name in got) for earlier in turns[:t] for name in earlier]
        listed += [("new", name in got) for name in turns[t]]
    return listed


def play(
    env: AlphabetSort, model: PreTrainedModel, tok: PreTrainedTokenizerBase, episodes: list[Episode], temperature: float
) -> None:
    """Each episode's turns, all episodes' same turn in one batch, appended to their messages."""
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    live = episodes
    while live:
        texts = [tok.apply_chat_template(e.messages, tokenize=False, add_generation_prompt=True) for e in live]
        batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            # transformers types generate() on its mixin, which mypy does not see through
            out = model.generate(**batch, **sampling, max_new_tokens=96, pad_token_id=tok.pad_token_id)  # type: ignore[operator]
        for e, ids in zip(live, out[:, batch["input_ids"].shape[1] :], strict=True):
            answer = str(tok.decode(ids, skip_special_tokens=True)).strip()
            e.messages.append({"role": "assistant", "content": answer})
            e.messages += env.env_response(e) or []
        live = [e for e in live if e.messages[-1]["role"] == "user"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--num", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0, help="0: the likeliest token each time")
    parser.add_argument("--args", type=json.loads, help="the environment's args, as JSON (default: rl.toml's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"{args.model}: no model folder (config.json) there")
    try:
        env = AlphabetSort(**(recipe_args() if args.args is None else args.args))
    except (TypeError, ValueError) as e:
        parser.error(f"--args: {e}")
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    examples = env.examples(random.Random(args.seed))
    episodes = [Episode(ex, env.prompt(ex)) for ex in (next(examples) for _ in range(args.num))]
    play(env, model, tok, episodes, args.temperature)
    census = Counter((t + 1, turn_error(a, w)) for e in episodes for t, (a, w) in
                     enumerate(zip(e.turns, e.example["expected"], strict=True)))  # fmt: skip
    print(f"mean reward {sum(turn_similarity(e) for e in episodes) / len(episodes):.3f} over {args.num} episodes")
    for turn in sorted({t for t, _ in census}):
        print(f"turn {turn}: " + ", ".join(f"{kind} {n}" for (t, kind), n in sorted(census.items()) if t == turn))
    listed = [kind_right for e in episodes for kind_right in names_listed(e)]
    right, total = Counter(k for k, ok in listed if ok), Counter(k for k, _ in listed)
    print(f"names right in turns after the first: {right['old']} of {total['old']} listed before, "
          f"{right['new']} of {total['new']} new")  # fmt: skip


if __name__ == "__main__":
    main()
