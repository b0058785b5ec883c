"""Multi-turn token bookkeeping of EpisodeRunner, with a scripted stand-in for the vLLM pool."""

import asyncio

from lorarl.config.models import SamplingConfig
from lorarl.inference.client import Completion
from lorarl.orchestrator.envs.base import Environment, Episode
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

    def prompt(self, example):
        return [{"role": "user", "content": "first"}]

    def env_response(self, episode: Episode):
        return None if len(episode.turns) >= 2 else [{"role": "user", "content": "next"}]


def play(tokenizer, answers, env=None):
    pool = ScriptedPool(tokenizer, answers)
    runner = EpisodeRunner(pool, tokenizer, SamplingConfig(), seq_len=512)
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
