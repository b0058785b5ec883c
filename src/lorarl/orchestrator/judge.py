"""`Judge`: a reward function that asks a model to grade an episode against a rubric.

By default the judge is the run's own vLLM fleet serving the *base* model (no adapter), so a judge
costs no extra server and does not drift with the policy; `base_url` points it at any other
OpenAI-compatible server instead. The judge reads the conversation and the rubric and ends its
reply with "Score: N/10" (any scale); the last such score, divided by the scale, is the reward in
[0, 1]. A request that fails or times out, or a reply without a score in range, is asked again up to
`retries` times; then the judge raises, which `Environment.score` counts in `reward_errors` (the
episode scores 0 there) without stopping the run.

    class Essays(Environment):
        rewards = [WeightedReward(Judge("Is the answer correct, clear and polite?"))]
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Literal

from lorarl.inference.client import InferenceClient, InferenceError
from lorarl.inference.pool import WorkerPool
from lorarl.orchestrator.envs.base import Episode

log = logging.getLogger("lorarl.orchestrator")

SCORE = re.compile(r"score\s*[:=]?\s*\**\s*(\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)
SYSTEM = "You are a strict grader. You read a conversation and grade the assistant's last reply against a rubric."


class JudgeError(RuntimeError):
    """No usable grade after every attempt."""


# The run's fleet and its base model, set by the orchestrator when it starts (`use_fleet`).
_fleet: tuple[WorkerPool, str] | None = None


def use_fleet(pool: WorkerPool, base_model: str) -> None:
    """Make `pool`, serving `base_model` without an adapter, the default judge of this process."""
    global _fleet
    _fleet = (pool, base_model)


def parse_score(reply: str, scale: float) -> float | None:
    """The last "Score: x" or "Score: x/y" of `reply` as a fraction of y (default `scale`), or None
    if there is none or it falls outside [0, 1]."""
    matches = SCORE.findall(reply)
    if not matches:
        return None
    value, out_of = matches[-1]
    denominator = float(out_of) if out_of else scale
    score = float(value) / denominator if denominator > 0 else -1.0
    return score if 0.0 <= score <= 1.0 else None


class Judge:
    """Grades an episode against `rubric` (a reward function: `WeightedReward(Judge(...))`).

    `reply_format = "score_only"` constrains the judge's reply to exactly "Score: N/scale" with vLLM's
    structured outputs, so that even a small judge always answers in form (no reasoning first);
    "free" lets it reason and reads the last score it wrote."""

    def __init__(
        self,
        rubric: str,
        *,
        name: str = "judge",
        scale: int = 10,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
        timeout: float = 120.0,
        retries: int = 2,
        reply_format: Literal["free", "score_only"] = "free",
    ) -> None:
        if scale < 1:
            raise ValueError(f"scale must be >= 1, got {scale}")
        if retries < 0 or timeout <= 0:
            raise ValueError(f"retries must be >= 0 and timeout > 0, got {retries} and {timeout}")
        if base_url is not None and model is None:
            raise ValueError("a judge at base_url needs the model name to ask for")
        self.rubric, self.__name__, self.scale = rubric, name, scale
        self.model, self.timeout, self.retries = model, timeout, retries
        self.client = InferenceClient(base_url, timeout, api_key=api_key) if base_url is not None else None
        self.params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature}
        if reply_format == "score_only":
            self.params["structured_outputs"] = {
                "regex": f"Score: ({'|'.join(map(str, range(scale, -1, -1)))})/{scale}"
            }

    def messages(self, episode: Episode) -> list[dict[str, str]]:
        """What the judge is asked: the rubric, the conversation, and the form of the grade."""
        transcript = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in episode.messages if m["role"] != "system")
        ask = (
            f"Rubric:\n{self.rubric}\n\nConversation:\n{transcript}\n\nGrade the assistant's last reply against "
            f"the rubric. End with a line 'Score: N/{self.scale}', N a whole number from 0 to {self.scale}."
        )
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}]

    async def __call__(self, episode: Episode) -> float:
        messages, problem = self.messages(episode), ""
        for attempt in range(self.retries + 1):
            try:
                reply = await asyncio.wait_for(self.ask(messages), self.timeout)
            except (TimeoutError, InferenceError) as e:
                problem = f"the request failed: {e!r}" if str(e) else f"no reply within {self.timeout:g} s"
            else:
                if (score := parse_score(reply, self.scale)) is not None:
                    return score
                problem = f"no score in [0, {self.scale}] in the reply {reply[-200:]!r}"
            log.debug("judge %s, attempt %d: %s", self.__name__, attempt + 1, problem)
        raise JudgeError(f"judge {self.__name__} gave no grade in {self.retries + 1} attempts; last: {problem}")

    async def ask(self, messages: list[dict[str, str]]) -> str:
        """The judge's reply: from base_url, else from the run's fleet (its base model by default)."""
        if self.client is not None:
            assert self.model is not None  # checked in __init__
            return await self.client.chat(self.model, messages, **self.params)
        if _fleet is None:
            raise JudgeError("no judge server: give base_url, or run the judge inside an `rl` orchestrator")
        pool, base_model = _fleet
        return await pool.chat(self.model or base_model, messages, **self.params)
