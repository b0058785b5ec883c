"""Every environment in a shipped rl config, played through EpisodeRunner with reference answers:
the turns fit the config's seq_len and max_tokens, multi-turn episodes run to the end, and the
reference answers score full reward."""

import asyncio
import json
import random
from itertools import islice
from pathlib import Path

import pytest

from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from lorarl.inference.client import Completion
from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Environment, Example
from lorarl.orchestrator.episodes import EpisodeRunner, PlayedEpisode
from lorarl.orchestrator.judge import Judge
from lorarl.tiny_model import build_tokenizer
from tests.conftest import REPO

# rl's configs: sft's and lorarl-serve's have no environments.
CONFIGS = sorted(
    p
    for d in ("configs", "examples")
    for p in (REPO / d).rglob("*.toml")
    if not p.stem.startswith("sft") and "serve" not in p.relative_to(REPO).parts
)


def reference_turns(env: Environment, example: Example) -> list[str]:
    """What a perfect policy writes, turn by turn (the longest such episode, for the tool environments)."""
    if env.name == "alphabet_sort":
        return example["expected"]
    if env.name == "describe_animal":
        return [f"The {example['animal']} is a quick and clever animal."]
    if env.name in ("search", "calculator"):
        tool, argument = ("search", "query") if env.name == "search" else ("calculate", "expression")
        call = json.dumps({"name": tool, "arguments": {argument: example.get("question", example.get("expression"))}})
        return [f"<tool_call>\n{call}\n</tool_call>"] * (env.max_turns - 1) + [f"<answer>{example['answer']}</answer>"]
    if env.name == "price_lookup":  # one lookup a turn
        calls = (json.dumps({"name": "shop_price", "arguments": {"item": item}}) for item in example["task"]["basket"])
        return [*(f"<tool_call>\n{c}\n</tool_call>" for c in calls), f"<answer>{example['task']['answer']}</answer>"]
    if env.name == "guess_number":
        return [str(example["task"]["secret"])]
    return [env.solution(example)]


class ReferencePool:
    """Stands in for vLLM: answers with the next reference turn, which must fit max_tokens."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns = tokenizer, list(turns)

    async def complete(self, model, prompt_ids, n, max_tokens, **sampling):
        text = self.turns.pop(0)
        ids = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
        assert len(ids) <= max_tokens, f"{len(ids)} tokens of {text!r} exceed max_tokens {max_tokens}"
        return [Completion(ids, [-0.1] * len(ids), text, "stop")]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_reference_episodes_fit_the_config_and_score_full_reward(path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # examples/ resolves from the repo root, as under `rl`
    cfg = load_config(RLConfig, ["@", str(path)])
    tokenizer = build_tokenizer()
    for env_cfg in cfg.orchestrator.env:
        env = load_environment(env_cfg.id, env_cfg.args)
        for example in islice(env.examples(random.Random(0)), 100):
            turns = reference_turns(env, example)
            runner = EpisodeRunner(ReferencePool(tokenizer, turns), tokenizer, cfg.orchestrator.sampling, cfg.seq_len)
            played, scores = asyncio.run(play_and_score(runner, env, example))
            assert played.episode.turns == turns  # every turn was played: nothing cut by seq_len
            assert sum(len(s.prompt_ids) + len(s.completion_ids) for s in played.samples) <= cfg.seq_len
            if scores is not None:
                assert scores["reward"] >= 1.0 and scores["reward_errors"] == 0, (example, scores)


async def play_and_score(
    runner: EpisodeRunner, env: Environment, example: Example
) -> tuple[PlayedEpisode, dict[str, float] | None]:
    """One episode, scored on the same event loop as the orchestrator does (a verifiers env's `run`
    goes on in a task of its own); not scored if a judge grades it (tests/integration/test_judge.py)."""
    (played,) = await runner.play("adapter", env, example, n=1)
    if any(isinstance(r.func, Judge) for r in env.rewards):
        return played, None
    return played, await env.score(played.episode)
