"""A verifiers taskset (verifiers 0.4, `import verifiers.v1 as vf`) that lorarl trains on as
`id = "verifiers:examples.verifiers_env.reverse_words"`: reverse a word, scored by two weighted
rewards and one logged metric. It is plain verifiers code, the same module `vf-eval` would load;
copy it to start your own taskset.

verifiers finds a taskset by importing the module its id names and taking the `Taskset` subclass
in `__all__`, so this file needs no installing when `rl` runs from the repository root.
"""

from __future__ import annotations

import difflib

import verifiers.v1 as vf

__all__ = ["ReverseWords"]

WORDS = "apple river stone cloud tiger lemon piano garden rocket silver window candle forest pencil".split()


class ReverseData(vf.TaskData):
    answer: str
    """The word reversed."""


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def exact(self, task: ReverseData, trace: vf.Trace) -> float:
        """1 if the reply is exactly the reversed word."""
        return float(trace.last_reply == task.answer)

    @vf.reward(weight=0.5)
    async def similarity(self, task: ReverseData, trace: vf.Trace) -> float:
        """Partial credit: how much of the reversed word the reply gets in order."""
        return difflib.SequenceMatcher(None, trace.last_reply, task.answer).ratio()

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        """Logged, not rewarded."""
        return float(len(trace.last_reply))


class ReverseWordsConfig(vf.TasksetConfig):
    num_words: int = len(WORDS)
    """How many of the words to ask about."""
    system_prompt_text: str = "Reply with the word reversed, nothing else."
    """Each task's system prompt."""


class ReverseWords(vf.Taskset[ReverseTask, ReverseWordsConfig]):
    def load(self):
        for word in WORDS[: self.config.num_words]:
            data = ReverseData(
                prompt=f"Reverse the word: {word}",
                system_prompt=self.config.system_prompt_text,
                answer=word[::-1],
            )
            yield ReverseTask(data, self.config.task)
