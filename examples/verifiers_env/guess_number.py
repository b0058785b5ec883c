"""A multi-turn verifiers taskset (verifiers 0.4, `import verifiers.v1 as vf`) that lorarl trains on
as `id = "verifiers:examples.verifiers_env.guess_number"`: guess a secret number, told "higher" or
"lower" after each guess. The protocol is the `vf.Env` exported beside the taskset: its `run` opens
the player's interaction, reads each guess from `turn(...)` and answers it, until the number is
found or the player runs out of turns (its seat's `max_turns`). The task's rewards score the last
guess; `run` also records how many hints it gave. Plain verifiers code, as `vf-eval` would load it.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

__all__ = ["GuessEnv", "GuessNumber"]


def last_number(text: str) -> int | None:
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


class GuessData(vf.TaskData):
    secret: int
    low: int
    high: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def solved(self, task: GuessData, trace: vf.Trace) -> float:
        """1 if the last guess is the secret."""
        return float(last_number(trace.last_reply) == task.secret)

    @vf.reward(weight=0.5)
    async def closeness(self, task: GuessData, trace: vf.Trace) -> float:
        """Partial credit: how near the last guess is, 0 for no number."""
        guess = last_number(trace.last_reply)
        if guess is None:
            return 0.0
        return max(0.0, 1.0 - abs(guess - task.secret) / (task.high - task.low))

    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class GuessNumberConfig(vf.TasksetConfig):
    num_tasks: int = 50
    low: int = 1
    high: int = 20


class GuessNumber(vf.Taskset[GuessTask, GuessNumberConfig]):
    def load(self):
        rng = random.Random(0)
        low, high = self.config.low, self.config.high
        for _ in range(self.config.num_tasks):
            data = GuessData(
                prompt=f"I am thinking of a whole number from {low} to {high}. Reply with your guess, a number.",
                secret=rng.randint(low, high),
                low=low,
                high=high,
            )
            yield GuessTask(data, self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(max_turns=4)


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task: GuessTask, agents: vf.Agents) -> None:
        hints = 0
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()  # the prompt opens: the first guess
            while not segment.terminated:
                guess = last_number(segment.last_reply)
                if guess == task.data.secret:
                    break
                hints += 1
                hint = "Reply with a number." if guess is None else "Higher." if guess < task.data.secret else "Lower."
                segment = await interaction.turn(hint)
        interaction.trace.record_metric("hints", float(hints))  # after scoring, still on the trace
