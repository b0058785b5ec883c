"""A tool-calling episode through real vLLM: tool results rendered by the chat template, the whole
episode one sample whose model tokens are exactly those vLLM returned, and a malformed call and a
raising tool answered to the model and counted.

The tiny test model is untrained and never writes a tool call by itself, so its first two turns are
constrained with vLLM's structured outputs to the `<tool_call>` format (the numbers in them are
still the model's own samples); everything after the request is lorarl's ordinary path.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from lorarl.config.orchestrator import SamplingConfig
from lorarl.inference.client import Completion
from lorarl.inference.pool import WorkerPool
from lorarl.orchestrator.batch_metrics import batch_metrics
from lorarl.orchestrator.episodes import EpisodeRunner
from lorarl.orchestrator.groups import Group
from tests.conftest import API_KEY
from tests.unit.orchestrator.test_episodes import Adding as UnitAdding

pytestmark = pytest.mark.integration

CALL = r'<tool_call>\n\{{"name": "{name}", "arguments": \{{{args}\}}\}}\n</tool_call>'
TURNS = [
    CALL.format(name="add", args=r'"a": [0-9], "b": [0-9]'),  # one call
    CALL.format(name="explode", args="") + r"\n" + CALL.format(name="add", args=r'"a": [0-9],'),  # raises; malformed
]


class Adding(UnitAdding):
    """The unit tests' tool environment (add and a tool that raises), one turn fewer, another question."""

    max_turns = 3

    def prompt(self, example):
        return [{"role": "user", "content": "Add 2 and 3."}]


class ToolCallsFirst:
    """The real worker pool; the first turns of each episode are constrained to `TURNS`. Records
    every request's prompt and every completion vLLM returned."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool, self.prompts, self.completions = pool, [], []

    async def complete(self, model: str, prompt_ids: list[int], n: int, **sampling: Any) -> list[Completion]:
        turn = len(self.prompts)
        if turn < len(TURNS):
            sampling["structured_outputs"] = {"regex": TURNS[turn]}
        self.prompts.append(prompt_ids)
        out = await self.pool.complete(model, prompt_ids, n, **sampling)
        self.completions += out
        return out


def play(url: str, tokenizer, **template_kwargs: Any):
    async def run():
        pool = WorkerPool([url], API_KEY)
        try:
            recorder = ToolCallsFirst(pool)
            runner = EpisodeRunner(recorder, tokenizer, SamplingConfig(max_tokens=160), 2048, template_kwargs)
            (played,) = await runner.play(str(tokenizer.name_or_path), Adding(), {}, n=1)
            return played, recorder
        finally:
            await pool.close()

    return asyncio.run(run())


def test_a_tool_episode_is_one_sample_of_exactly_the_tokens_vllm_sampled(vllm_server: str, tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    played, recorder = play(vllm_server, tok)
    first, second, third = recorder.completions
    for completion, regex in zip((first, second), TURNS, strict=True):
        assert re.fullmatch(regex.replace(r"\n", "\n"), completion.text) and completion.finish_reason == "stop"
    (sample,) = played.samples  # tool results rendered as <tool_response> turns, history unchanged
    model_tokens = [t for t, m in zip(sample.completion_ids, sample.completion_mask, strict=True) if m]
    assert model_tokens == first.token_ids + second.token_ids + third.token_ids
    model_logprobs = [lp for lp, m in zip(sample.completion_logprobs, sample.completion_mask, strict=True) if m]
    assert model_logprobs == first.logprobs + second.logprobs + third.logprobs
    for prompt in recorder.prompts[1:]:  # each turn's prompt extends the tokens before it exactly
        assert prompt == (sample.prompt_ids + sample.completion_ids)[: len(prompt)]
    assert recorder.prompts[0] == sample.prompt_ids and '"name": "explode"' in tok.decode(sample.prompt_ids)

    arguments = json.loads(first.text.split("\n")[1])["arguments"]
    tool_messages = [m["content"] for m in played.episode.messages if m["role"] == "tool"]
    assert tool_messages[0] == str(arguments["a"] + arguments["b"])  # the model's own numbers, added
    assert tool_messages[1] == "Error: explode raised RuntimeError: boom"
    assert tool_messages[2].startswith("Error: the tool call is not valid JSON")
    assert "<tool_response>\nError: explode raised RuntimeError: boom\n</tool_response>" in tok.decode(
        sample.completion_ids
    )

    scores = asyncio.run(Adding().score(played.episode))
    metrics = batch_metrics([Group(Adding(), 0, [played], [scores], [0.0])], step=1)
    assert metrics["env/adding/tool_calls"] == 3 and metrics["split_frac"] == 0
    assert metrics["env/adding/tool_malformed"] == 1 and metrics["env/adding/tool_failed"] == 1


def test_a_template_that_changes_each_prompt_splits_the_episode_and_is_counted(
    vllm_server: str, tiny_model: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    played, recorder = play(vllm_server, tok, enable_thinking=False)  # Qwen3's empty <think> in each prompt
    assert [s.prompt_ids for s in played.samples] == recorder.prompts and len(played.samples) == 3
    for sample, completion in zip(played.samples, recorder.completions, strict=True):
        assert sample.completion_ids == completion.token_ids and all(sample.completion_mask)
    scores = asyncio.run(Adding().score(played.episode))
    assert batch_metrics([Group(Adding(), 0, [played], [scores], [0.0])], step=1)["split_frac"] == 1
