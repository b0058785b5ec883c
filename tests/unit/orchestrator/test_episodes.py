"""Multi-turn token bookkeeping of EpisodeRunner, with a scripted stand-in for the vLLM pool."""

import asyncio

import pytest

from lorarl.config.orchestrator import SamplingConfig
from lorarl.inference.client import Completion
from lorarl.orchestrator.envs.base import Environment, Episode
from lorarl.orchestrator.envs.tool_env import ToolEnvironment
from lorarl.orchestrator.episodes import EpisodeRunner
from lorarl.tiny_model import build_tokenizer


class ScriptedPool:
    """Answers each request with the next scripted text, tokenized as the model would emit it."""

    def __init__(self, tokenizer, answers: list[str]) -> None:
        self.tokenizer, self.answers, self.prompts = tokenizer, list(answers), []

    async def complete(self, model, prompt_ids, n, **sampling):
        self.prompts.append(prompt_ids)
        out = []
        for _ in range(n):
            text = self.answers.pop(0)
            ids = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
            out.append(Completion(ids, [-0.5] * len(ids), text, "stop"))
        return out


class TwoTurns(Environment):
    name = "two_turns"
    max_turns = 3

    def examples(self, rng):
        while True:
            yield {}

    def prompt(self, example):
        return [{"role": "user", "content": "first"}]

    def env_response(self, episode: Episode):
        return None if len(episode.turns) >= 2 else [{"role": "user", "content": "next"}]


def play(tokenizer, answers, env=None):
    pool = ScriptedPool(tokenizer, answers)
    runner = EpisodeRunner(pool, tokenizer, SamplingConfig(), seq_len=2048)
    return asyncio.run(runner.play("adapter", env or TwoTurns(), {}, n=1)), pool


def test_a_multi_turn_episode_is_one_sample_with_only_model_tokens_trained() -> None:
    tok = build_tokenizer()
    (played,), pool = play(tok, ["a1", "b2"])
    assert len(played.samples) == 1 and played.episode.turns == ["a1", "b2"]
    s = played.samples[0]
    # The second request's prompt is exactly the first prompt + first answer + the env's reply.
    assert pool.prompts[1] == s.prompt_ids + s.completion_ids[: len(pool.prompts[1]) - len(s.prompt_ids)]
    trained = tok.decode([t for t, m in zip(s.completion_ids, s.completion_mask, strict=True) if m])
    assert trained == "a1<|im_end|>b2<|im_end|>"
    env_tokens = tok.decode([t for t, m in zip(s.completion_ids, s.completion_mask, strict=True) if not m])
    assert env_tokens == "\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    assert [lp for lp, m in zip(s.completion_logprobs, s.completion_mask, strict=True) if not m] == [0.0] * len(
        tok.encode(env_tokens)
    )
    assert played.model_tokens == 6


def test_a_template_that_rewrites_history_starts_a_new_sample() -> None:
    tok = build_tokenizer()
    # Like templates that drop earlier reasoning: past assistant turns are rendered without content.
    tok.chat_template = (
        "{%- for m in messages %}{%- if m.role == 'assistant' and not loop.last %}"
        "{{- '<|im_start|>assistant\\n<|im_end|>\\n' }}{%- else %}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    (played,), pool = play(tok, ["a1", "b2"])
    first, second = played.samples
    assert tok.decode([t for t, m in zip(first.completion_ids, first.completion_mask, strict=True) if m]) == (
        "a1<|im_end|>"
    )
    assert second.prompt_ids == pool.prompts[1]  # the re-rendered history is prompt, never trained
    assert all(second.completion_mask)


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def explode() -> str:
    """Always fails."""
    raise RuntimeError("boom")


class Adding(ToolEnvironment):
    name = "adding"
    max_turns = 4
    tools = [add, explode]

    def examples(self, rng):
        while True:
            yield {}

    def prompt(self, example):
        return [{"role": "user", "content": "2+3+4?"}]


TOOL_TURNS = [
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    '<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 4}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 5,}}\n</tool_call>\n'
    '<tool_call>\n{"name": "explode", "arguments": {}}\n</tool_call>',
    "9",
]


def test_a_tool_episode_is_one_sample_and_its_errors_reach_the_model_and_the_metrics() -> None:
    tok = build_tokenizer()
    (played,), pool = play(tok, TOOL_TURNS, Adding())
    (s,) = played.samples
    assert played.episode.turns == TOOL_TURNS and len(pool.prompts) == 3
    # Each request's prompt is the sample so far: the tokens the model produced, and the env's in between.
    for prompt in pool.prompts[1:]:
        assert prompt == (s.prompt_ids + s.completion_ids)[: len(prompt)]
    trained = tok.decode([t for t, m in zip(s.completion_ids, s.completion_mask, strict=True) if m])
    assert trained == "<|im_end|>".join(TOOL_TURNS) + "<|im_end|>"
    assert "# Tools" in tok.decode(s.prompt_ids) and '"name": "explode"' in tok.decode(s.prompt_ids)
    env_tokens = tok.decode([t for t, m in zip(s.completion_ids, s.completion_mask, strict=True) if not m])
    assert env_tokens == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        "\n<|im_start|>user\n<tool_response>\n9\n</tool_response>\n<tool_response>\n"
        "Error: the tool call is not valid JSON (Expecting property name enclosed in double quotes at character 38)."
        "\n</tool_response>\n<tool_response>\nError: explode raised RuntimeError: boom\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    scores = asyncio.run(Adding().score(played.episode))
    assert scores == {"reward": 0, "reward_errors": 0, "tool_calls": 4.0, "tool_malformed": 1.0, "tool_failed": 1.0,
                      "tool_timeouts": 0.0}  # fmt: skip


def test_a_template_variable_that_changes_each_prompt_splits_the_episode() -> None:
    tok = build_tokenizer()
    pool = ScriptedPool(tok, TOOL_TURNS)
    # Qwen3 without thinking opens each answer with an empty <think> block the history leaves out.
    runner = EpisodeRunner(pool, tok, SamplingConfig(), seq_len=2048, chat_template_kwargs={"enable_thinking": False})
    (played,) = asyncio.run(runner.play("adapter", Adding(), {}, n=1))
    assert len(played.samples) == 3 and tok.decode(pool.prompts[0]).endswith("<think>\n\n</think>\n\n")
    assert [s.prompt_ids for s in played.samples] == pool.prompts
    assert all(all(s.completion_mask) for s in played.samples)


class SlowReplies(TwoTurns):
    max_turns = 5
    episode_timeout = 0.3

    async def env_response(self, episode: Episode):
        await asyncio.sleep(0.2)
        return [{"role": "user", "content": "next"}]


def test_an_episode_past_its_timeout_ends_after_its_last_model_turn() -> None:
    tok = build_tokenizer()
    (played,), pool = play(tok, ["a", "b", "c", "d", "e"], SlowReplies())
    assert played.timed_out and played.episode.turns == ["a", "b"] and len(pool.prompts) == 2
    assert played.episode.messages[-1] == {"role": "assistant", "content": "b"}
    (s,) = played.samples
    assert tok.decode(s.completion_ids).endswith("b<|im_end|>")  # no reply without a model turn after it


def test_tools_with_a_template_that_ignores_them_fail_at_start() -> None:
    tok = build_tokenizer()
    tok.chat_template = "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
    runner = EpisodeRunner(ScriptedPool(tok, []), tok, SamplingConfig(), seq_len=512)
    runner.check(TwoTurns())  # no tools: nothing to render
    with pytest.raises(ValueError, match="adding has tools, but the model's chat template does not render"):
        runner.check(Adding())
